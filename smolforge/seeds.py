"""Seeds as a setting: a stage run once per seed, and the spread of every metric over the seeds.

    smolforge sft --config recipes/demo/sft.yaml --seeds 3          # seeds 0, 1, 2
    smolforge data prepare recipes/demo/data.yaml --seeds 0,7,9     # these three seeds

    pipeline:
      - recipe: sft.yaml
        seeds: 3                  # or [0, 7, 9]
        gates: [{metric: instruct/exact_match, against: parent, max_drop: 0.02}]

**Which seed.** Each stage declares where its recipe keeps its seed (:class:`smolforge.commands.StageSpec`'s
``seed_key``: ``trainer.seed`` for the TRL stages, ``train.seed`` for pretrain, ``ppo.seed``, ``seed`` for
merge, ``world.seed`` for data); a stage with none (eval, import, annotate, judge, synth) refuses ``--seeds``
with a message naming it. ``--seeds N`` runs seeds 0 … N-1 and ``--seeds 3,7`` the seeds listed; the
recipe's own seed is replaced by each in turn.

**The runs.** Seed ``S`` of run ``NAME`` is an ordinary run ``NAME-seedS`` (every one validated before
any folder exists). Then ``NAME`` itself is written: a run of the same stage whose ``parents`` are the
seed runs, whose ``metrics`` hold the mean over the seeds of every numeric metric (a string metric
stays when every seed agrees), and whose ``seeds.json`` holds, per metric, ``mean``, ``sd`` (sample
standard deviation, ddof 1; None for one value), ``n`` and the ``values`` seed by seed. Its other
entries (``model/``, ``data/``, ``tokenizer/``…) are links to the first seed's, so a later stage naming
``parent: NAME`` (or ``data: NAME``) starts from the first seed's model and data, and its lineage
passes through ``NAME`` to every seed. ``eval/``, ``checkpoints/`` and ``metrics.jsonl`` are not
linked: ``NAME``'s scores are the seeds' means, not one seed's answers.

**Verdicts.** Where a run has a spread, a gate judges the difference of means against its standard
error (:func:`compare_spreads`, a Welch interval with Student's t at the gate's confidence) with the
pass / fail / inconclusive logic of :mod:`smolforge.paired`; ``min``/``max`` judge the mean's own
interval (:func:`check_bound`). ``smolforge compare`` shows mean ± sd (n) and each run's difference
from the first with its standard error.

    >>> import tempfile
    >>> runs = Runs(tempfile.mkdtemp())
    >>> seed_runs = []
    >>> for seed, acc in ((0, 0.5), (1, 0.75), (2, 0.625)):
    ...     with runs.start("sft", f"sft-x-seed{seed}", recipe={"trainer": {"seed": seed}}) as r:
    ...         r.finish(metrics={"facts/acc": acc, "train/launcher": "none"})
    ...     seed_runs.append(r)
    >>> run = aggregate(runs, "sft-x", seed_runs, [0, 1, 2], "trainer.seed")
    >>> run.metrics, run.parents
    ({'facts/acc': 0.625, 'train/launcher': 'none'}, ['sft-x-seed0', 'sft-x-seed1', 'sft-x-seed2'])
    >>> stats = metric_spread(run, "facts/acc"); stats["sd"], stats["n"]
    (0.125, 3)
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from statistics import NormalDist
from typing import Any

from smolforge.errors import RecipeError, RunError
from smolforge.recipe import set_path
from smolforge.runs import Run, RunLayout, Runs, write_json_atomic
from smolforge.table import render_table

__all__ = ["parse_seeds", "seed_key", "seed_run_name", "seeded_recipe", "check_names", "spread", "summarize",
           "aggregate", "read_seeds", "metric_spread", "SpreadResult", "compare_spreads", "check_bound",
           "t_quantile", "seeds_table", "spread_cell"]

# entries of the first seed's folder that the seeds run does not link (its own, or one seed's scores)
_OWN = ("json_path", "metrics_path", "gates_path", "seeds_path", "checkpoints_dir", "eval_dir", "report_path")


# --------------------------------------------------------------------------- the setting


def parse_seeds(value: Any, where: str = "--seeds") -> list[int]:
    """The seeds ``value`` asks for: a count N (seeds 0 … N-1), or a list (``1,5`` or ``[1, 5]``).

    >>> parse_seeds(3), parse_seeds("3"), parse_seeds("1,5"), parse_seeds([4, 2])
    ([0, 1, 2], [0, 1, 2], [1, 5], [4, 2])
    >>> parse_seeds(0)
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: --seeds: give a count of at least 1 (--seeds 3: seeds 0, 1, 2) or a list of seeds (--seeds 0,7,9), got 0
    """
    shape = (f"{where}: give a count of at least 1 (--seeds 3: seeds 0, 1, 2) or a list of seeds "
             f"(--seeds 0,7,9), got {value!r}")
    if isinstance(value, str):
        text = value.strip().strip("[]")
        parts = [p.strip() for p in text.split(",")]
        if not text or not all(p.lstrip("-").isdigit() for p in parts):
            raise RecipeError(shape)
        value = int(parts[0]) if len(parts) == 1 and "," not in text else [int(p) for p in parts]
    if isinstance(value, bool):
        raise RecipeError(shape)
    if isinstance(value, int):
        if value < 1:
            raise RecipeError(shape)
        return list(range(value))
    if not isinstance(value, list) or not value or not all(isinstance(s, int) and not isinstance(s, bool)
                                                          for s in value):
        raise RecipeError(shape)
    if any(s < 0 for s in value):
        raise RecipeError(f"{where}: seeds are never negative, got {value!r}")
    if len(set(value)) != len(value):
        raise RecipeError(f"{where}: each seed once, got {value!r}")
    return list(value)


def seed_key(stage: str) -> str:
    """Where stage ``stage``'s recipe keeps its seed; a RecipeError naming the stage when it has none.

    >>> seed_key("sft"), seed_key("data")
    ('trainer.seed', 'world.seed')
    >>> seed_key("eval")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: stage 'eval' has no seed setting, so it cannot run once per seed (stages with one: cpo, data, ...)
    """
    from smolforge.registry import stage_specs

    specs = stage_specs()
    key = getattr(specs.get(stage), "seed_key", None)
    if not key:
        seeded = sorted(name for name, spec in specs.items() if spec.seed_key)
        raise RecipeError(f"stage '{stage}' has no seed setting, so it cannot run once per seed "
                          f"(stages with one: {', '.join(seeded)})")
    return key


def seed_run_name(name: str, seed: int) -> str:
    """The run of seed ``seed``: ``NAME-seedS``.

    >>> seed_run_name("sft-demo", 2)
    'sft-demo-seed2'
    """
    return f"{name}-seed{seed}"


def seeded_recipe(data: dict, key: str, seed: int, name: str, where: str = "--seeds") -> dict:
    """A copy of recipe ``data`` with ``key`` set to ``seed`` and its name ``NAME-seedS``.

    >>> seeded_recipe({"name": "x", "trainer": {"max_steps": 5}}, "trainer.seed", 1, "x")
    {'name': 'x-seed1', 'trainer': {'max_steps': 5, 'seed': 1}}
    """
    recipe = copy.deepcopy(dict(data))
    set_path(recipe, key, seed, where)
    recipe["name"] = seed_run_name(name, seed)
    return recipe


def check_key(recipe: Any, key: str, stage: str) -> None:
    """RecipeError unless the built ``recipe`` has ``key`` (a declared seed key the recipe lacks)."""
    node = recipe
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else getattr(node, part, None)
        if node is None:
            raise RecipeError(f"stage '{stage}' declares its seed at '{key}', but its recipe has no such key")


def check_names(runs: Runs, name: str, seed_names: Iterable[str], *, overwrite: bool) -> None:
    """Before any folder exists: the seeds run ``name`` and the done seed runs must not exist yet (unless
    ``overwrite``); an unfinished seed run is left to its stage (a training stage resumes it)."""
    if overwrite:
        return
    if runs.exists(name):
        raise RecipeError(f"run '{name}' already exists (it would hold the seeds' spread); pass --overwrite "
                          "or choose another name")
    for seed_name in seed_names:
        if runs.exists(seed_name) and runs.get(seed_name, require_done=False).status == "done":
            raise RecipeError(f"run '{seed_name}' already exists (status done); pass --overwrite or choose "
                              "another name")


# --------------------------------------------------------------------------- the spread


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def spread(values: Sequence[float]) -> dict:
    """``{"mean", "sd", "n", "values"}`` of ``values`` (sd: sample standard deviation, None for one value).

    >>> round(spread([0.5, 0.54, 0.52])["sd"], 6)
    0.02
    >>> spread([3.0])
    {'mean': 3.0, 'sd': None, 'n': 1, 'values': [3.0]}
    """
    values = [float(v) for v in values]
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
    return {"mean": mean, "sd": sd, "n": n, "values": values}


def summarize(metrics_list: Sequence[dict]) -> tuple[dict, dict]:
    """``(means, spreads)`` over the seed runs' metrics: every numeric metric's mean (over the runs that
    have it, None left out) and spread; any other value kept where every run has the same one.

    >>> means, stats = summarize([{"a/acc": 0.5, "tag": "x"}, {"a/acc": 0.7, "tag": "x", "b": 1}])
    >>> means, stats["b"]["n"]
    ({'a/acc': 0.6, 'tag': 'x', 'b': 1.0}, 1)
    """
    keys: dict[str, None] = {}
    for metrics in metrics_list:
        keys.update(dict.fromkeys(str(k) for k in metrics))
    means: dict[str, Any] = {}
    stats: dict[str, dict] = {}
    for key in keys:
        present = [m[key] for m in metrics_list if key in m]
        numbers = [v for v in present if v is not None]   # a figure a run could not measure (None) is left out
        if numbers and all(_number(v) for v in numbers):
            stats[key] = spread(numbers)
            means[key] = stats[key]["mean"]
        elif len(present) == len(metrics_list) and all(v == present[0] for v in present):
            means[key] = present[0]
    return means, stats


def aggregate(runs: Runs, name: str, seed_runs: Sequence[Run], seeds: Sequence[int], key: str, *,
              overwrite: bool = False) -> Run:
    """Write the seeds run ``name`` over the done ``seed_runs`` (module docstring); returns it."""
    if not seed_runs:
        raise RunError(f"run '{name}': no seed runs to aggregate")
    seed_runs = [runs.get(r.path) for r in seed_runs]   # as they are now, done (a pipeline's evals added scores)
    first = seed_runs[0]
    means, stats = summarize([r.metrics for r in seed_runs])
    recipe = dict(first.info.get("recipe") or {})
    recipe["name"] = name
    record = {"name": name, "stage": first.stage, "seed_key": key, "seeds": list(seeds),
              "runs": [r.name for r in seed_runs], "linked": first.name, "metrics": stats}
    with runs.start(str(first.stage), name, recipe, parents=seed_runs,
                    data_fingerprints=first.info.get("data_fingerprints"), overwrite=overwrite) as run:
        _link_entries(first, run)
        write_json_atomic(run.seeds_path, record)
        run.info["metrics"] = {}
        run.finish(metrics=means)
    return run


def _link_entries(source: Run, target: Run) -> None:
    """Link every entry of ``source`` (relative links) into ``target``, but its own files and hidden ones."""
    own = {getattr(RunLayout, attr).relative for attr in _OWN}
    for entry in sorted(source.path.iterdir()):
        if entry.name.startswith(".") or entry.name in own:
            continue
        os.symlink(os.path.relpath(entry, target.path), target.path / entry.name)


def read_seeds(run: Run) -> dict | None:
    """The run's ``seeds.json`` (None for a run that is not a seeds run)."""
    try:
        return json.loads(run.seeds_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def metric_spread(run: Run, metric: str) -> dict | None:
    """``{"mean", "sd", "n", "values"}`` of ``metric`` over the seeds of ``run``, where there are two or more."""
    record = read_seeds(run)
    stats = (record or {}).get("metrics", {}).get(metric)
    if not isinstance(stats, dict) or not isinstance(stats.get("n"), int) or stats["n"] < 2 or stats.get("sd") is None:
        return None
    return stats


# --------------------------------------------------------------------------- verdicts


@dataclasses.dataclass(frozen=True)
class SpreadResult:
    """A verdict on seed means: the difference (against a run, or a fixed min/max), its standard error,
    one-sided bounds at ``confidence`` and pass / fail / inconclusive, as :class:`smolforge.paired.PairedResult`."""

    verdict: str
    difference: float
    stderr: float
    low: float
    high: float
    seeds: tuple[int, int]      # seeds on each side (a fixed bound or a single run: 1)
    df: float                   # degrees of freedom of the t quantile
    confidence: float
    tolerance: float
    borrowed: bool = False      # one side was a single run: it was given the other side's sd
    paired: bool = False        # seed by seed: each new seed run descends from the reference's run of that seed

    def describe(self) -> str:
        """The interval in words.

        >>> SpreadResult("pass", -0.01, 0.012, -0.03, 0.01, (3, 3), 4.0, 0.95, 0.05).describe()
        'Δ -0.010 ± 0.012 (95 % bounds [-0.030, 0.010], 3 seeds against 3, tolerance 0.050): pass'
        """
        against = (f"{self.seeds[0]} seeds against a single run (given their sd)" if self.borrowed
                   else f"{self.seeds[0]} seed pairs" if self.paired else f"{self.seeds[0]} seeds against {self.seeds[1]}")
        return (f"Δ {self.difference:+.3f} ± {self.stderr:.3f} ({100 * self.confidence:g} % bounds "
                f"[{self.low:+.3f}, {self.high:+.3f}], {against}, tolerance {self.tolerance:.3f}): "
                f"{self.verdict}").replace("+", "")

    def to_dict(self) -> dict:
        """The keys of a paired result's dict (the pipeline summary reads them), and ``basis: seeds``."""
        return {"verdict": self.verdict, "difference": round(self.difference, 5), "stderr": round(self.stderr, 5),
                "low": round(self.low, 5), "high": round(self.high, 5), "items": None, "seeds": list(self.seeds),
                "df": round(self.df, 3), "confidence": self.confidence, "tolerance": self.tolerance,
                "basis": "seed pairs" if self.paired else "seeds"}


def _verdict(difference: float, stderr: float, df: float, *, tolerance: float, higher_is_better: bool,
             confidence: float) -> tuple[str, float, float]:
    t = t_quantile(confidence, df) if stderr > 0 else 0.0
    low, high = difference - t * stderr, difference + t * stderr
    if higher_is_better:
        verdict = "fail" if high < -tolerance else "pass" if low >= -tolerance else "inconclusive"
    else:
        verdict = "fail" if low > tolerance else "pass" if high <= tolerance else "inconclusive"
    return verdict, low, high


def compare_spreads(new: dict, reference: dict, *, tolerance: float, higher_is_better: bool,
                    confidence: float = 0.95) -> SpreadResult:
    """The verdict of seed means ``new`` against ``reference`` (each ``{"mean", "sd", "n"}``; a single run has
    ``n`` 1 and ``sd`` None), as :func:`smolforge.paired.compare` gives one for per-item scores.

    The difference of means has standard error ``sqrt(sd_new²/n_new + sd_ref²/n_ref)`` and Welch's
    degrees of freedom; a single run on one side is given the other side's sd (its noise exists but
    one run cannot show it), with that side's n − 1 degrees of freedom.

    >>> a, b = {"mean": 0.52, "sd": 0.01, "n": 3}, {"mean": 0.50, "sd": 0.01, "n": 3}
    >>> compare_spreads(a, b, tolerance=0.0, higher_is_better=True).verdict
    'pass'
    >>> compare_spreads(b, a, tolerance=0.0, higher_is_better=True).verdict
    'fail'
    >>> compare_spreads({"mean": 0.51, "sd": 0.02, "n": 3}, b, tolerance=0.0, higher_is_better=True).verdict
    'inconclusive'
    """
    sd_new, sd_ref = new.get("sd"), reference.get("sd")
    n_new, n_ref = int(new["n"]), int(reference["n"])
    if (sd_new is None or n_new < 2) and (sd_ref is None or n_ref < 2):
        raise ValueError("a seed verdict needs two or more seeds on one side")
    borrowed = False
    if sd_new is None or n_new < 2:
        sd_new, n_new, borrowed, df = sd_ref, 1, True, n_ref - 1
    elif sd_ref is None or n_ref < 2:
        sd_ref, n_ref, borrowed, df = sd_new, 1, True, n_new - 1
    var_new, var_ref = sd_new ** 2 / n_new, sd_ref ** 2 / n_ref
    stderr = math.sqrt(var_new + var_ref)
    if not borrowed:
        parts = var_new ** 2 / (n_new - 1) + var_ref ** 2 / (n_ref - 1)
        df = (var_new + var_ref) ** 2 / parts if parts > 0 else float(n_new + n_ref - 2)
    difference = float(new["mean"]) - float(reference["mean"])
    verdict, low, high = _verdict(difference, stderr, df, tolerance=tolerance, higher_is_better=higher_is_better,
                                  confidence=confidence)
    return SpreadResult(verdict, difference, stderr, low, high, (int(new["n"]), int(reference["n"])), df,
                        confidence, tolerance, borrowed)


def seed_pairs(run: Run, reference: Run, metric: str) -> tuple[list[float], list[float]] | None:
    """Both seeds runs' values of ``metric`` seed by seed, where every seed run of ``run`` has the
    reference's run of the same seed among its parents (a pipeline chains seeded steps so); else None."""
    new, old = read_seeds(run), read_seeds(reference)
    if not new or not old or new.get("seeds") != old.get("seeds"):
        return None
    new_stats, old_stats = (r.get("metrics", {}).get(metric) or {} for r in (new, old))
    new_values, old_values = new_stats.get("values"), old_stats.get("values")
    if not new_values or not old_values or len(new_values) != len(old_values) or len(new_values) < 2:
        return None
    for seed_run, parent_name in zip(new.get("runs", []), old.get("runs", [])):
        try:
            parents = Run(run.path.parent / seed_run).parents
        except (OSError, ValueError, RunError):
            return None
        if parent_name not in {Path(str(p)).name for p in parents}:
            return None
    return [float(v) for v in new_values], [float(v) for v in old_values]


def compare_seed_pairs(new: list[float], reference: list[float], *, tolerance: float, higher_is_better: bool,
                       confidence: float = 0.95) -> SpreadResult:
    """The verdict on seed-by-seed differences (each new seed run trained from the reference's run of that
    seed): their mean, its standard error sd/√n and Student's t with n − 1 degrees of freedom. The chain's
    own seed-to-seed spread cancels, so three seeds can resolve what two independent means cannot.

    >>> compare_seed_pairs([0.09, 0.10, 0.10], [0.05, 0.04, 0.08], tolerance=0.05, higher_is_better=False).verdict
    'inconclusive'
    >>> compare_seed_pairs([0.36, 0.36, 0.37], [0.34, 0.45, 0.59], tolerance=0.05, higher_is_better=True).verdict
    'inconclusive'
    >>> compare_seed_pairs([0.52, 0.53, 0.51], [0.50, 0.51, 0.50], tolerance=0.0, higher_is_better=True).verdict
    'pass'
    """
    diffs = [a - b for a, b in zip(new, reference)]
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    stderr = sd / math.sqrt(n)
    verdict, low, high = _verdict(mean, stderr, n - 1, tolerance=tolerance, higher_is_better=higher_is_better,
                                  confidence=confidence)
    return SpreadResult(verdict, mean, stderr, low, high, (n, n), float(n - 1), confidence, tolerance, paired=True)


def check_bound(stats: dict, bound: float, *, at_least: bool, confidence: float = 0.95) -> SpreadResult:
    """The verdict of a seed mean against a fixed ``min`` (``at_least``) or ``max``: its one-sided bound
    (mean ∓ t·sd/√n) beyond the bound: pass; the other bound short of it: fail; else inconclusive.

    >>> check_bound({"mean": 0.6, "sd": 0.01, "n": 3}, 0.5, at_least=True).verdict
    'pass'
    >>> check_bound({"mean": 0.52, "sd": 0.05, "n": 3}, 0.5, at_least=True).verdict
    'inconclusive'
    >>> check_bound({"mean": 0.3, "sd": 0.01, "n": 3}, 0.2, at_least=False).verdict
    'fail'
    """
    n = int(stats["n"])
    stderr = float(stats["sd"]) / math.sqrt(n)
    difference = float(stats["mean"]) - float(bound)
    verdict, low, high = _verdict(difference, stderr, n - 1, tolerance=0.0, higher_is_better=at_least,
                                  confidence=confidence)
    return SpreadResult(verdict, difference, stderr, low, high, (n, 1), float(n - 1), confidence, 0.0)


# Student's t: the quantile by bisection on the CDF, the CDF from the regularized incomplete beta function
# (Numerical Recipes' continued fraction): the spine imports no scipy.


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for aa in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                   -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile: the ``t`` with P(T ≤ t) = ``p`` at ``df`` degrees of freedom (0.5 < p < 1).

    >>> round(t_quantile(0.95, 2), 3), round(t_quantile(0.95, 4), 3), round(t_quantile(0.975, 10), 3)
    (2.92, 2.132, 2.228)
    """
    if not 0.5 <= p < 1:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1, got {p}")
    if df > 1e6:
        return NormalDist().inv_cdf(p)
    low, high = 0.0, 1.0
    while _t_cdf(high, df) < p:
        low, high = high, high * 2
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if _t_cdf(middle, df) < p else (low, middle)
    return (low + high) / 2


# --------------------------------------------------------------------------- output


def _figure(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def spread_cell(stats: dict | None) -> str | None:
    """``0.520 ± 0.020 (n=3)`` (3 decimals below 10, else the figure's own width); None without stats.

    >>> spread_cell({"mean": 0.52, "sd": 0.02, "n": 3}), spread_cell({"mean": 1638400.0, "sd": 0.0, "n": 2})
    ('0.520 ± 0.020 (n=3)', '1,638,400 ± 0 (n=2)')
    >>> spread_cell({"mean": 0.52, "sd": None, "n": 1})
    '0.520 (n=1)'
    """
    if not stats:
        return None
    mean, sd, n = stats["mean"], stats.get("sd"), stats["n"]
    small = abs(mean) < 10 and (sd is None or sd < 10)
    mean_text = f"{mean:.3f}" if small else _figure(mean)
    if sd is None:   # one seed: no spread to show
        return f"{mean_text} (n={n})"
    return f"{mean_text} ± {sd:.3f} (n={n})" if small else f"{mean_text} ± {_figure(sd)} (n={n})"


def seeds_table(record: dict) -> str:
    """What ``--seeds`` prints: one row per numeric metric, ``mean ± sd (n=…)``.

    >>> print(seeds_table({"name": "x", "stage": "sft", "seed_key": "trainer.seed", "seeds": [0, 1],
    ...                    "runs": ["x-seed0", "x-seed1"], "metrics": {"a/acc": spread([0.5, 0.7])}}))
    run x (sft): mean ± sd over 2 seeds (trainer.seed = 0, 1; runs x-seed0, x-seed1)
    metric  mean ± sd
    ------  -------------------
    a/acc   0.600 ± 0.141 (n=2)
    """
    head = (f"run {record['name']} ({record['stage']}): mean ± sd over {len(record['seeds'])} seeds "
            f"({record['seed_key']} = {', '.join(map(str, record['seeds']))}; runs {', '.join(record['runs'])})")
    rows = [[key, spread_cell(stats)] for key, stats in record["metrics"].items()]
    return head + "\n" + render_table(["metric", "mean ± sd"], rows)
