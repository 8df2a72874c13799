"""Judge responses with an LLM behind any OpenAI-compatible endpoint, and keep every verdict in a run.

    smolforge judge --config recipes/demo/judge.yaml
    smolforge judge --config recipes/demo/judge.yaml --set judge.endpoint=http://127.0.0.1:8000/v1 --set judge.model=sft-demo
    smolforge judge --config recipes/demo/judge.yaml --set mode=pointwise --set rubric=recipes/demo/rubric.yaml

The judge is a served model: ``judge.endpoint`` (``smolforge serve``, a vLLM server, a hosted API with its
key in the environment variable ``judge.api_key_env``) or ``judge.run`` (that run's model served by vLLM
for the duration). ``mode``:

- ``pairwise``: which of two responses is better (A, B or a tie). Every pair is judged in both orders and
  gets a verdict only where both agree; how often they do not is the judge's *position bias*. With the
  first token's log-probs (vLLM and OpenAI give them) each verdict carries a margin, |P(A) - P(B)|.
  ``verdict: balanced`` decides instead by the probability that a response wins averaged over both
  orders (:mod:`smolforge.generation.judge.verdicts`): a judge that always answers "A" (as the 135M
  SmolLM2 does) can still separate pairs by how hard it leans.
- ``pointwise``: a score on a rubric's scale (``rubric:``, a YAML file: name, scale, criteria) and the
  judge's reason.
- ``reference``: pairwise, with a reference answer in every row shown to the judge.

A sanity suite of pairs whose better answer is known (``sanity: builtin``, or a file) is judged first;
its accuracy and position bias are reported beside the items' (``sanity_min_accuracy`` stops the run
before the items when the judge is worse). Requests run ``workers`` at a time, at most ``rate`` a
second, with a progress bar; every reply is cached under ``<runs>/.cache/judge/`` by (judge, request),
so a judge killed halfway resumes where it stopped and a repeated judgement costs nothing. An endpoint
that stays down fails the run with the URL named: no verdict is invented.

Writes the run ``name``: ``verdicts.jsonl`` (per item: both readings, the verdict, margin; or score and
reason), ``sanity.jsonl``, and in ``run.json`` the judge's identity (endpoint and model, under
``metrics``: ``judge/identity``), the rubric's and items' fingerprints and the figures (``judge/…``).
"""
from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from smolforge.errors import DataError, RecipeError, ServiceError
from smolforge.recipe import to_dict
from smolforge.runs import Run, Runs, atomic_writer, fingerprint, unfinished_run
from smolforge.table import render_table

from smolforge.generation.judge.endpoint import JudgeEndpoint, cache_for, served_run
from smolforge.generation.judge.items import BUILTIN_SANITY, MODES, read_rows
from smolforge.generation.judge.pairs import judge_pairs, judge_points
from smolforge.generation.judge.prompts import load_rubric
from smolforge.generation.judge.verdicts import RULES, summarise


PAIRWISE_TOKENS = 8       # the letter, with room for "Response A"
POINTWISE_TOKENS = 128    # "Score: N" and a reason


@dataclass
class JudgeSpec:
    endpoint: str | None = None       # OpenAI-compatible base URL (http://127.0.0.1:8000/v1): serve, vLLM, a hosted API
    model: str | None = None          # the served model's name (default: the endpoint's only model)
    run: str | None = None            # or: a run whose model/ is served by vLLM for the duration
    api_key_env: str | None = None    # environment variable holding the endpoint's key (never logged)


