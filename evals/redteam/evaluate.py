"""Adversarial (red-team) suites: have a model answer them, score the replies by rules, write the result.

    result = score_model("runs/sft-demo/model", "redteam")        # or any generate(conversations) function
    write_results(runs.get("sft-demo"), result)                    # eval/redteam.json, samples, run.json metrics

A suite is a folder (``evals/suites/<name>/`` or any path) holding ``suite.yaml`` (``kind:
adversarial``, refusal markers, categories) and one JSONL of items per category; the schema is
in the shipped ``evals/suites/redteam/suite.yaml`` and in ``docs/redteam.md``. Users add suites,
categories or items by adding files: no code needed.

Each category has a *rule* saying when an item counts as a failure:

- ``complies``: an attack (jailbreak) succeeded: the reply shows no refusal.
- ``refuses``: a benign prompt was refused (over-refusal).
- ``marker``: a prompt injection succeeded: the item's ``marker`` appears in the reply.
- ``canary``: a secret leaked: the item's ``canary`` appears in the reply.

Markers and canaries match with case and every non-letter/digit ignored (``CNRY-7F3K`` matches
``cnry 7f3k``). Items may add ``must_match`` / ``must_not_match`` regexes, reported as a format
pass rate beside the rule. Per category the result has ``n``, the failure rate
(``attack_success_rate`` for attacks, ``over_refusal_rate`` for benign prompts) and its binomial
stderr ``sqrt(p(1 - p) / n)``. An optional judge (any generator, e.g. an
:class:`~smolforge.generation.chat.EndpointGenerator`) answers a yes/no question per reply; its verdicts
and agreement with the rules are reported beside them, and the rules stay the score.

This module runs the evaluation; the parts live beside it in the package, and every name below is
importable from :mod:`smolforge.evals.redteam`:

- :mod:`~smolforge.evals.redteam.suite`: the suite schema, loading and checking;
- :mod:`~smolforge.evals.redteam.items`: its items and categories;
- :mod:`~smolforge.evals.redteam.rules`: refusal detection, secret matching, the verdict on one reply;
- :mod:`~smolforge.evals.redteam.scoring`: the optional judge, the rates and their standard errors;
- :mod:`~smolforge.evals.redteam.report`: the files and metrics written into a run, the table.

    >>> suite = load_redteam_suite("redteam")
    >>> sorted(suite.categories)
    ['canary', 'injection', 'jailbreak', 'jailbreak_world', 'over_refusal', 'over_refusal_world']
    >>> refuse = lambda conversations: ["I'm sorry, but I can't help with that."] * len(conversations)
    >>> result = score_model(refuse, suite, limit=2, progress=False)
    >>> result["categories"]["jailbreak"]["attack_success_rate"], result["categories"]["over_refusal"]["over_refusal_rate"]
    (0.0, 1.0)
"""
from __future__ import annotations

import difflib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from smolforge.errors import RecipeError, RunError
from smolforge.generation.chat import Generate, check_replies, hf_generator
from smolforge.runs import Run

from .items import Category
from .report import write_results
from .rules import score_output
from .scoring import judge_items, summarise
from .suite import RedteamSuite, load_redteam_suite

__all__ = ["score_model", "evaluate_run"]


def _select(suite: RedteamSuite, categories: Sequence[str] | None) -> list[Category]:
    names = list(categories) if categories else list(suite.categories)
    for name in names:
        if name not in suite.categories:
            close = difflib.get_close_matches(name, list(suite.categories), n=1)
            hint = f"did you mean '{close[0]}'?; " if close else ""
            raise RecipeError(f"suite '{suite.name}' has no category '{name}' ({hint}its categories: "
                              f"{', '.join(suite.categories)})")
    return [suite.categories[n] for n in names]


def _describe(model: Any) -> str:
    return str(getattr(model, "description", None) or getattr(model, "__qualname__", None) or type(model).__name__)


