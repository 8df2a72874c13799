"""Evaluation suites: folders of lm-eval task YAMLs and their JSONL data.

A suite is a folder (``evals/suites/<name>/`` or any path) holding one lm-eval task YAML per
task; ``data_files`` paths in them are relative to the folder. ``metadata.chat`` says whether the
task is scored through the model's chat template, ``metadata.primary`` names its headline metric.
Users add suites by adding folders: no code needed.

    python -m smolforge.evals.suite --write-embedded      # regenerate the embedded suite's JSONL from the world

    >>> suite = load_suite("embedded")
    >>> sorted(suite.tasks)
    ['arith', 'facts', 'instruct', 'prefs']
    >>> suite.tasks["facts"].random_baseline
    0.125
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from smolforge.errors import RecipeError

SUITES_DIR = Path(__file__).parent / "suites"


@dataclass
class SuiteTask:
    name: str
    config: dict             # lm-eval task config, data_files made absolute, !function resolved
    chat: bool               # scored through the chat template
    primary: str             # headline metric
    random_baseline: float   # expected score of random guessing on the primary metric
    size: int                # documents


@dataclass
class Suite:
    name: str
    path: Path
    tasks: dict[str, SuiteTask]


def suite_path(ref: str) -> Path:
    """A suite folder: a path, a built-in suite, a staged task or a folder in $SMOLFORGE_SUITES."""
    from smolforge.registry import suite_folders

    path = Path(ref)
    if path.is_dir():
        return path
    path = SUITES_DIR / ref
    if path.is_dir():
        return path
    registered = suite_folders()
    if ref in registered:
        return registered[ref]
    import difflib

    known = sorted(set(registered) | {p.name for p in SUITES_DIR.iterdir() if p.is_dir() and not p.name.startswith("_")})
    close = difflib.get_close_matches(ref, known, n=3)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    raise RecipeError(f"suite '{ref}' not found{hint}: neither a folder nor one of {', '.join(known)}; "
                      f"for a standard lm-eval task, stage its data first: smolforge eval stage {ref} --from FILE")


def _random_baseline(config: dict, rows: list[dict]) -> float:
    if config.get("output_type") != "multiple_choice" or not rows:
        return 0.0

    def options(row: dict) -> int:  # a list of choices, or the hub's {"text": [...], "label": [...]}
        choices = row.get("choices") or row.get("endings") or []
        return len(choices["text"]) if isinstance(choices, dict) and "text" in choices else len(choices)

    counts = [options(r) for r in rows]
    if not all(counts):
        return 0.0  # choices built by the task's own code: unknown here
    return round(sum(1 / n for n in counts) / len(rows), 5)


def load_suite(ref: str) -> Suite:
    """Read every task YAML of a suite (through lm-eval's loader, so ``!function`` works)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    path = suite_path(ref)
    tasks = {}
    for yaml_file in sorted(path.glob("*.yaml")):
        config = load_yaml(yaml_file)
        if "task" not in config:
            continue
        files = config.get("dataset_kwargs", {}).get("data_files", {})
        absolute = {split: str((path / f).resolve()) for split, f in files.items()}
        for split, f in absolute.items():
            if not Path(f).is_file():
                raise RecipeError(f"{yaml_file}: data file for split '{split}' not found: {f}")
        config["dataset_kwargs"] = {**config.get("dataset_kwargs", {}), "data_files": absolute}
        rows = [json.loads(line) for f in absolute.values() for line in open(f) if line.strip()]
        meta = config.get("metadata", {})
        metrics = [m["metric"] for m in config.get("metric_list", [])]
        tasks[config["task"]] = SuiteTask(
            name=config["task"], config=config, chat=bool(meta.get("chat", False)),
            primary=meta.get("primary", metrics[0] if metrics else "acc"),
            random_baseline=_random_baseline(config, rows), size=len(rows))
    if not tasks:
        raise RecipeError(f"suite folder {path} holds no lm-eval task YAML")
    return Suite(name=path.name, path=path, tasks=tasks)


def write_embedded(folder: Path = SUITES_DIR / "embedded", seed: int = 0, entities: int = 40) -> None:
    """Regenerate the embedded suite's JSONL for the default world (the demo's data stage)."""
    from smolforge.data.jsonl import write_jsonl
    from smolforge.data.synthetic import World

    for stem, rows in World.generate(seed=seed, n_entities=entities).eval_suite().items():
        write_jsonl(folder / f"{stem}.jsonl", rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-embedded", action="store_true", help="regenerate evals/suites/embedded/*.jsonl")
    if parser.parse_args().write_embedded:
        write_embedded()
        print(f"wrote {SUITES_DIR / 'embedded'}")