@dataclass
class Recipe:
    name: str = "judge-demo"          # run name
    items: str = ""                   # .jsonl: pairs {prompt, response_a, response_b} or {prompt, chosen, rejected};
                                      #   pointwise {prompt, response}; a `reference` answer where a row has one
    mode: str = "pairwise"            # pairwise | pointwise | reference (pairwise, a reference in every row)
    verdict: str = "agree"            # pairs: agree (both orders must agree) | balanced (P(x wins) averaged over
                                      #   both orders from the first token's log-probs: for position-biased judges)
    judge: JudgeSpec = field(default_factory=JudgeSpec)
    rubric: str | None = None         # pointwise: a rubric YAML (name, scale: [low, high], criteria)
    sanity: str = "builtin"           # builtin | none | a .jsonl of {prompt, chosen, rejected}: judged first
    sanity_min_accuracy: float | None = None  # stop before the items when the sanity accuracy is lower
    limit: int | None = None          # judge the first N items only
    max_tokens: int | None = None     # reply length (default: 8 pairwise, 128 pointwise)
    workers: int = 4                  # requests in flight
    rate: float = 0.0                 # requests per second at most (0: no limit)
    timeout: float = 120.0            # seconds per request (refused connections, 429 and 5xx are retried)
    cache: bool = True                # reuse replies cached under <runs>/.cache/judge/


def validate(recipe: Recipe, runs: Runs) -> None:
    if recipe.mode not in MODES:
        raise RecipeError(f"mode must be one of {', '.join(MODES)}, got {recipe.mode!r}")
    if not recipe.items:
        raise RecipeError("items: name a .jsonl of the pairs (or responses) to judge")
    if (recipe.judge.endpoint is None) == (recipe.judge.run is None):
        raise RecipeError("judge: give either endpoint (a served model's base URL) or run (a run to serve)")
    if recipe.verdict not in RULES:
        raise RecipeError(f"verdict must be one of {', '.join(RULES)}, got {recipe.verdict!r}")
    if recipe.mode == "pointwise" and not recipe.rubric:
        raise RecipeError("rubric: pointwise judging needs a rubric YAML (name, scale, criteria)")
    if recipe.mode != "pointwise" and recipe.rubric:
        raise RecipeError(f"rubric: only pointwise judging reads a rubric (mode is {recipe.mode})")
    for name, value, low in (("workers", recipe.workers, 1), ("limit", recipe.limit, 1),
                             ("max_tokens", recipe.max_tokens, 1)):
        if value is not None and value < low:
            raise RecipeError(f"{name} must be >= {low}, got {value}")
    if recipe.rate < 0 or recipe.timeout <= 0:
        raise RecipeError(f"rate must be >= 0 and timeout > 0, got {recipe.rate} and {recipe.timeout}")
    if recipe.sanity_min_accuracy is not None and not 0 <= recipe.sanity_min_accuracy <= 1:
        raise RecipeError(f"sanity_min_accuracy must be within [0, 1], got {recipe.sanity_min_accuracy}")
    if recipe.rubric:
        load_rubric(recipe.rubric)
    read_rows(recipe.items, recipe.mode, limit=recipe.limit)
    if recipe.sanity != "none":
        unlabelled = [r["id"] for r in read_rows(_sanity_file(recipe), "pairwise") if r["label"] is None]
        if unlabelled:
            raise DataError(f"sanity {_sanity_file(recipe)}: every pair needs its known better answer (chosen/rejected, "
                            f"or label: A | B | T); row(s) {', '.join(unlabelled[:5])} have none")
    if recipe.judge.run is not None:
        runs.get(recipe.judge.run)
    else:
        _endpoint(recipe, recipe.judge.endpoint).check_model()


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    rows = read_rows(recipe.items, recipe.mode, limit=recipe.limit)
    rubric = load_rubric(recipe.rubric) if recipe.rubric else None
    sanity = read_rows(_sanity_file(recipe), "pairwise") if recipe.sanity != "none" else []
    parents = [runs.get(recipe.judge.run)] if recipe.judge.run else []
    files = [recipe.items] + ([recipe.rubric] if recipe.rubric else [])
    resume = unfinished_run(runs.root / recipe.name, overwrite=overwrite) is not None
    with runs.start("judge", recipe.name, to_dict(recipe), parents=parents, data_fingerprints=fingerprint(*files),
                    overwrite=overwrite, resume=resume) as run, _served(recipe, runs, run) as judge:
        started = time.perf_counter()
        metrics = {"judge/identity": judge.identity, "judge/mode": recipe.mode,
                   **({"judge/rubric_sha256": rubric.sha256} if rubric else {})}
        if sanity:
            judged = judge_pairs(judge, sanity, max_tokens=recipe.max_tokens or PAIRWISE_TOKENS, what="sanity suite",
                                 rule=recipe.verdict)
            _write_rows(run.sanity_path, judged)
            figures = summarise(judged)
            metrics.update({"judge/sanity_accuracy": figures["label_agreement"],
                            "judge/sanity_position_bias": figures["position_bias"]})
            floor = recipe.sanity_min_accuracy
            if floor is not None and figures["label_agreement"] < floor:
                raise ServiceError(f"the judge {judge.identity} got {figures['label_agreement']:.0%} of the sanity "
                                   f"suite right (sanity_min_accuracy {floor:.0%}); see {run.sanity_path}")
        if recipe.mode == "pointwise":
            judged = judge_points(judge, rows, rubric, max_tokens=recipe.max_tokens or POINTWISE_TOKENS)
            metrics.update(_point_figures(judged))
        else:
            judged = judge_pairs(judge, rows, max_tokens=recipe.max_tokens or PAIRWISE_TOKENS, rule=recipe.verdict)
            metrics.update({f"judge/{k}": v for k, v in summarise(judged).items() if v is not None})
        _write_rows(run.verdicts_path, judged)
        metrics.update({"judge/requests": judge.asked, "judge/cached": judge.cached,
                        "judge/seconds": round(time.perf_counter() - started, 1)})
        run.finish(metrics)
    _print(run)
    return run


