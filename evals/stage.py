"""Score a run's model on an evaluation suite with lm-eval, and write the scores into that run.

    smolforge eval --config recipes/demo/eval.yaml --set run=sft-demo
    smolforge eval --config recipes/demo/eval.yaml --set run=pretrain-demo --set limit=20

Runs lm-eval's ``simple_evaluate`` in-process on the HF model in ``runs/<run>/model/``: plain
tasks as raw text, chat tasks (``metadata.chat`` in the task YAML) through the tokenizer's chat
template. Writes ``runs/<run>/eval/<suite>.json`` (scores, stderr, random baselines, settings),
``eval/<suite>-samples.jsonl`` (every prompt and answer), merges ``<task>/<metric>`` scores and
``<task>/<metric>/random`` baselines (primary metric) into the run's ``run.json`` metrics, and prints a table.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

from smolforge.errors import RecipeError, RunError
from smolforge.runs import Run, Runs, atomic_writer, write_json_atomic
from smolforge.table import render_table

from .suite import Suite, load_suite

log = logging.getLogger(__name__)


@dataclass
class Recipe:
    run: str = "pretrain-demo"        # run whose model/ is scored; results land in that run
    suite: str = "embedded"           # folder under evals/suites/ or a path to a suite folder
    tasks: list = field(default_factory=list)  # subset of the suite's tasks (empty = all)
    limit: int | None = None          # documents per task (None = all), for quick checks
    batch_size: int = 32              # lm-eval batch size
    device: str = "auto"              # auto | cpu | cuda
    name: str | None = None           # label only: the results are written into `run`


def _selected(recipe: Recipe, suite: Suite) -> list[str]:
    unknown = [t for t in recipe.tasks if t not in suite.tasks]
    if unknown:
        import difflib

        hints = [f"'{t}'" + (f" (did you mean '{m[0]}'?)" if (m := difflib.get_close_matches(t, suite.tasks, 1)) else "")
                 for t in unknown]
        raise RecipeError(f"suite '{suite.name}' has no task {', '.join(hints)}; its tasks: {', '.join(sorted(suite.tasks))}")
    return list(recipe.tasks) or sorted(suite.tasks)


def validate(recipe: Recipe, runs: Runs) -> None:
    target = runs.get(recipe.run)
    if not (target.model_dir / "config.json").is_file():
        raise RunError(f"run '{target.name}' (stage {target.stage}) has no model/ to evaluate")
    _selected(recipe, load_suite(recipe.suite))
    if recipe.limit is not None and recipe.limit < 1:
        raise RecipeError(f"limit must be >= 1 or null, got {recipe.limit}")


def _device(choice: str) -> str:
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


def evaluate(model_dir, suite: Suite, task_names: list[str], limit: int | None = None,
             batch_size: int = 32, device: str = "cpu") -> tuple[dict, list[dict]]:
    """Scores ``{task: {metric: value, metric_stderr: value}}`` and per-document samples."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lm = HFLM(pretrained=str(model_dir), batch_size=batch_size, device=device, dtype="float32")
    manager = TaskManager()
    scores: dict[str, dict] = {}
    samples: list[dict] = []
    for chat in (False, True):
        configs = [suite.tasks[t].config for t in task_names if suite.tasks[t].chat == chat]
        if not configs:
            continue
        out = lm_eval.simple_evaluate(model=lm, tasks=configs, task_manager=manager, limit=limit,
                                      apply_chat_template=chat, log_samples=True, bootstrap_iters=1000,
                                      random_seed=0, numpy_random_seed=0, torch_random_seed=0)
        for task, values in out["results"].items():
            scores[task] = {k.split(",")[0]: v for k, v in values.items()
                            if "," in k and isinstance(v, (int, float))}
        for task, docs in out.get("samples", {}).items():
            for doc in docs:
                samples.append({"task": task, "doc_id": doc.get("doc_id"), "target": doc.get("target"),
                                "arguments": [list(map(str, a)) for a in doc.get("arguments", [])],
                                "resps": doc.get("filtered_resps")})
    return scores, samples


def _metrics_for_run(suite: Suite, scores: dict) -> dict:
    flat = {}
    for task, values in scores.items():
        spec = suite.tasks[task]
        for metric, value in values.items():
            if metric.endswith("_stderr"):
                if value not in ("N/A", None):
                    flat[f"{task}/{metric.removesuffix('_stderr')}/stderr"] = value
            else:
                flat[f"{task}/{metric}"] = value
        flat[f"{task}/{spec.primary}/random"] = spec.random_baseline
    return flat


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    target = runs.get(recipe.run)
    suite = load_suite(recipe.suite)
    task_names = _selected(recipe, suite)
    started = time.perf_counter()
    scores, samples = evaluate(target.model_dir, suite, task_names, recipe.limit, recipe.batch_size,
                               _device(recipe.device))
    seconds = round(time.perf_counter() - started, 1)
    target.eval_dir.mkdir(exist_ok=True)
    result = {"suite": suite.name, "suite_path": str(suite.path), "run": target.name, "seconds": seconds,
              "limit": recipe.limit, "backend": "hf", "tasks": {
                  t: {"scores": scores.get(t, {}), "primary": suite.tasks[t].primary, "chat": suite.tasks[t].chat,
                      "random_baseline": suite.tasks[t].random_baseline, "documents": suite.tasks[t].size}
                  for t in task_names}}
    write_json_atomic(target.eval_dir / f"{suite.name}.json", result)
    with atomic_writer(target.eval_dir / f"{suite.name}-samples.jsonl") as handle:
        handle.writelines(json.dumps(s, default=str) + "\n" for s in samples)
    target.update_metrics({**_metrics_for_run(suite, scores), "eval/seconds": seconds})
    rows = []
    for t in task_names:
        primary = suite.tasks[t].primary
        value = scores.get(t, {}).get(primary)
        stderr = scores.get(t, {}).get(f"{primary}_stderr")
        rows.append([t, primary, "n/a" if value is None else f"{value:.3f}",
                     f"{stderr:.3f}" if isinstance(stderr, (int, float)) else "",
                     f"{suite.tasks[t].random_baseline:.3f}", "chat" if suite.tasks[t].chat else "text"])
    print(f"\neval of {target.name} on suite {suite.name} ({seconds} s)")
    print(render_table(["task", "metric", "score", "stderr", "random", "format"], rows))
    return target
