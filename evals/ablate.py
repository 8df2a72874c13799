"""``smolforge ablate``: a baseline recipe, variants that each change one thing, several seeds each,
run through the pipeline runner, scored, and compared against the seed noise.

    smolforge ablate --config recipes/demo/ablate-lr.yaml
    smolforge ablate --config recipes/demo/ablate-anneal.yaml --set seeds=[0,1]
    smolforge ablate --config recipes/demo/ablate-lr.yaml --write-pipeline lr.pipeline.yaml  # for launch
    smolforge ablate --config recipes/demo/ablate-lr.yaml --analyze   # score runs that already exist

An ablation file::

    ablation: lr                       # the name: runs lr-baseline-s0 …, the result run ablate-lr
    recipe: pretrain.yaml              # the baseline stage recipe (relative to this file)
    set: {train.max_steps: 150}        # changes every run of the ablation (baseline and variants)
    seeds: [0, 1, 2]                   # every variant and the baseline run once per seed
    seed_key: train.seed               # where the seed goes (default: train.seed for pretrain,
                                       #   trainer.seed for the TRL stages)
    variants:                          # each changes ONE key; each value is a variant
      - {key: train.learning_rate, values: [1.0e-3]}
      - key: mixture                   # a value that is not a number or word needs a name
        values: {math-heavy: [{until: 1.0, weights: {facts: 0.4, math: 0.6}}]}
    mode: scratch                      # scratch | anneal
    from: pretrain-demo                # anneal: the main run whose model every run continues
    from_step: 300                     # anneal, optional: its DeepSpeed checkpoint at this step instead
    suite: embedded                    # the eval suite; tasks: a subset of it; limit: examples per task
    tasks: [facts, arith]
    limit: null
    launch: {processes: 2, launcher: torchrun}   # optional: how each run starts (the pipeline's launch:)

**Modes.** ``scratch`` trains every run from the recipe's initialisation. ``anneal`` continues the
model of a main run (``from:``, a pretraining run) for the recipe's fixed budget of steps with each
variant's change, typically a new data mixture with the LR decayed to zero (the playbook's
annealing runs); it sets the pretraining recipe's ``init:``. With ``from_step: N`` the runs start
from the main run's checkpoint at step N instead of its final model (the playbook branches before
the main run's decay): the checkpoint is exported once as the run ``<from>-step<N>`` (stage
pretrain, parent: the main run) and every run continues that.

**Running.** The runs are steps of one generated pipeline (:mod:`smolforge.pipeline`, with
``share_process: true``: consecutive one-rank runs share a process and pay the imports once).
A run that is already done with the very recipe planned, and trained after its parents (data
run, main run) were made, is reused, so an interrupted ablation continues where it stopped; a done
run of that name with another recipe, or older than a parent, is an error unless ``--overwrite``.
``--write-pipeline FILE`` writes the pipeline instead of running it, for ``smolforge launch
pipeline --config FILE`` on Slurm; ``--analyze`` afterwards scores what ran.

**Scoring and the audit.** The baseline's seed runs are audited first
(:func:`~smolforge.evals.audit.audit`: every checkpoint scored, each task checked for monotonicity,
low noise across seeds, a margin above random and a consistent ranking), so the recipe must keep a
series of checkpoints (pretraining: ``checkpoint.every_steps`` and ``checkpoint.keep``). The final
model of every run is scored on the same tasks (scores cached per run, as the audit caches them);
:mod:`~smolforge.evals.ablate_stats` compares each variant with the baseline per task and gives a
verdict only beyond the seed noise; tasks that failed the audit are marked in the table.

The result is the run ``ablate-<name>`` (stage ``ablate``, parents: every run): ``ablation.json``,
``table.txt`` and one plot per task, ``plots/<task>.svg`` (each seed's score, the means, ± one
standard deviation).

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "p.yaml").write_text("stage: pretrain\\nname: p\\ntrain: {learning_rate: 3.0e-3}\\n")
    >>> _ = (folder / "a.yaml").write_text("ablation: lr\\nrecipe: p.yaml\\nseeds: [0, 1]\\n"
    ...     "variants: [{key: train.learning_rate, values: [1.0e-3]}]\\n")
    >>> ablation = load_ablation(folder / "a.yaml")
    >>> [(p.variant.label, p.name) for p in ablation.plan()]  # doctest: +NORMALIZE_WHITESPACE
    [('baseline', 'lr-baseline-s0'), ('baseline', 'lr-baseline-s1'),
     ('learning_rate=0.001', 'lr-learning_rate-0.001-s0'), ('learning_rate=0.001', 'lr-learning_rate-0.001-s1')]
    >>> ablation.plan()[3].recipe["train"]
    {'learning_rate': 0.001, 'seed': 1}
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

import yaml

from smolforge.errors import RecipeError, RunError
from smolforge.recipe import apply_overrides, check_keys, load_yaml, set_path
from smolforge.registry import model_stages, stages, training_stages
from smolforge.runs import Runs

__all__ = ["Variant", "PlannedRun", "Ablation", "load_ablation", "run_ablation", "analyze", "command",
           "add_arguments", "ABLATION_KEYS", "MODES", "RESULT_STAGE"]

ABLATION_KEYS = ("ablation", "recipe", "set", "seeds", "seed_key", "variants", "mode", "from", "from_step", "suite",
                 "tasks", "limit", "launch")
MODES = ("scratch", "anneal")
RESULT_STAGE = "ablate"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One arm of the ablation: the baseline (``key`` None) or one key set to one value."""

    label: str          # "baseline", "learning_rate=0.001", "mixture=math-heavy"
    slug: str           # its part of the run names
    key: str | None = None
    value: Any = None


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One run of the ablation: which variant, which seed, its run name and full stage recipe."""

    variant: Variant
    seed: int
    name: str
    recipe: dict        # the stage recipe's keys (without ``stage``)


@dataclasses.dataclass
class Ablation:
    """A loaded ablation file (see the module docstring)."""

    name: str
    source: Path
    stage: str
    baseline: dict                  # the baseline stage recipe with ``set:`` applied (no ``stage`` key)
    seeds: list[int]
    seed_key: str
    variants: list[Variant]         # the baseline first
    mode: str = "scratch"
    start_from: str | None = None   # anneal: the main run
    suite: str = "embedded"
    tasks: list[str] | None = None
    limit: int | None = None
    launch: dict | None = None
    from_step: int | None = None    # anneal: start from this checkpoint of the main run

    @property
    def init_run(self) -> str | None:
        """The run every anneal continues: the main run, or its exported checkpoint's run."""
        if self.start_from and self.from_step:
            return f"{self.start_from}-step{self.from_step}"
        return self.start_from

    @property
    def result_name(self) -> str:
        return f"{RESULT_STAGE}-{self.name}"

    def plan(self) -> list[PlannedRun]:
        """Every run, variant by variant (the baseline first), seed by seed."""
        planned = []
        for variant in self.variants:
            for seed in self.seeds:
                recipe = copy.deepcopy(self.baseline)
                name = f"{self.name}-{variant.slug}-s{seed}"
                recipe["name"] = name
                if self.mode == "anneal":
                    recipe["init"] = self.init_run
                if variant.key is not None:
                    set_path(recipe, variant.key, copy.deepcopy(variant.value), f"{self.source}: variants")
                set_path(recipe, self.seed_key, seed, f"{self.source}: seed_key")
                planned.append(PlannedRun(variant, seed, name, recipe))
        return planned

    def names(self, variant: Variant) -> list[str]:
        return [p.name for p in self.plan() if p.variant == variant]


