"""Standard lm-eval tasks with locally staged data, for machines that cannot reach the hub.

    smolforge eval stage arc_easy --from ~/data/arc_easy_test.jsonl
    smolforge eval sft-demo --suite arc_easy

``stage_task`` looks the task up in lm-eval's task index (an unknown name lists close
matches), copies the data file into ``<staged>/<task>/`` ($SMOLFORGE_STAGED, default
``~/.cache/smolforge/staged``) and writes a task YAML there that ``include``\\s lm-eval's own
YAML and replaces only where the documents come from: ``dataset_path: json`` with the copy as
the task's evaluation split. Prompts, targets, metrics and filters stay lm-eval's. The folder
is then a suite like any other (``--suite <task>``); its YAML records the source file and its
sha256. The file must hold the rows in the hub dataset's own schema, as JSON Lines (one
document per line; e.g. ``datasets.load_dataset(...).to_json(path)`` on a machine online).

    >>> close_tasks("arc_esy", ["arc_easy", "arc_challenge", "hellaswag"])
    ['arc_easy']
"""
from __future__ import annotations

import difflib
import functools
import hashlib
import shutil
from pathlib import Path

import yaml

from smolforge.errors import DataError, RecipeError
from smolforge.registry import staged_suites_dir

FORMATS = {".jsonl": "json"}


def close_tasks(name: str, known: list[str], n: int = 5) -> list[str]:
    """Task names close to ``name`` (for the unknown-task message)."""
    return difflib.get_close_matches(name, known, n=n, cutoff=0.6)


@functools.lru_cache(maxsize=1)
def bundled_tasks():
    """lm-eval's index of its ~10,000 bundled task files (built once per process: ~10 s)."""
    from lm_eval.tasks import TaskManager

    return TaskManager()


def task_entry(name: str):
    """lm-eval's index entry for ``name``; RecipeError with close matches when there is none."""
    manager = bundled_tasks()
    if name not in manager.all_tasks:
        close = close_tasks(name, list(manager.all_tasks))
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise RecipeError(f"lm-eval has no task '{name}'{hint}")
    entry = manager.task_index[name]
    if getattr(entry, "yaml_path", None) is None or str(getattr(entry, "kind", "")).endswith("GROUP"):
        raise RecipeError(f"'{name}' is a group of lm-eval tasks; stage its tasks one by one")
    return entry


def stage_task(name: str, data_file: str | Path) -> Path:
    """Stage ``data_file`` as task ``name``'s evaluation split; the suite folder it wrote."""
    entry = task_entry(name)
    source = Path(data_file).expanduser()
    if not source.is_file():
        raise DataError(f"{source}: no such file (the task's data to stage)")
    if source.suffix not in FORMATS:
        raise DataError(f"{source}: expected a .jsonl file (one document per line, the hub dataset's columns)")
    config = entry.cfg or {}
    split = config.get("test_split") or config.get("validation_split")
    if not split:
        raise RecipeError(f"lm-eval task '{name}' names neither a test_split nor a validation_split")
    folder = staged_suites_dir() / name
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{split}{source.suffix}"
    shutil.copyfile(source, target)
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    primary = (config.get("metric_list") or [{"metric": "acc"}])[0]["metric"]
    staged = {"include": str(entry.yaml_path), "task": name, "dataset_path": FORMATS[source.suffix],
              "dataset_name": None, "dataset_kwargs": {"data_files": {split: target.name}},
              "training_split": None, "validation_split": split if split != config.get("test_split") else None,
              "test_split": split if split == config.get("test_split") else None,
              "metadata": {**(config.get("metadata") or {}), "chat": False, "primary": primary,
                           "staged_from": str(source.resolve()), "sha256": digest}}
    with open(folder / f"{name}.yaml", "w") as handle:
        handle.write(f"# staged by `smolforge eval stage {name} --from {source}`; lm-eval's task with local data\n")
        yaml.safe_dump(staged, handle, sort_keys=False)
    return folder
