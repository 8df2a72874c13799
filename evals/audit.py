"""Which eval tasks can judge an ablation? Statistics over a series of checkpoints and seeds.

    smolforge eval audit pretrain-s0 pretrain-s1 pretrain-s2 --suite embedded --limit 50

The playbook chooses eval tasks for ablations by four properties: monotonic (improves with
training), low noise (stable across seeds), above random (beats chance) and ranking-consistent
(orders models the same way across checkpoints). Given several runs of one recipe that differ
only in their seed, :func:`audit` scores every checkpoint of every run on a suite's tasks and
measures the four properties per task (as HF's FineTasks study did), then marks the tasks fit
for ablations.

**Checkpoints.** A run's points are its ``checkpoints/step-N/`` (pretraining: DeepSpeed engine
state, turned into a temporary HF model folder by :func:`export_checkpoint` with the
architecture and tokenizer of the run's ``model/``; ZeRO-0/1/2 states hold the full weights,
ZeRO-3 shards are consolidated with DeepSpeed's ``zero_to_fp32``), its ``checkpoints/checkpoint-N/``
(HF Trainer folders, loadable as they are) and its final ``model/`` at step ``train/steps`` of
run.json (it replaces a checkpoint of the same step). A checkpoint that fails its checksum
manifest is skipped with a note. Pretraining keeps only ``checkpoint.keep`` checkpoints (3 by
default), so set ``keep`` high enough for the series you want to audit. Scores are cached in
``<run>/eval/audit/<step>.json`` per suite and ``limit``; a cached step stays in the audit after
its checkpoint was pruned, and a second audit re-scores nothing.

**Statistics** for one task, on its primary metric. ``s[r][t]`` is run ``r``'s score at step ``t``;
``R`` the runs (seeds); ``C`` the steps every run has (common steps), ``t_0 < … < t_m``;
``mean_t = (1/|R|) Σ_r s[r][t]``.

- *monotonicity* ``= (1/|R'|) Σ_{r∈R'} ρ_r`` where ``ρ_r`` is Spearman's rank correlation of
  ``(t, s[r][t])`` over all steps of run ``r`` (Pearson correlation of average ranks, so ties
  share a rank), and ``R'`` the runs with at least 3 steps (n/a when there is none). A run whose
  score never changes has ``ρ_r = 0`` (no trend).
- *noise* ``= (1/|C|) Σ_{t∈C} std_r(s[r][t])``, the sample standard deviation across seeds
  (``ddof = 1``); n/a with fewer than 2 runs.
- *margin* above random ``= mean_{t_m} − random``: the final mean score minus the task's
  random baseline (``SuiteTask.random_baseline``).
- *signal-to-noise* ``= (mean_{t_m} − mean_{t_0}) / noise``: the improvement over the audited
  span in units of seed noise (``inf`` when noise is 0 and the score rose, 0 when it did not;
  n/a without noise or with a single common step).
- *ranking consistency* ``= (1/|P|) Σ_{(t_i, t_{i+1})∈P} τ_b(s[·][t_i], s[·][t_{i+1}])``: Kendall's
  τ_b between the orderings of the runs at each pair of consecutive common steps, averaged over
  the pairs ``P`` where τ_b is defined (a step at which every run scores the same has no
  ordering). 1: the runs keep their order from checkpoint to checkpoint; 0: it is reshuffled.
  It needs 2 runs and 2 common steps. For seeds of one recipe it says whether the differences
  between seeds persist; for ablation arms (different recipes) it is the playbook's property.

**Verdict** (:class:`Thresholds`; the playbook gives no numbers, these defaults are the ones
the audit was specified with): a task is *fit* for ablations when monotonicity ≥ 0.5, margin >
2 × noise and signal-to-noise ≥ 1 (and, only when ``min_ranking_consistency`` is set, ranking
consistency ≥ it; off by default because seeds of one recipe have no true order). A failed
criterion makes the task *unfit* and is named in ``reasons``; a criterion that could not be
checked (n/a) makes it *undecided* unless another failed. Without noise (one run) the margin
must still be > 0.

    >>> table = {"s0": {100: 0.30, 200: 0.45, 300: 0.60}, "s1": {100: 0.32, 200: 0.44, 300: 0.62}}
    >>> stats = task_statistics(table, random_baseline=0.25)
    >>> stats["verdict"], stats["monotonicity"], round(stats["noise"], 4)
    ('fit', 1.0, 0.0118)
"""
from __future__ import annotations