# --------------------------------------------------------------------------- loading
def load_ablation(path: str | Path, sets: list[str] | tuple[str, ...] = ()) -> Ablation:
    """Read and check an ablation file (``sets``: ``key=value`` overrides of the file's own keys).
    Raises RecipeError naming the file and key for anything it cannot run."""
    path = Path(path)
    source = str(path)
    data = apply_overrides(load_yaml(path), sets, source)
    check_keys(data, ABLATION_KEYS, source)
    name = data.get("ablation")
    if not isinstance(name, str) or not _NAME.match(name):
        raise RecipeError(f"{source}: 'ablation' must name the ablation (letters, digits, '-', '_', '.'), got {name!r}")
    if not data.get("recipe"):
        raise RecipeError(f"{source}: 'recipe' must name the baseline stage recipe (a path relative to this file)")
    recipe_path = path.parent / str(data["recipe"])
    baseline = load_yaml(recipe_path)
    stage = baseline.pop("stage", None)
    trained = [s for s in training_stages() if s in model_stages()]
    if stage not in stages() or stage not in trained:
        raise RecipeError(f"{recipe_path}: an ablation trains a model; its recipe's stage must be one of "
                          f"{', '.join(trained)}, got {stage!r}")
    changes = data.get("set") or {}
    if not isinstance(changes, dict):
        raise RecipeError(f"{source}: 'set' must be a mapping of key.path: value")
    for key, value in changes.items():
        set_path(baseline, str(key), value, f"{source}: set")
    seeds = data.get("seeds", [0, 1, 2])
    if (not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
            or len(set(seeds)) != len(seeds)):
        raise RecipeError(f"{source}: 'seeds' must be a list of distinct integers, got {seeds!r}")
    seed_key = str(data.get("seed_key") or ("train.seed" if stage == "pretrain" else "trainer.seed"))
    mode = data.get("mode", "scratch")
    if mode not in MODES:
        raise RecipeError(f"{source}: mode must be one of {', '.join(MODES)}, got {mode!r}")
    start_from = data.get("from")
    if mode == "anneal":
        if stage != "pretrain":
            raise RecipeError(f"{source}: mode anneal continues a pretraining run; the recipe's stage is {stage}")
        if not start_from:
            raise RecipeError(f"{source}: mode anneal needs 'from: <main run>' (the model every run continues)")
    elif start_from is not None or data.get("from_step") is not None:
        raise RecipeError(f"{source}: 'from' and 'from_step' are for mode anneal (this ablation's mode is {mode})")
    from_step = data.get("from_step")
    if from_step is not None and (not isinstance(from_step, int) or isinstance(from_step, bool) or from_step < 1):
        raise RecipeError(f"{source}: 'from_step' must be a checkpoint's step (a positive integer), got {from_step!r}")
    tasks = data.get("tasks")
    if tasks is not None and (not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks)):
        raise RecipeError(f"{source}: 'tasks' must be a list of task names, got {tasks!r}")
    limit = data.get("limit")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise RecipeError(f"{source}: 'limit' must be a positive integer or null, got {limit!r}")
    variants = [Variant("baseline", "baseline")] + _variants(data.get("variants"), source)
    return Ablation(name, path, stage, baseline, seeds, seed_key, variants, mode, start_from,
                    str(data.get("suite") or "embedded"), tasks, limit, data.get("launch"), from_step)


