"""An ablation run: the branch point of an anneal, the runs still to train (one pipeline), the scores
and the comparison with the baseline (``ablate-<name>``, :mod:`.report`)."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

import yaml

from smolforge.errors import RecipeError, RunError
from smolforge.runs import Runs

from .ablation import Ablation, PlannedRun

__all__ = ["branch_point", "pipeline_file", "run_ablation", "analyze"]


def branch_point(ablation: Ablation, runs: Runs) -> str | None:
    """Make sure the run every anneal continues exists: with ``from_step``, export the main run's
    DeepSpeed checkpoint at that step as the run ``<from>-step<N>`` (once; again when the main run
    was made again since). Returns its name (None for a from-scratch ablation)."""
    if not ablation.from_step:
        return ablation.init_run
    from smolforge.evals.audit import export_checkpoint, find_checkpoints

    main, name = runs.get(ablation.start_from), ablation.init_run
    if runs.exists(name):
        existing = runs.get(name, require_done=False)
        if existing.status == "done" and not _newer_parents(existing, runs):
            return name
    points = {p.step: p for p in find_checkpoints(main) if p.kind == "deepspeed"}
    if ablation.from_step not in points:
        raise RunError(f"run '{main.name}' has no DeepSpeed checkpoint at step {ablation.from_step} "
                       f"(it keeps: {', '.join(map(str, sorted(points))) or 'none'}); set from_step to one of them, "
                       "or train the main run with checkpoint.keep high enough")
    with runs.start(main.stage, name, main.info.get("recipe") or {}, parents=[main],
                    data_fingerprints=main.info.get("data_fingerprints"), overwrite=True) as run:
        export_checkpoint(points[ablation.from_step].path, main.model_dir, run.model_dir)
        run.finish(metrics={"train/steps": ablation.from_step})
    return name


def _check_runs(ablation: Ablation, runs: Runs, overwrite: bool) -> tuple[list[PlannedRun], list[str]]:
    """Build and validate every planned recipe before anything trains; return the runs still to train
    and the names of those reused (done, with the same recipe)."""
    from smolforge.recipe import build_stage_recipe, to_dict
    from smolforge.registry import load_stage

    module = load_stage(ablation.stage)
    todo, reused = [], []
    for planned in ablation.plan():
        where = f"{ablation.source} ({planned.name})"
        recipe = build_stage_recipe(module, planned.recipe, source=where)
        if ablation.stage == "pretrain":
            _check_checkpoints(recipe, where)
        if runs.exists(planned.name):
            run = runs.get(planned.name, require_done=False)
            same = json.loads(json.dumps(to_dict(recipe), default=str)) == run.info.get("recipe")
            newer = _newer_parents(run, runs)
            if run.status == "done" and same and not newer:
                reused.append(planned.name)
                continue
            if run.status == "done" and not overwrite:
                why = (f"was trained before its parent {', '.join(newer)} was made again" if same and newer
                       else f"is done with another recipe than {ablation.source} plans")
                raise RunError(f"run '{planned.name}' {why}; pass --overwrite to train it again, "
                               "or rename the ablation")
        module.validate(recipe, runs)
        todo.append(planned)
    return todo, reused


def _newer_parents(run: Any, runs: Runs) -> list[str]:
    """The parents of ``run`` (its data run, an annealed main run) that finished after it started:
    made again since, so ``run`` no longer follows from them."""
    newer = []
    for name in run.parents:
        try:
            parent = runs.get(name, require_done=False)
        except RunError:
            continue
        if str(parent.info.get("ended_at") or "") > str(run.info.get("started_at") or ""):
            newer.append(parent.name)
    return newer


def _check_checkpoints(recipe: Any, where: str) -> None:
    """The audit scores the baseline's checkpoints: a pretraining recipe must keep a series of them."""
    every, keep, steps = recipe.checkpoint.every_steps, recipe.checkpoint.keep, recipe.train.max_steps
    if every <= 0:
        raise RecipeError(f"{where}: the ablation audits each run's checkpoints; set checkpoint.every_steps "
                          f"(e.g. {max(steps // 5, 1)}) in the ablation's set:")
    if keep < min(3, steps // every):
        raise RecipeError(f"{where}: checkpoint.keep {keep} keeps too few checkpoints for the audit "
                          f"({steps // every} are written); set checkpoint.keep >= {steps // every}")


def pipeline_file(ablation: Ablation, planned: list[PlannedRun]) -> dict:
    """The pipeline that trains ``planned`` (the content of the file ``--write-pipeline`` writes)."""
    steps = [{"stage": ablation.stage, **p.recipe} for p in planned]
    data: dict[str, Any] = {"pipeline": steps, "share_process": True}
    if ablation.launch:
        data["launch"] = ablation.launch
    return data


def run_ablation(ablation: Ablation, runs: Runs, *, overwrite: bool = False, debug: bool = False,
                 out: TextIO | None = None) -> dict[str, Any]:
    """Train what is missing (one pipeline), then :func:`analyze`; returns the analysis."""
    from smolforge.pipeline import load_pipeline, run_pipeline

    out = out or sys.stdout
    branch_point(ablation, runs)
    todo, reused = _check_runs(ablation, runs, overwrite)
    total = len(todo) + len(reused)
    print(f"ablation {ablation.name}: {total} runs ({len(ablation.variants)} arms x {len(ablation.seeds)} seeds), "
          f"{len(reused)} already done, {len(todo)} to train", file=out)
    if todo:
        with tempfile.TemporaryDirectory(prefix="smolforge-ablate-") as folder:
            path = Path(folder) / f"{ablation.name}.pipeline.yaml"
            path.write_text(yaml.safe_dump(pipeline_file(ablation, todo), sort_keys=False), encoding="utf-8")
            run_pipeline(load_pipeline(path), runs.root, overwrite=overwrite, debug=debug, out=out)
    return analyze(ablation, runs, out=out)


def analyze(ablation: Ablation, runs: Runs, *, device: str = "auto", batch_size: int = 32,
            out: TextIO | None = None) -> dict[str, Any]:
    """Audit the baseline's seeds, score every run's final model, compare, and write ``ablate-<name>``."""
    from smolforge.evals.audit import audit
    from smolforge.evals.suite import load_suite

    from .report import write_result
    from .stats import compare

    out = out or sys.stdout
    missing = [p.name for p in ablation.plan() if not _done(runs, p.name)]
    if missing:
        raise RunError(f"ablation {ablation.name}: run(s) {', '.join(missing)} are not done; "
                       f"run: smolforge ablate --config {ablation.source}")
    suite = load_suite(ablation.suite)
    options = dict(suite=ablation.suite, tasks=ablation.tasks, limit=ablation.limit, device=device,
                   batch_size=batch_size)
    fitness = audit(runs, ablation.names(ablation.variants[0]), **options)
    finals = {}
    for variant in ablation.variants:
        scored = fitness if variant is ablation.variants[0] else audit(runs, ablation.names(variant), final_only=True,
                                                                         **options)
        finals[variant.slug] = {name: scored["scores"][name][str(max(scored["steps"][name]))]
                                for name in ablation.names(variant)}
    tasks = list(fitness["tasks"])
    rows = []
    base = ablation.variants[0]
    for variant in ablation.variants[1:]:
        for task in tasks:
            lower = suite.tasks[task].primary.startswith("ppl")
            row = compare([finals[base.slug][n][task] for n in ablation.names(base)],
                          [finals[variant.slug][n][task] for n in ablation.names(variant)],
                          higher_is_better=not lower)
            stats = fitness["tasks"][task]
            rows.append({"variant": variant.label, "task": task, "metric": stats.get("metric"),
                         "audit": stats["verdict"], "audit_reasons": stats["reasons"] + stats.get("unchecked", []),
                         "higher_is_better": not lower, **row})
    result = {"ablation": ablation.name, "stage": ablation.stage, "mode": ablation.mode, "from": ablation.start_from,
              "from_step": ablation.from_step,
              "source": str(ablation.source), "seeds": ablation.seeds, "suite": ablation.suite,
              "limit": ablation.limit, "tasks": tasks,
              "variants": [{"label": v.label, "key": v.key, "value": v.value, "runs": ablation.names(v)}
                           for v in ablation.variants],
              "scores": {v.label: {n: finals[v.slug][n] for n in ablation.names(v)} for v in ablation.variants},
              "audit": {t: {k: fitness["tasks"][t].get(k) for k in ("metric", "verdict", "reasons", "unchecked", "monotonicity",
                                                                     "noise", "snr", "margin", "ranking_consistency",
                                                                     "random")} for t in tasks},
              "audit_steps": fitness["common_steps"], "rows": rows}
    return write_result(result, ablation, runs, out)


def _done(runs: Runs, name: str) -> bool:
    return runs.exists(name) and runs.get(name, require_done=False).status == "done"
