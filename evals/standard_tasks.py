"""Standard lm-eval tasks with locally staged data, for machines that cannot reach the hub.

    smolforge eval stage arc_easy --from ~/data/arc_easy_test.jsonl
    smolforge eval sft-demo --suite arc_easy

``stage_task`` looks the task up in lm-eval's own task index, built from the task's folder alone
(:func:`own_folder_entry`; a name no task file mentions is unknown at once, with its close matches;
lm-eval's full index of ~10,000 files only for the rest), copies the data file into ``<staged>/<task>/`` ($SMOLFORGE_STAGED, default
``~/.cache/smolforge/staged``) and writes a task YAML there that ``include``\\s lm-eval's own
YAML and replaces only where the documents come from: ``dataset_path: json`` with the copy as
the task's evaluation split (the bundled YAML's ``test_split``, else its ``validation_split``).
Prompts, targets, metrics, filters and ``!function`` hooks stay lm-eval's (an included YAML's
hooks resolve next to that YAML, so hellaswag's ``utils.process_docs`` and MMLU's
``_default_template_yaml`` chain work unchanged). The folder is then a suite like any other
(``--suite <task>``); its YAML records the source file and its sha256.

The file must hold the rows in the hub dataset's own schema, as JSON Lines (one document per
line; e.g. ``datasets.load_dataset(...).to_json(path)`` on a machine online). For the datasets
in :data:`NATIVE_ROWS` every row is checked before anything is written (a missing field, or an
answer the task's target template cannot read, is a DataError naming the line).

Only the evaluation split is staged: the task's few-shot source (gsm8k's ``train``, MMLU's
``dev``) is switched off and ``num_fewshot`` is 0, so lm-eval never reads a split that is not
there and never draws examples from the evaluated documents; a task whose lm-eval default is
few-shot (gsm8k: 5) is scored 0-shot, and its YAML says so (``metadata.lm_eval_num_fewshot``).

A task whose scoring needs what cannot be had offline is refused at staging time, not at scoring
time (:func:`offline_blockers`: lm-eval's ifeval needs NLTK's ``punkt_tab`` data, which lm-eval
downloads when the task loads).

    >>> close_tasks("arc_esy", ["arc_easy", "arc_challenge", "hellaswag"])
    ['arc_easy']
    >>> check_row("cais/mmlu", {"question": "q", "subject": "s", "choices": ["a", "b", "c", "d"], "answer": 4})
    "field 'answer' is 4: expected an index into the 4 choices"
    >>> primary_metric({"metric_list": [{"metric": "exact_match"}],
    ...                 "filter_list": [{"name": "strict-match"}, {"name": "flexible-extract"}]})
    'exact_match,strict-match'
"""
from __future__ import annotations

import difflib
import functools
import hashlib
import importlib.util
import shutil
from pathlib import Path

import yaml

from smolforge.errors import DataError, RecipeError
from smolforge.registry import staged_suites_dir

FORMATS = {".jsonl": "json"}


def _gsm8k(row: dict) -> str | None:
    if "#### " not in str(row["answer"]):
        return "field 'answer' has no '#### N' final answer (lm-eval's exact_match compares that number)"
    return None


def _arc(row: dict) -> str | None:
    choices = row["choices"]
    if not isinstance(choices, dict) or not isinstance(choices.get("text"), list) \
            or not isinstance(choices.get("label"), list) or len(choices["text"]) != len(choices["label"]):
        return "field 'choices' must be {\"text\": [...], \"label\": [...]} with one label per text"
    if row["answerKey"] not in choices["label"]:
        return f"field 'answerKey' is {row['answerKey']!r}, not one of the labels {choices['label']}"
    return None


def _hellaswag(row: dict) -> str | None:
    if not isinstance(row["endings"], list) or not row["endings"]:
        return "field 'endings' must be a list of the candidate endings"
    if str(row["label"]).strip() not in {str(i) for i in range(len(row["endings"]))}:
        return f"field 'label' is {row['label']!r}: expected the index of the right ending (\"0\"..\"{len(row['endings']) - 1}\")"
    return None


def _mmlu(row: dict) -> str | None:
    if not isinstance(row["choices"], list) or len(row["choices"]) != 4:
        return "field 'choices' must be a list of 4 strings (lm-eval's prompt shows A-D)"
    if isinstance(row["answer"], bool) or row["answer"] not in range(4):
        return f"field 'answer' is {row['answer']!r}: expected an index into the 4 choices"
    return None


def _ifeval(row: dict) -> str | None:
    if len(row["instruction_id_list"]) != len(row["kwargs"]):
        return "fields 'instruction_id_list' and 'kwargs' must have one entry per instruction"
    return None