def _variants(items: Any, source: str) -> list[Variant]:
    if not isinstance(items, list) or not items:
        raise RecipeError(f"{source}: 'variants' must be a non-empty list of {{key: a.b.c, values: [...]}}")
    variants: list[Variant] = []
    for n, item in enumerate(items, start=1):
        where = f"{source}: variants[{n}]"
        if not isinstance(item, dict) or set(item) != {"key", "values"}:
            raise RecipeError(f"{where} must be {{key: a.b.c, values: [...]}} (one key per variant), got {item!r}")
        key, values = str(item["key"]), item["values"]
        if isinstance(values, dict):
            named = [(str(label), value) for label, value in values.items()]
        elif isinstance(values, list) and values:
            odd = [v for v in values if not isinstance(v, (int, float, str, bool))]
            if odd:
                raise RecipeError(f"{where}: value {odd[0]!r} of {key} needs a name: values: {{name: value}}")
            named = [(str(v), v) for v in values]
        else:
            raise RecipeError(f"{where}: 'values' must be a non-empty list or a mapping of name: value")
        leaf = key.split(".")[-1]
        for label, value in named:
            slug = re.sub(r"[^A-Za-z0-9_.]+", "-", f"{leaf}-{label}").strip("-.")
            variant = Variant(f"{leaf}={label}", slug, key, value)
            if any(v.slug == slug for v in variants):
                raise RecipeError(f"{where}: variant {variant.label} is listed twice")
            variants.append(variant)
    return variants


# --------------------------------------------------------------------------- running
def branch_point(ablation: Ablation, runs: Runs) -> str | None:
    """Make sure the run every anneal continues exists: with ``from_step``, export the main run's
    DeepSpeed checkpoint at that step as the run ``<from>-step<N>`` (once; again when the main run
    was made again since). Returns its name (None for a from-scratch ablation)."""
    if not ablation.from_step:
        return ablation.init_run
    from .audit_checkpoints import export_checkpoint, find_checkpoints

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
    from .ablate_report import write_result
    from .ablate_stats import compare
    from .audit import audit
    from .suite import load_suite

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


# --------------------------------------------------------------------------- the command
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, metavar="FILE", help="the ablation file (see the description)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="change a key of the ablation file (e.g. seeds=[0,1])")
    p.add_argument("--overwrite", action="store_true", help="train again runs that are done with another recipe")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--analyze", action="store_true", help="only score and compare runs that already exist")
    what.add_argument("--write-pipeline", metavar="FILE",
                      help="write the pipeline of the runs still to train (for smolforge launch pipeline) and stop")
    p.add_argument("--device", default="auto", help="where the evals run (auto, cpu, cuda)")


def command(args: argparse.Namespace, extras: list[str], ctx) -> int:
    """``smolforge ablate``."""
    ablation = load_ablation(args.config, args.set)
    runs = ctx.runs
    out = sys.stderr if ctx.json else sys.stdout
    if args.write_pipeline:
        branch_point(ablation, runs)
        todo, reused = _check_runs(ablation, runs, args.overwrite)
        target = Path(args.write_pipeline)
        target.write_text(yaml.safe_dump(pipeline_file(ablation, todo), sort_keys=False), encoding="utf-8")
        print(f"wrote {target}: {len(todo)} runs to train ({len(reused)} already done). Next:\n"
              f"  smolforge launch pipeline --config {target}\n"
              f"  smolforge ablate --config {args.config} --analyze   # once the job is done", file=out)
        return 0
    result = (analyze(ablation, runs, device=args.device, out=out) if args.analyze
              else run_ablation(ablation, runs, overwrite=args.overwrite, debug=ctx.debug, out=out))
    if ctx.json:
        print(json.dumps(result, indent=2, default=str))
    return 0