def _point_figures(judged: list[dict]) -> dict:
    scores = [r["score"] for r in judged if r["score"] is not None]
    return {"judge/items": len(judged), "judge/scored": len(scores),
            "judge/unreadable": len(judged) - len(scores),
            **({"judge/mean_score": round(sum(scores) / len(scores), 3)} if scores else {})}


def _sanity_file(recipe: Recipe):
    return BUILTIN_SANITY if recipe.sanity == "builtin" else recipe.sanity


def _endpoint(recipe: Recipe, base_url: str, model: str | None = None, identity: str | None = None) -> JudgeEndpoint:
    return JudgeEndpoint(base_url, model or recipe.judge.model or "", api_key_env=recipe.judge.api_key_env,
                         workers=recipe.workers, rate=recipe.rate, timeout=recipe.timeout, progress=True,
                         identity=identity)


@contextlib.contextmanager
def _served(recipe: Recipe, runs: Runs, run: Run) -> Iterator[JudgeEndpoint]:
    """The judge for this run: the recipe's endpoint, or the judge run served by vLLM until the run ends."""
    if recipe.judge.endpoint is not None:
        judge = _endpoint(recipe, recipe.judge.endpoint)
        judge.check_model()
        judge.cache = cache_for(runs.cache_dir("judge"), judge.identity) if recipe.cache else None
        yield judge
        return
    with served_run(runs.get(recipe.judge.run), run.serve_log_path) as (base_url, model, identity):
        judge = _endpoint(recipe, base_url, model, identity=identity)
        judge.cache = cache_for(runs.cache_dir("judge"), judge.identity) if recipe.cache else None
        yield judge


def _write_rows(path, rows: list[dict]) -> None:
    with atomic_writer(path) as handle:
        handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _print(run: Run) -> None:
    metrics = run.metrics
    rows = [[k.removeprefix("judge/"), v] for k, v in metrics.items() if k.startswith("judge/")]
    print(f"\njudge run {run.name} ({metrics.get('judge/identity')})")
    print(render_table(["figure", "value"], rows))