# The hub datasets whose rows are checked, by the bundled YAML's dataset_path: their columns and the
# invariants lm-eval's templates rely on (docs/evals.md shows a row of each).
NATIVE_ROWS = {
    "openai/gsm8k": (("question", "answer"), _gsm8k),
    "allenai/ai2_arc": (("id", "question", "choices", "answerKey"), _arc),
    "Rowan/hellaswag": (("activity_label", "ctx_a", "ctx_b", "endings", "label"), _hellaswag),
    "cais/mmlu": (("question", "choices", "answer"), _mmlu),
    "google/IFEval": (("key", "prompt", "instruction_id_list", "kwargs"), _ifeval),
}


def check_row(dataset: str, row: dict) -> str | None:
    """What is wrong with one row of ``dataset`` (a hub dataset path), or None."""
    if not isinstance(row, dict):
        return "expected a JSON object (one document)"
    fields, check = NATIVE_ROWS[dataset]
    missing = [f for f in fields if f not in row]
    if missing:
        return f"field '{missing[0]}' is missing ({dataset} rows have {', '.join(fields)})"
    return check(row)


def check_rows(source: Path, dataset: str | None) -> int:
    """Read every row of ``source``; DataError naming the first bad line. The number of documents."""
    from smolforge.data.jsonl import read_jsonl

    count = 0
    for number, row in read_jsonl(source):
        problem = check_row(dataset, row) if dataset in NATIVE_ROWS else None
        if problem:
            raise DataError(f"{source} line {number}: {problem}")
        count += 1
    if not count:
        raise DataError(f"{source}: holds no documents")
    return count


def offline_blockers(name: str) -> list[str]:
    """What task ``name`` needs at scoring time that this machine lacks (empty: nothing).

    lm-eval's ifeval family imports ``langdetect``, ``immutabledict`` and ``nltk`` and, when the
    task loads, downloads NLTK's ``punkt_tab`` tokenizer unless it is already in NLTK's data path;
    no PyPI or Debian package ships that data.
    """
    if "ifeval" not in name:
        return []
    missing = [f"the Python package {m}" for m in ("langdetect", "immutabledict", "nltk")
               if importlib.util.find_spec(m) is None]
    if importlib.util.find_spec("nltk") is not None:
        import nltk

        try:
            nltk.data.find("tokenizers/punkt_tab")
        except LookupError:
            missing.append("NLTK's 'punkt_tab' tokenizer data (lm-eval downloads it from the internet when the "
                           "task loads; no PyPI or Debian package ships it)")
    return missing


def close_tasks(name: str, known: list[str], n: int = 5) -> list[str]:
    """Task names close to ``name`` (for the unknown-task message)."""
    return difflib.get_close_matches(name, known, n=n, cutoff=0.6)


def primary_metric(config: dict) -> str:
    """The headline score's key: the first metric, under the first filter when the task has several
    (the eval stage names such scores ``metric,filter``: gsm8k's ``exact_match,strict-match``)."""
    metric = (config.get("metric_list") or [{"metric": "acc"}])[0]["metric"]
    filters = config.get("filter_list") or []
    return f"{metric},{filters[0]['name']}" if len(filters) > 1 else metric


@functools.lru_cache(maxsize=1)
def bundled_tasks():
    """lm-eval's index of its ~10,000 bundled task files (built once per process: ~10 s)."""
    from lm_eval.tasks import TaskManager

    return TaskManager()


def own_folder_entry(name: str):
    """lm-eval's entry for ``name`` from an index of its own folder only, or None when that cannot tell.

    The full index (:func:`bundled_tasks`) reads all ~10,000 task files; a standard task's YAML is almost
    always ``<name>.yaml``, so the folders holding a file of that name are indexed alone (lm-eval's own
    ``TaskManager``, its includes resolved), a few milliseconds each. Only an answer that one file
    alone declares is taken; anything else (no such file, a group, several declaring it) is left to
    the full index, so the entry is the one lm-eval itself would use.

    >>> str(own_folder_entry("arc_easy").yaml_path).endswith("arc/arc_easy.yaml")
    True
    """
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    root = Path(lm_eval.tasks.__file__).parent
    found = {}
    for folder in sorted({path.parent for path in root.rglob(f"{name}.yaml")}):
        entry = TaskManager(include_defaults=False, include_path=str(folder)).task_index.get(name)
        if entry is not None:
            found[str(entry.yaml_path)] = entry
    return next(iter(found.values())) if len(found) == 1 else None


@functools.lru_cache(maxsize=1)
def _task_files() -> tuple[str, tuple[str, ...]]:
    """The text of lm-eval's task folder (its YAML and Python files) and the names they plainly declare
    (file names, ``task:``/``group:``/``tag:`` values): about 1 s to read, where the index takes ~10 s."""
    import re

    import lm_eval.tasks

    root = Path(lm_eval.tasks.__file__).parent
    files = [path for path in root.rglob("*") if path.suffix in (".yaml", ".py") and path.is_file()]
    text = "\n".join(path.read_text(errors="ignore") for path in files)
    declared = re.findall(r"^\s*-?\s*(?:task|group|tag)\s*:\s*[\"']?([\w.-]+)", text, re.M)
    return text, tuple(sorted({path.stem for path in files if path.suffix == ".yaml"} | set(declared)))