import contextlib
import difflib
import io
import json
import logging
import math
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from smolforge.errors import RecipeError, RunError
from smolforge.runs import Run, Runs, write_json_atomic
from smolforge.table import render_table

log = logging.getLogger(__name__)

__all__ = ["Thresholds", "Checkpoint", "spearman", "kendall_tau", "task_statistics", "summarize",
           "find_checkpoints", "export_checkpoint", "audit", "format_audit", "audit_json", "write_audit"]

AUDIT_DIR = "audit"              # under <run>/eval/
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth", "model.safetensors.index.json",
                "pytorch_model.bin.index.json")


@dataclass
class Thresholds:
    """When a task is fit for ablations (see the module docstring for the statistics).

    >>> Thresholds().min_monotonicity, Thresholds(min_snr=2.0).min_snr
    (0.5, 2.0)
    """
    min_monotonicity: float = 0.5           # mean Spearman ρ of score vs step
    margin_noise_factor: float = 2.0        # final mean − random must exceed this × noise
    min_snr: float = 1.0                    # (final − first mean) / noise
    min_ranking_consistency: float | None = None  # mean Kendall τ_b across consecutive steps; None = report only


# -- rank statistics ---------------------------------------------------------------------------
def _average_ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's ρ: Pearson correlation of average ranks (ties share a rank).

    None with fewer than 3 points; 0.0 when either side is constant (no trend).

    >>> spearman([1, 2, 3, 4], [0.1, 0.2, 0.2, 0.5])
    0.9487
    >>> spearman([1, 2, 3], [0.5, 0.5, 0.5]), spearman([1, 2], [0.1, 0.2])
    (0.0, None)
    """
    if len(x) != len(y):
        raise ValueError(f"spearman: {len(x)} x values but {len(y)} y values")
    if len(x) < 3:
        return None
    rx, ry = _average_ranks(list(x)), _average_ranks(list(y))
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return 0.0
    return round(sxy / math.sqrt(sxx * syy), 4)


def kendall_tau(x: list[float], y: list[float]) -> float | None:
    """Kendall's τ_b between two orderings of the same items (ties corrected).

    None when it is undefined: fewer than 2 items, or every item tied on one side.

    >>> kendall_tau([0.1, 0.2, 0.3], [0.2, 0.4, 0.9]), kendall_tau([0.1, 0.2, 0.3], [0.3, 0.2, 0.1])
    (1.0, -1.0)
    >>> kendall_tau([0.5, 0.5], [0.1, 0.2]) is None
    True
    """
    if len(x) != len(y):
        raise ValueError(f"kendall_tau: {len(x)} x values but {len(y)} y values")
    concordant = discordant = tied_x = tied_y = 0
    n = len(x)
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                tied_x += 1
                tied_y += 1
            elif dx == 0:
                tied_x += 1
            elif dy == 0:
                tied_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    pairs = n * (n - 1) // 2
    denominator = math.sqrt((pairs - tied_x) * (pairs - tied_y))
    if denominator == 0:
        return None
    return round((concordant - discordant) / denominator, 4)


def _std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


# -- one task ----------------------------------------------------------------------------------
def task_statistics(scores: dict[str, dict[int, float]], random_baseline: float,
                    thresholds: Thresholds | None = None) -> dict[str, Any]:
    """The audit's statistics and verdict for one task from ``{run: {step: score}}``.

    Returns ``first``, ``final`` (mean scores at the first and last common step), ``margin``,
    ``noise``, ``snr``, ``monotonicity`` (and ``monotonicity_per_run``), ``ranking_consistency``
    (None where n/a), ``common_steps``, ``verdict`` (``fit`` / ``unfit`` / ``undecided``),
    ``fit`` (True / False / None), ``reasons`` (failed criteria) and ``unchecked`` (n/a ones).

    >>> flat = {"s0": {1: 0.40, 2: 0.30, 3: 0.35}, "s1": {1: 0.30, 2: 0.42, 3: 0.33}}
    >>> stats = task_statistics(flat, random_baseline=0.25)
    >>> stats["verdict"], stats["monotonicity_per_run"]
    ('unfit', {'s0': -0.5, 's1': 0.5})
    >>> for reason in stats["reasons"]: print(reason)
    monotonicity 0.000 < 0.5
    margin 0.090 <= 2 x noise 0.057 (not clearly above random)
    signal-to-noise -0.177 < 1
    """
    th = thresholds or Thresholds()
    if not scores or not all(scores.values()):
        raise ValueError("task_statistics needs at least one run with at least one scored step")
    run_names = list(scores)
    common = sorted(set.intersection(*(set(s) for s in scores.values())))
    per_run = {r: spearman(sorted(s), [s[t] for t in sorted(s)]) for r, s in scores.items()}
    rhos = [rho for rho in per_run.values() if rho is not None]
    monotonicity = round(_mean(rhos), 4) if rhos else None
    means = [_mean([scores[r][t] for r in run_names]) for t in common]
    first = means[0] if means else None
    final = means[-1] if means else None
    margin = None if final is None else final - random_baseline
    noise = (_mean([_std([scores[r][t] for r in run_names]) for t in common])
             if len(run_names) >= 2 and common else None)
    snr = None
    if noise is not None and len(common) >= 2:
        rise = final - first
        snr = rise / noise if noise > 0 else (math.inf if rise > 0 else 0.0)
    taus = [kendall_tau([scores[r][a] for r in run_names], [scores[r][b] for r in run_names])
            for a, b in zip(common, common[1:])] if len(run_names) >= 2 else []
    defined = [tau for tau in taus if tau is not None]
    ranking = round(_mean(defined), 4) if defined else None

    reasons: list[str] = []
    unchecked: list[str] = []
    if monotonicity is None:
        unchecked.append("monotonicity n/a (fewer than 3 checkpoints per run)")
    elif monotonicity < th.min_monotonicity:
        reasons.append(f"monotonicity {monotonicity:.3f} < {th.min_monotonicity:g}")
    if margin is None:
        unchecked.append("margin n/a (the runs share no step)")
    elif noise is None:
        if margin <= 0:
            reasons.append(f"margin {margin:.3f} <= 0 (not above random)")
        unchecked.append("noise n/a (fewer than 2 runs): margin checked against 0 only")
    elif margin <= th.margin_noise_factor * noise:
        reasons.append(f"margin {margin:.3f} <= {th.margin_noise_factor:g} x noise {noise:.3f} "
                       f"(not clearly above random)")
    if snr is None:
        if noise is not None:
            unchecked.append("signal-to-noise n/a (the runs share fewer than 2 steps)")
        else:
            unchecked.append("signal-to-noise n/a (no noise estimate)")
    elif snr < th.min_snr:
        reasons.append(f"signal-to-noise {snr:.3f} < {th.min_snr:g}")
    if th.min_ranking_consistency is not None:
        if ranking is None:
            unchecked.append("ranking consistency n/a (needs 2 runs, 2 common steps, a defined order)")
        elif ranking < th.min_ranking_consistency:
            reasons.append(f"ranking consistency {ranking:.3f} < {th.min_ranking_consistency:g}")
    verdict = "unfit" if reasons else ("undecided" if unchecked else "fit")
    return {"first": _round(first), "final": _round(final), "random": random_baseline,
            "margin": _round(margin), "noise": _round(noise),
            "snr": snr if snr is None or math.isinf(snr) else round(snr, 6),
            "monotonicity": monotonicity, "monotonicity_per_run": per_run,
            "ranking_consistency": ranking, "common_steps": common, "verdict": verdict,
            "fit": {"fit": True, "unfit": False}.get(verdict), "reasons": reasons, "unchecked": unchecked}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


# -- all tasks ---------------------------------------------------------------------------------
def summarize(scores: dict[str, dict[int, dict[str, float]]], random_baselines: dict[str, float],
              thresholds: Thresholds | None = None, *, suite: str = "", limit: int | None = None,
              metrics: dict[str, str] | None = None) -> dict[str, Any]:
    """The audit result from scores already at hand: ``{run: {step: {task: score}}}``.

    :func:`audit` calls this after scoring; :func:`format_audit` prints what it returns.

    >>> scores = {"s0": {1: {"a": 0.3}, 2: {"a": 0.5}, 3: {"a": 0.7}}}
    >>> result = summarize(scores, {"a": 0.25}, suite="demo")
    >>> result["tasks"]["a"]["verdict"], result["fit"], result["notes"][0][:40]
    ('undecided', [], '1 run: noise, signal-to-noise and rankin')
    """
    th = thresholds or Thresholds()
    run_names = list(scores)
    tasks = sorted(random_baselines)
    notes: list[str] = []
    if len(run_names) < 2:
        notes.append(f"{len(run_names)} run: noise, signal-to-noise and ranking consistency are n/a; "
                     "audit at least 2 runs of the recipe with different seeds")
    for run, steps in scores.items():
        if len(steps) < 3:
            notes.append(f"run {run} has {len(steps)} scored step(s): its monotonicity is n/a "
                         "(needs 3; checkpoint more often or keep more checkpoints)")
    common = sorted(set.intersection(*(set(s) for s in scores.values()))) if scores else []
    if len(run_names) >= 2 and len(common) < max(len(s) for s in scores.values()):
        notes.append(f"the runs share {len(common)} step(s) ({', '.join(map(str, common)) or 'none'}): "
                     "noise, margin, signal-to-noise and ranking use those only")
    per_task = {}
    for task in tasks:
        table = {run: {step: values[task] for step, values in steps.items() if task in values}
                 for run, steps in scores.items()}
        per_task[task] = {"metric": (metrics or {}).get(task),
                          **task_statistics(table, random_baselines[task], th)}
    return {"suite": suite, "limit": limit, "runs": run_names, "thresholds": asdict(th),
            "steps": {run: sorted(steps) for run, steps in scores.items()}, "common_steps": common,
            "scores": {run: {str(step): dict(steps[step]) for step in sorted(steps)}
                       for run, steps in scores.items()},
            "tasks": per_task, "fit": [t for t in tasks if per_task[t]["verdict"] == "fit"],
            "notes": notes}


# -- checkpoints -------------------------------------------------------------------------------
@dataclass
class Checkpoint:
    """One scorable point of a run: its training step, where it is, and its format.

    ``kind``: ``model`` (the run's final ``model/``), ``hf`` (a folder ``from_pretrained`` loads)
    or ``deepspeed`` (engine state that :func:`export_checkpoint` turns into an HF folder).

    >>> Checkpoint(step=100, path=Path("runs/x/checkpoints/step-100"), kind="deepspeed").label
    'checkpoints/step-100'
    """
    step: int
    path: Path
    kind: str

    @property
    def label(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}" if self.kind != "model" else "model"


def _step_in_name(name: str) -> int | None:
    for prefix in ("step-", "checkpoint-"):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return int(name[len(prefix):])
    return None


def _is_deepspeed(folder: Path) -> bool:
    return any(folder.glob("*/*model_states.pt"))


def find_checkpoints(run: Run) -> list[Checkpoint]:
    """The run's checkpoints (HF and DeepSpeed) and its final ``model/``, by step.

    The final model's step is ``train/steps`` from run.json; it replaces a checkpoint of the
    same step (the same weights). Folders that are neither format are left out.

    >>> import tempfile
    >>> with Runs(tempfile.mkdtemp()).start("sft", "sft-x", recipe={}) as run:
    ...     for name in ("checkpoint-5", "checkpoint-10"):
    ...         (run.checkpoints_dir / name).mkdir(parents=True)
    ...         _ = (run.checkpoints_dir / name / "config.json").write_text("{}")
    ...     run.model_dir.mkdir(); _ = (run.model_dir / "config.json").write_text("{}")
    ...     run.finish(metrics={"train/steps": 10})
    >>> [(c.step, c.kind, c.label) for c in find_checkpoints(run)]
    [(5, 'hf', 'checkpoints/checkpoint-5'), (10, 'model', 'model')]
    """
    found: dict[int, Checkpoint] = {}
    if run.checkpoints_dir.is_dir():
        for folder in run.checkpoints_dir.iterdir():
            step = _step_in_name(folder.name)
            if step is None or not folder.is_dir():
                continue
            if (folder / "config.json").is_file():
                found[step] = Checkpoint(step, folder, "hf")
            elif _is_deepspeed(folder):
                found[step] = Checkpoint(step, folder, "deepspeed")
    final_step = run.metrics.get("train/steps")
    if (run.model_dir / "config.json").is_file() and isinstance(final_step, (int, float)):
        found[int(final_step)] = Checkpoint(int(final_step), run.model_dir, "model")
    return [found[s] for s in sorted(found)]


def _deepspeed_state_dict(folder: Path) -> dict:
    import torch

    latest = folder / "latest"
    tag = latest.read_text().strip() if latest.is_file() else "state"
    flat = folder / tag / "mp_rank_00_model_states.pt"
    if flat.is_file():
        try:
            states = torch.load(flat, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - older DeepSpeed pickles objects; this run wrote the file itself
            states = torch.load(flat, map_location="cpu", weights_only=False)
        stage = ((states.get("ds_config") or {}).get("zero_optimization") or {}).get("stage", 0)
        if stage < 3 and states.get("module"):
            return states["module"]  # ZeRO 0-2: every rank holds the full weights (training dtype)
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with contextlib.redirect_stdout(io.StringIO()):  # it prints its progress
        return get_fp32_state_dict_from_zero_checkpoint(str(folder), tag=tag)


def export_checkpoint(checkpoint: Path, model_dir: Path, out_dir: Path) -> Path:
    """Write DeepSpeed checkpoint ``checkpoint`` as an HF model folder ``out_dir``.

    The architecture, tokenizer and chat template come from ``model_dir`` (the run's final
    ``model/``, same shape); the weights from the checkpoint (ZeRO-3 consolidated to fp32).

    >>> import contextlib, io, tempfile, torch
    >>> from smolforge.pretrain.model import ModelShape, build_model
    >>> root = Path(tempfile.mkdtemp())
    >>> model = build_model(ModelShape(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
    ...                                num_kv_heads=1, max_position_embeddings=64), vocab_size=50)
    >>> with contextlib.redirect_stdout(io.StringIO()):  # DeepSpeed's import-time notice
    ...     model.save_pretrained(root / "model")
    >>> (root / "step-3" / "state").mkdir(parents=True)
    >>> trained = {k: v + 1 for k, v in model.state_dict().items()}
    >>> torch.save({"module": trained, "ds_config": {}}, root / "step-3" / "state" / "mp_rank_00_model_states.pt")
    >>> out = export_checkpoint(root / "step-3", root / "model", root / "hf-3")
    >>> from transformers import AutoModelForCausalLM
    >>> loaded = AutoModelForCausalLM.from_pretrained(out)
    >>> torch.equal(loaded.lm_head.weight, trained["lm_head.weight"])
    True
    """
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir)
    architecture = (getattr(config, "architectures", None) or ["AutoModelForCausalLM"])[0]
    cls = getattr(transformers, architecture, transformers.AutoModelForCausalLM)
    model = cls.from_config(config) if cls is transformers.AutoModelForCausalLM else cls(config)
    state = _deepspeed_state_dict(Path(checkpoint))
    with torch.no_grad():
        outcome = model.load_state_dict(state, strict=False)
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded = set(state)
    untied = [k for k in outcome.missing_keys
              if not any(params.get(k) is params.get(j) for j in loaded if j in params)]
    if untied or outcome.unexpected_keys:
        raise RunError(f"{checkpoint}: its weights do not fit the architecture of {model_dir} "
                       f"(missing {untied[:5]}, unexpected {outcome.unexpected_keys[:5]})")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {p.name for pattern in WEIGHT_FILES for p in Path(model_dir).glob(pattern)}
    for item in Path(model_dir).iterdir():
        if item.is_file() and item.name not in weights:
            shutil.copy2(item, out_dir / item.name)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


# -- scoring with a cache ----------------------------------------------------------------------
def _cache_key(suite_name: str, limit: int | None) -> str:
    return f"{suite_name}|limit={'all' if limit is None else limit}"


def _read_cache(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log.warning("audit: ignoring unreadable cache %s (%s)", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


def _cached_steps(run: Run, key: str) -> dict[int, dict]:
    folder = run.eval_dir / AUDIT_DIR
    found = {}
    for path in folder.glob("*.json") if folder.is_dir() else []:
        if path.stem.isdigit():
            entry = _read_cache(path).get("results", {}).get(key)
            if entry:
                found[int(path.stem)] = entry
    return found


def _device(choice: str) -> str:
    if choice != "auto":
        return choice
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _score(run: Run, point: Checkpoint, suite, tasks: list[str], limit: int | None, batch_size: int,
           device: str) -> dict[str, dict]:
    from . import stage

    if point.kind != "deepspeed":
        scores, _ = stage.evaluate(point.path, suite, tasks, limit=limit, batch_size=batch_size, device=device)
        return scores
    from smolforge.pretrain.checkpoint import verify

    problem = verify(point.path)
    if problem is not None:
        raise RunError(f"{point.path}: unusable checkpoint ({problem})")
    (run.eval_dir / AUDIT_DIR).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".model-step-{point.step}-", dir=run.eval_dir / AUDIT_DIR) as tmp:
        model_dir = export_checkpoint(point.path, run.model_dir, Path(tmp))
        scores, _ = stage.evaluate(model_dir, suite, tasks, limit=limit, batch_size=batch_size, device=device)
    return scores


def _plain_scores(scores: dict[str, dict]) -> dict[str, dict]:
    return {task: {metric: float(v) for metric, v in values.items() if isinstance(v, (int, float))}
            for task, values in scores.items()}


def _selected_tasks(suite, tasks: list[str] | None) -> list[str]:
    unknown = [t for t in tasks or [] if t not in suite.tasks]
    if unknown:
        hints = [f"'{t}'" + (f" (did you mean '{m[0]}'?)" if (m := difflib.get_close_matches(t, suite.tasks, 1))
                             else "") for t in unknown]
        raise RecipeError(f"suite '{suite.name}' has no task {', '.join(hints)}; "
                          f"its tasks: {', '.join(sorted(suite.tasks))}")
    return list(dict.fromkeys(tasks)) if tasks else sorted(suite.tasks)


def audit(runs: Runs, run_names: list[str], suite: str = "embedded", tasks: list[str] | None = None,
          limit: int | None = None, *, batch_size: int = 32, device: str = "auto",
          thresholds: Thresholds | None = None, refresh: bool = False) -> dict[str, Any]:
    """Score every checkpoint of ``run_names`` on ``suite`` and return :func:`summarize`'s result.

    Each (run, step) is scored once per suite and ``limit`` and cached in
    ``<run>/eval/audit/<step>.json`` (``refresh`` re-scores). The result adds ``sources``
    (which folder each step was scored from), ``evaluated`` and ``cached`` (counts of (run, step)
    points) and ``seconds``. Raises RunError for an unknown run (with close matches), a run
    given twice, or a run with no checkpoint to score; RecipeError for an unknown task.

    >>> import tempfile
    >>> audit(Runs(tempfile.mkdtemp()), ["pretrain-s0"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    smolforge.errors.RunError: run 'pretrain-s0' not found under ... (no runs yet)
    """
    from tqdm.auto import tqdm

    from .suite import load_suite

    started = time.perf_counter()
    if not run_names:
        raise RunError("audit needs at least one run (better: 2 or more runs of one recipe with different seeds)")
    repeated = sorted({n for n in run_names if run_names.count(n) > 1})
    if repeated:
        raise RunError(f"run {', '.join(repeated)} given more than once; give each seed's run once")
    if limit is not None and limit < 1:
        raise RecipeError(f"limit must be >= 1 or None, got {limit}")
    targets = [runs.get(name) for name in run_names]
    the_suite = load_suite(suite)
    task_names = _selected_tasks(the_suite, tasks)
    key = _cache_key(the_suite.name, limit)

    plan: dict[str, dict[int, Checkpoint | None]] = {}
    cached: dict[str, dict[int, dict]] = {}
    notes: list[str] = []
    for run in targets:
        points = {p.step: p for p in find_checkpoints(run)}
        cached[run.name] = {} if refresh else _cached_steps(run, key)
        for step, point in list(points.items()):
            if point.kind == "deepspeed" and not (run.model_dir / "config.json").is_file():
                notes.append(f"run {run.name}: {point.label} skipped (a DeepSpeed checkpoint needs the run's "
                             "model/ for its architecture and tokenizer)")
                del points[step]
        steps: dict[int, Checkpoint | None] = {s: None for s in cached[run.name]}
        steps.update(points)
        final = [s for s, p in points.items() if p.kind == "model"]
        if not final and (run.model_dir / "config.json").is_file():
            notes.append(f"run {run.name}: its final model/ is left out (run.json has no train/steps to place it)")
        if not [s for s in steps if s not in final]:
            raise RunError(f"run '{run.name}' has no checkpoints to audit under {run.checkpoints_dir} "
                           f"(only {'its final model/' if steps else 'nothing'}); train it with "
                           "checkpoint.every_steps > 0 and checkpoint.keep high enough to keep the series")
        plan[run.name] = steps

    todo = [(run, step, point, missing) for run in targets for step, point in sorted(plan[run.name].items())
            if point is not None
            and (missing := [t for t in task_names if t not in cached[run.name].get(step, {}).get("scores", {})])]
    device = _device(device)
    sources: dict[str, dict[str, str]] = {r.name: {} for r in targets}
    scores: dict[str, dict[int, dict[str, float]]] = {r.name: {} for r in targets}
    evaluated = 0
    for run, step, point, missing in tqdm(todo, desc="audit", unit="checkpoint", disable=not todo):
        log.info("audit: scoring %s %s (step %d) on %s: %s", run.name, point.label, step, the_suite.name,
                 ", ".join(missing))
        try:
            fresh = _plain_scores(_score(run, point, the_suite, missing, limit, batch_size, device))
        except RunError as exc:
            notes.append(f"run {run.name}: {point.label} skipped ({exc})")
            continue
        path = run.eval_dir / AUDIT_DIR / f"{step}.json"
        data = _read_cache(path)  # other suites' and limits' results in the file stay
        entry = {"suite": the_suite.name, "suite_path": str(the_suite.path), "limit": limit,
                 "source": point.label, "scores": {**cached[run.name].get(step, {}).get("scores", {}), **fresh}}
        write_json_atomic(path, {"run": run.name, "step": step,
                                 "results": {**data.get("results", {}), key: entry}})
        cached[run.name][step] = entry
        evaluated += 1
    for run in targets:
        for step in sorted(plan[run.name]):
            entry = cached[run.name].get(step)
            if entry is None or not set(task_names) <= set(entry.get("scores", {})):
                if plan[run.name][step] is None:
                    notes.append(f"run {run.name}: step {step} left out (its checkpoint is gone and its cached "
                                 "scores lack some of the tasks)")
                continue
            for t in task_names:
                if the_suite.tasks[t].primary not in entry["scores"][t]:
                    raise RunError(f"task {t}: lm-eval reported {', '.join(entry['scores'][t]) or 'no metric'} but not "
                                   f"its primary metric '{the_suite.tasks[t].primary}' (metadata.primary in its YAML)")
            scores[run.name][step] = {t: entry["scores"][t][the_suite.tasks[t].primary] for t in task_names}
            sources[run.name][str(step)] = entry.get("source", "?")
        if not scores[run.name]:
            raise RunError(f"run '{run.name}': no checkpoint could be scored ({'; '.join(notes) or 'none found'})")

    result = summarize(scores, {t: the_suite.tasks[t].random_baseline for t in task_names}, thresholds,
                       suite=the_suite.name, limit=limit,
                       metrics={t: the_suite.tasks[t].primary for t in task_names})
    result["notes"] = notes + result["notes"]
    result.update(sources=sources, evaluated=evaluated,
                  cached=sum(len(s) for s in scores.values()) - evaluated,
                  seconds=round(time.perf_counter() - started, 1))
    return result


# -- output ------------------------------------------------------------------------------------
def _cell(value: float | str | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str) or math.isinf(value):
        return str(value) if isinstance(value, str) else "inf"
    return f"{value:.{digits}f}"


def format_audit(result: dict[str, Any]) -> str:
    """The audit as text: one row per task with its statistics and verdict, the scores per
    (run, step), and the notes.

    >>> scores = {"s0": {1: {"a": 0.30, "b": 0.5}, 2: {"a": 0.50, "b": 0.4}, 3: {"a": 0.70, "b": 0.5}},
    ...           "s1": {1: {"a": 0.32, "b": 0.4}, 2: {"a": 0.52, "b": 0.6}, 3: {"a": 0.71, "b": 0.5}}}
    >>> print(format_audit(summarize(scores, {"a": 0.25, "b": 0.5}, suite="demo",
    ...                              metrics={"a": "acc", "b": "acc"})))  # doctest: +NORMALIZE_WHITESPACE
    eval audit of 2 runs (s0, s1) on suite demo, limit all: 1 of 2 tasks fit for ablations
    task  metric  random  first  final  margin  noise  monoton.     SNR  rank cons.  verdict  why
    ----  ------  ------  -----  -----  ------  -----  --------  ------  ----------  -------  ---------------------------------------------------------------------------------------------------------------
    a     acc      0.250  0.310  0.705   0.455  0.012     1.000  33.517       1.000  fit
    b     acc      0.500  0.450  0.500   0.000  0.071     0.250   0.707      -1.000  unfit    monotonicity 0.250 < 0.5; margin 0.000 <= 2 x noise 0.071 (not clearly above random); signal-to-noise 0.707 < 1
    <BLANKLINE>
    run  step      a      b
    ---  ----  -----  -----
    s0      1  0.300  0.500
    s0      2  0.500  0.400
    s0      3  0.700  0.500
    s1      1  0.320  0.400
    s1      2  0.520  0.600
    s1      3  0.710  0.500
    """
    tasks = result["tasks"]
    limit = "all" if result.get("limit") is None else result["limit"]
    head = (f"eval audit of {len(result['runs'])} run{'s' if len(result['runs']) != 1 else ''} "
            f"({', '.join(result['runs'])}) on suite {result['suite'] or '?'}, limit {limit}: "
            f"{len(result['fit'])} of {len(tasks)} tasks fit for ablations")
    rows = []
    for name, s in tasks.items():
        why = "; ".join(s["reasons"] + (s["unchecked"] if s["verdict"] != "unfit" else []))
        rows.append([name, s.get("metric") or "-", _cell(s["random"]), _cell(s["first"]), _cell(s["final"]),
                     _cell(s["margin"]), _cell(s["noise"]), _cell(s["monotonicity"]),
                     _cell(s["snr"]),
                     _cell(s["ranking_consistency"]), s["verdict"], why])
    out = [head, render_table(["task", "metric", "random", "first", "final", "margin", "noise", "monoton.",
                               "SNR", "rank cons.", "verdict", "why"], rows)]
    score_rows = [[run, int(step), *(_cell(values.get(t)) for t in tasks)]
                  for run, steps in result["scores"].items() for step, values in steps.items()]
    if score_rows:
        out += ["", render_table(["run", "step", *tasks], score_rows)]
    if result.get("sources"):
        used = sorted({src for steps in result["sources"].values() for src in steps.values()})
        out += ["", f"scored {result.get('evaluated', 0)} checkpoint(s), {result.get('cached', 0)} from cache "
                    f"({result.get('seconds', '?')} s); sources: {', '.join(used)}"]
    out += [f"note: {n}" for n in result["notes"]]
    return "\n".join(out)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and math.isinf(obj):
        return "inf" if obj > 0 else "-inf"
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def audit_json(result: dict[str, Any]) -> str:
    """The audit result as one JSON object (for ``--json``); an infinite signal-to-noise (noise 0,
    score rose) is written as the string ``"inf"``, since JSON has no infinity.

    >>> same = {"s0": {1: {"a": 0.3}, 2: {"a": 0.6}}, "s1": {1: {"a": 0.3}, 2: {"a": 0.6}}}
    >>> json.loads(audit_json(summarize(same, {"a": 0.25})))["tasks"]["a"]["snr"]
    'inf'
    """
    return json.dumps(_finite(result), indent=2)


def write_audit(result: dict[str, Any], path: str | Path) -> Path:
    """Write the audit result as JSON (atomically, as :func:`audit_json`); returns the path.

    >>> import tempfile
    >>> p = write_audit(summarize({"s0": {1: {"a": 0.3}}}, {"a": 0.25}), Path(tempfile.mkdtemp()) / "audit.json")
    >>> json.loads(p.read_text())["tasks"]["a"]["margin"]
    0.05
    """
    path = Path(path)
    write_json_atomic(path, _finite(result))
    return path