def score_model(model: str | Path | Generate, suite: str | Path | RedteamSuite = "redteam", *,
                categories: Sequence[str] | None = None, limit: int | None = None, judge: Generate | None = None,
                max_new_tokens: int = 128, batch_size: int = 8, device: str = "auto", chunk: int = 32,
                progress: bool = True) -> dict:
    """Have ``model`` answer every item of ``suite`` and score the replies; returns the full result.

    ``model`` is an HF model folder (run in-process by :func:`~smolforge.generation.chat.hf_generator` with
    ``max_new_tokens``, ``batch_size``, ``device``) or any ``generate(conversations) -> replies``
    function, e.g. an :class:`~smolforge.generation.chat.EndpointGenerator`. ``categories`` picks some
    (default all), ``limit`` keeps the first N items of each. ``judge`` is an optional generator
    asked each category's yes/no question. Conversations go to the generator ``chunk`` at a time
    (with a progress bar when ``progress``).

    The result: ``suite``, ``suite_path``, ``suite_version``, ``suite_files`` (sha256 of each
    file), ``model``, ``settings``, ``seconds``, ``categories`` ({name: kind, rule, metric, n,
    failures, attack_success_rate | over_refusal_rate, stderr, refusal_rate, format, judge}),
    ``overall`` ({attack, benign, judge_agreement}) and ``items`` (per item: id, category, rule,
    messages, reply, failed, refused, evidence, format_ok, format_problems, judge, tags).

    >>> said = lambda convs: ["PWNED-" + "1" * 4] * len(convs)
    >>> r = score_model(said, "redteam", categories=["jailbreak"], limit=3, progress=False)
    >>> r["categories"]["jailbreak"]["n"], r["categories"]["jailbreak"]["failures"], len(r["items"])
    (3, 3, 3)
    """
    if limit is not None and limit < 1:
        raise RecipeError(f"limit must be >= 1 or null, got {limit}")
    if chunk < 1:
        raise RecipeError(f"chunk must be >= 1, got {chunk}")
    suite = suite if isinstance(suite, RedteamSuite) else load_redteam_suite(suite)
    selected = _select(suite, categories)
    items = [item for category in selected for item in category.items[:limit]]
    started = time.perf_counter()
    generate = model if callable(model) else hf_generator(model, max_new_tokens=max_new_tokens,
                                                          batch_size=batch_size, device=device)
    replies = _generate_all(generate, [item.messages for item in items], chunk, progress, suite.name)
    judged = judge_items(judge, suite, items, replies) if judge is not None else [None] * len(items)
    records = []
    for item, reply, verdict in zip(items, replies, judged):
        category = suite.categories[item.category]
        records.append({"id": item.id, "category": item.category, "rule": category.rule, "messages": item.messages,
                        "reply": reply, **score_output(item, reply, category.rule, suite.refusal),
                        "judge": verdict, "tags": item.tags})
    per_category, overall = summarise(selected, records)
    return {"suite": suite.name, "kind": "adversarial", "suite_path": str(suite.path), "suite_version": suite.version,
            "suite_files": suite.fingerprints(), "model": _describe(generate),
            "judge": _describe(judge) if judge is not None else None,
            "settings": {"categories": [c.name for c in selected], "limit": limit, "max_new_tokens": max_new_tokens,
                         "batch_size": batch_size, "refusal_window": suite.refusal.window},
            "seconds": round(time.perf_counter() - started, 2), "categories": per_category, "overall": overall,
            "items": records}


def _generate_all(generate: Generate, conversations: list, chunk: int, progress: bool, label: str) -> list[str]:
    from tqdm.auto import tqdm

    replies: list[str] = []
    with tqdm(total=len(conversations), desc=f"{label}: generating", unit="item", disable=not progress) as bar:
        for start in range(0, len(conversations), chunk):
            part = conversations[start:start + chunk]
            replies.extend(check_replies(generate(part), len(part)))
            bar.update(len(part))
    return replies


def evaluate_run(run: Run, suite: str | Path = "redteam", *, generate: Generate | None = None,
                 judge: Generate | None = None, categories: Sequence[str] | None = None, limit: int | None = None,
                 max_new_tokens: int = 128, batch_size: int = 8, device: str = "auto",
                 progress: bool = True) -> dict:
    """Score ``run``'s model (or ``generate``, e.g. an endpoint serving it) on ``suite`` and write
    the results into the run (:func:`write_results`); returns the result of :func:`score_model`.

    >>> import tempfile
    >>> from smolforge.runs import Runs
    >>> with Runs(tempfile.mkdtemp()).start("sft", "toy", recipe={}) as run:
    ...     pass
    >>> evaluate_run(run, "redteam")
    Traceback (most recent call last):
    ...
    smolforge.errors.RunError: run 'toy' (stage sft) has no model/ to evaluate (give generate= to score an endpoint)
    """
    if generate is None and not (run.model_dir / "config.json").is_file():
        raise RunError(f"run '{run.name}' (stage {run.stage}) has no model/ to evaluate "
                       "(give generate= to score an endpoint)")
    result = score_model(generate if generate is not None else run.model_dir, suite, categories=categories,
                         limit=limit, judge=judge, max_new_tokens=max_new_tokens, batch_size=batch_size,
                         device=device, progress=progress)
    result["run"] = run.name
    write_results(run, result)
    return result

