"""Every shipped stage recipe, with each key given the wrong type or the wrong shape, through the CLI:
exit 2, one line that names the recipe file and the key, and no run folder.

The variants are generated from the recipes themselves (recipes/**/*.yaml with a ``stage:``): a
number becomes a word or a negative number, a word a number, a flag ``maybe``; a scalar becomes a
mapping or a list, a mapping a word or a list, a list a mapping or a word; a number declared
with an upper bound (``metadata=FRACTION``: shares, probabilities, ratios) goes above it. The runs
folder is empty, so a variant that got past its stage's checks would stop at the first parent run;
the test asserts that the key's own error comes first. Upper bounds that only a library knows (a
TRL config's ``warmup_ratio``) are not generated.
"""
from __future__ import annotations

import copy

import yaml

from conftest import REPO
from smolforge.cli import main

RECIPES = sorted(p for p in (REPO / "recipes").rglob("*.yaml") if "stage" in (yaml.safe_load(p.read_text()) or {}))
# Keys whose library validates the content of a well-shaped value and names only the section
# (DeepSpeed: "invalid 'trainer': Please specify the ZeRO optimization config").
SECTION_NAMED = {"trainer.deepspeed"}
# Keys where a negative number is a setting, not a mistake (transformers: max_steps <= 0 = train by epochs).
NEGATIVE_IS_A_SETTING = {"trainer.max_steps"}


def leaves(data: dict, prefix: str = ""):
    for key, value in data.items():
        yield f"{prefix}{key}", value
        if isinstance(value, dict):
            yield from leaves(value, f"{prefix}{key}.")


def upper_bound(stage: str, dotted: str) -> float | None:
    """The ``{"max": x}`` of the stage recipe's field behind ``dotted``, or None."""
    import dataclasses
    import typing

    from smolforge.recipe import _dataclass_of
    from smolforge.registry import load_stage

    cls = load_stage(stage).Recipe
    *parents, last = dotted.split(".")
    for part in parents:
        hints = typing.get_type_hints(cls)
        cls = _dataclass_of(hints[part])[0] if part in hints else None
        if cls is None:
            return None
    found = {f.name: f for f in dataclasses.fields(cls)}.get(last)
    return None if found is None else found.metadata.get("max")


def wrong_values(value, bound: float | None = None) -> list[tuple[str, object]]:
    if isinstance(value, bool):
        return [("type", "maybe"), ("shape", {"oops": 1})]
    if isinstance(value, (int, float)):
        return [("type", "many"), ("shape", [1, 2])] + ([("range", -7)] if value >= 0 else []) + \
            ([("above", bound + 0.5)] if bound is not None else [])
    if isinstance(value, str):
        return [("type", 12345), ("shape", {"oops": 1})]
    if isinstance(value, list):
        return [("shape", {"oops": 1}), ("shape", "oops")]
    if isinstance(value, dict):
        return [("shape", "oops"), ("shape", [1, 2])]
    return []


def variants():
    """Each (stage, key, mutation) once, from the first recipe that has the key."""
    seen = set()
    for path in RECIPES:
        data = yaml.safe_load(path.read_text())
        for key, value in leaves({k: v for k, v in data.items() if k != "stage"}):
            bound = upper_bound(data["stage"], key) if isinstance(value, (int, float)) else None
            for kind, bad in wrong_values(value, bound):
                if kind == "range" and key in NEGATIVE_IS_A_SETTING:
                    continue
                if (data["stage"], key, repr(bad)) not in seen:
                    seen.add((data["stage"], key, repr(bad)))
                    yield path, data, key, kind, bad


def with_value(data: dict, dotted: str, value) -> dict:
    out = copy.deepcopy(data)
    node = out
    *parents, last = dotted.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    return out


def test_every_key_of_every_shipped_recipe_given_a_wrong_type_or_shape_exits_2_with_one_line(tmp_path, capsys,
                                                                                              monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    runs = tmp_path / "runs"
    tried, above, failures = 0, 0, []
    for path, data, key, kind, bad in variants():
        recipe = tmp_path / path.parent.name / path.name
        recipe.parent.mkdir(exist_ok=True)
        recipe.write_text(yaml.safe_dump(with_value(data, key, bad)))
        code = main(["--runs-dir", str(runs), data["stage"], "--config", str(recipe)])
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        tried += 1
        above += kind == "above"
        named = key.rsplit(".", 1)[0] if key in SECTION_NAMED else key.rsplit(".", 1)[-1]
        if code != 2 or len(lines) != 1 or str(recipe) not in lines[0] or named not in lines[0] \
                or "Traceback" in lines[0]:
            failures.append(f"{path.relative_to(REPO)} {key} = {bad!r} ({kind}): exit {code}: {lines[-3:]}")
    print(f"\n{tried} variants of {len(RECIPES)} recipes ({above} above an upper bound)")
    assert tried > 400 and above >= 8
    assert not failures, "\n".join(failures[:20])
    assert not runs.exists() or not any(runs.iterdir())          # no run folder, not even a failed one
