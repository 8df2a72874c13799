"""Evaluation suites: folders of lm-eval task YAMLs and their JSONL data.

A suite is a folder (``evals/suites/<name>/`` or any path) holding one lm-eval task YAML per
task; ``data_files`` paths in them are relative to the folder. ``metadata.chat`` says whether the
task is scored through the model's chat template, ``metadata.primary`` names its headline metric.
Users add suites by adding folders: no code needed.

    python -m smolforge.evals.suite --write-embedded      # regenerate the embedded suite's JSONL from the world
    python -m smolforge.evals.suite --write-longctx       # and the long-context suite's (pass keys, ledgers)
    python -m smolforge.evals.suite --write-redteam       # and the red team's generated categories

    >>> suite = load_suite("embedded")
    >>> sorted(suite.tasks)
    ['arith', 'facts', 'instruct', 'prefs', 'reason']
    >>> suite.tasks["facts"].random_baseline
    0.125
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from smolforge.errors import RecipeError

from .long_context import TASK_TYPE, bucket_names, check_task

SUITES_DIR = Path(__file__).parent / "suites"


@dataclass
class SuiteTask:
    name: str
    config: dict             # lm-eval task config, data_files made absolute, !function resolved
    chat: bool               # scored through the chat template
    primary: str             # headline metric
    random_baseline: float | None  # expected score of random guessing on the primary metric (None: no such thing)
    size: int                # documents
    kind: str = "lm_eval"    # lm_eval, or position_perplexity (:mod:`smolforge.evals.long_context`, scored by HF)


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
        kind = config.get("type", "lm_eval")
        if "task" not in config:
            continue
        if kind not in ("lm_eval", TASK_TYPE):
            raise RecipeError(f"{yaml_file}: type must be lm_eval or {TASK_TYPE}, got {kind!r}")
        files = config.get("dataset_kwargs", {}).get("data_files", {})
        absolute = {split: str((path / f).resolve()) for split, f in files.items()}
        for split, f in absolute.items():
            if not Path(f).is_file():
                raise RecipeError(f"{yaml_file}: data file for split '{split}' not found: {f}")
        config["dataset_kwargs"] = {**config.get("dataset_kwargs", {}), "data_files": absolute}
        rows = [json.loads(line) for f in absolute.values() for line in open(f) if line.strip()]
        meta = config.get("metadata", {})
        if kind == TASK_TYPE:
            check_task(config, str(yaml_file))
            names = bucket_names(config["buckets"])
            tasks[config["task"]] = SuiteTask(name=config["task"], config=config, chat=False,
                                              primary=meta.get("primary", f"ppl@{names[-1]}"),
                                              random_baseline=None, size=len(rows), kind=kind)
            continue
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


# Pass-key haystacks: words of filler per task, ≈ 256 / 512 / 1024 tokens with the demo tokenizer.
PASSKEY_WORDS = {"passkey_256": 150, "passkey_512": 310, "passkey_1024": 630}
PASSKEY_DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)


def write_longctx(folder: Path = SUITES_DIR / "longctx", seed: int = 0, keys_per_depth: int = 2) -> None:
    """Regenerate the long-context suite's JSONL: pass keys at several lengths and depths (4-way
    multiple choice over keys), and held-out ledgers for perplexity by position."""
    import random

    from smolforge.data.jsonl import write_jsonl
    from smolforge.data.synthetic import ledger_text, passkey_haystack

    rng = random.Random(seed)
    for task, words in PASSKEY_WORDS.items():
        rows = []
        for depth in PASSKEY_DEPTHS:
            for _ in range(keys_per_depth):
                keys = rng.sample(range(100, 1000), 4)
                rows.append({"context": passkey_haystack(words, depth, keys[0]), "choices": [f" {k}" for k in keys],
                             "gold": 0, "depth": depth, "words": words})
        for row in rows:  # the gold key at a random place among the choices
            order = list(range(4))
            rng.shuffle(order)
            row["choices"] = [row["choices"][i] for i in order]
            row["gold"] = order.index(0)
        write_jsonl(folder / f"{task}.jsonl", rows)
    write_jsonl(folder / "position_ppl.jsonl", [{"text": ledger_text(700, rng)} for _ in range(12)])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-embedded", action="store_true", help="regenerate evals/suites/embedded/*.jsonl")
    parser.add_argument("--write-longctx", action="store_true", help="regenerate evals/suites/longctx/*.jsonl")
    parser.add_argument("--write-redteam", action="store_true",
                        help="regenerate evals/suites/redteam/*_world.jsonl (the generated categories)")
    args = parser.parse_args()
    if args.write_embedded:
        write_embedded()
        print(f"wrote {SUITES_DIR / 'embedded'}")
    if args.write_longctx:
        write_longctx()
        print(f"wrote {SUITES_DIR / 'longctx'}")
    if args.write_redteam:
        from .redteam.world_items import write_world_items

        print(f"wrote {write_world_items(SUITES_DIR / 'redteam')} into {SUITES_DIR / 'redteam'}")