def _surely_unknown(name: str) -> bool:
    """True when no file of lm-eval's task folder even mentions ``name``: then lm-eval has no task of that
    name, and a typo is answered without building the full index (names lm-eval composes at load time
    are tags and groups, which are not staged anyway)."""
    return name not in _task_files()[0]


def task_entry(name: str):
    """lm-eval's index entry for ``name``; RecipeError with close matches when there is none."""
    entry = own_folder_entry(name)
    if entry is not None and getattr(entry, "yaml_path", None) is not None \
            and not str(getattr(entry, "kind", "")).endswith("GROUP"):
        return entry
    if entry is None and _surely_unknown(name):
        close = close_tasks(name, list(_task_files()[1]))
        raise RecipeError(f"lm-eval has no task '{name}'" + (f"; did you mean {', '.join(close)}?" if close else ""))
    manager = bundled_tasks()
    if name not in manager.all_tasks:
        close = close_tasks(name, list(manager.all_tasks))
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise RecipeError(f"lm-eval has no task '{name}'{hint}")
    entry = manager.task_index[name]
    if getattr(entry, "yaml_path", None) is None or str(getattr(entry, "kind", "")).endswith("GROUP"):
        raise RecipeError(f"'{name}' is a group of lm-eval tasks; stage its tasks one by one")
    return entry


def _loadable(name: str, yaml_path: Path) -> None:
    """Resolve the bundled YAML's includes and ``!function`` hooks now, not at scoring time."""
    from lm_eval.tasks._yaml_loader import load_yaml

    try:
        load_yaml(yaml_path)
    except Exception as error:  # noqa: BLE001 - an ImportError or a hook missing: say which, once
        raise RecipeError(f"lm-eval's task '{name}' cannot be loaded on this machine ({yaml_path}): "
                          f"{type(error).__name__}: {error}") from None


def stage_task(name: str, data_file: str | Path) -> Path:
    """Stage ``data_file`` as task ``name``'s evaluation split; the suite folder it wrote."""
    entry = task_entry(name)
    blockers = offline_blockers(name)
    if blockers:
        raise RecipeError(f"lm-eval's task '{name}' cannot be scored on this machine: it needs "
                          f"{'; '.join(blockers)}. Install them (pip install 'lm-eval[ifeval]'; the data with "
                          f"`python -m nltk.downloader punkt_tab` on a machine online, then copy nltk_data into "
                          f"$NLTK_DATA) and stage again")
    source = Path(data_file).expanduser()
    if not source.is_file():
        raise DataError(f"{source}: no such file (the task's data to stage)")
    if source.suffix not in FORMATS:
        raise DataError(f"{source}: expected a .jsonl file (one document per line, the hub dataset's columns)")
    config = entry.cfg or {}   # lm-eval's YAML with its includes resolved (hooks still as paths)
    split = config.get("test_split") or config.get("validation_split")
    if not split:
        raise RecipeError(f"lm-eval task '{name}' names neither a test_split nor a validation_split")
    check_rows(source, config.get("dataset_path"))
    _loadable(name, Path(entry.yaml_path))
    folder = staged_suites_dir() / name
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{split}{source.suffix}"
    shutil.copyfile(source, target)
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    shots = config.get("num_fewshot") or 0
    sampler = (config.get("fewshot_config") or {}).get("sampler", "default")
    sampler = sampler if isinstance(sampler, str) else "default"
    staged = {"include": str(entry.yaml_path), "task": name, "dataset_path": FORMATS[source.suffix],
              "dataset_name": None, "dataset_kwargs": {"data_files": {split: target.name}},
              "training_split": None, "validation_split": split if split != config.get("test_split") else None,
              "test_split": split if split == config.get("test_split") else None,
              # no few-shot source was staged: none is read, and none is drawn from the evaluated documents
              "fewshot_split": None, "fewshot_config": {"sampler": sampler, "samples": []},
              "num_fewshot": 0,
              "metadata": {**(config.get("metadata") or {}), "chat": False, "primary": primary_metric(config),
                           **({"lm_eval_num_fewshot": shots} if shots else {}),
                           "staged_from": str(source.resolve()), "sha256": digest}}
    with open(folder / f"{name}.yaml", "w") as handle:
        handle.write(f"# staged by `smolforge eval stage {name} --from {source}`; lm-eval's task with local data\n")
        if shots:
            handle.write(f"# scored 0-shot: lm-eval's default is {shots}-shot from a split that was not staged\n")
        yaml.safe_dump(staged, handle, sort_keys=False)
    return folder
