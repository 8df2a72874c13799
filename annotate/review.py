"""Judge-assisted review: an LLM judge reads every pair before people do; people get what it cannot settle.

A review push with ``review:`` set judges each sampled pair in both orders
(:mod:`smolforge.generation.judge`: cached, rate-limited, reference-guided where the prompt has an answer)
and routes it:

- ``send: all`` (calibration): every pair goes to people, the judge's verdict in hidden metadata
  (``judge_verdict``, ``judge_margin``: not shown to annotators), so a pull can measure the judge
  against them;
- ``send: uncertain``: only the pairs the judge is unsure of go to people: no verdict (its two orders
  disagree, or no log-probs under ``verdict: balanced``) or a margin below ``min_margin``. The rest is
  *accepted*: the judge's verdict becomes the preference pair, except for an ``audit`` share of them
  (seeded) that people review too, blind, to measure how good the accepted verdicts are.

What the judge said about every pair is kept beside the runs (``<runs>/.cache/review/``, one file per
server, workspace and dataset, rewritten atomically), so ``annotate pull`` can add the accepted pairs
and report, next to the annotators' own agreement: Cohen's kappa of the judge against the people's
majority, its confusion matrix, its accuracy per verdict, and the audit sample's agreement.

    >>> entries = {"r1": {"verdict": "response_1", "margin": 0.9, "route": "accepted", "prompt": "2+2?",
    ...                   "responses": ["4", "5"]}}
    >>> accepted_rows(entries)
    ([{'prompt': '2+2?', 'chosen': '4', 'rejected': '5'}], ['r1'], 0)
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import random
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smolforge.errors import RecipeError
from smolforge.recipe import FRACTION
from smolforge.runs import atomic_writer

__all__ = ["Review", "SEND", "check", "judge_endpoint", "served_judge", "judge_items", "route", "metadata", "store_path",
           "save", "load", "accepted_rows", "calibration", "merge"]

SEND = ("all", "uncertain")
UNSURE = "unsure"
METADATA = {"judge_verdict": {"type": "terms"}, "judge_margin": {"type": "float"}, "review": {"type": "terms"}}


@dataclass
class Review:
    judge: dict = field(default_factory=dict)  # {endpoint: URL, model: NAME, api_key_env: VAR}, or {run: RUN}
    send: str = "all"                 # all: every pair to people, verdict hidden (calibration) | uncertain
    verdict: str = "agree"            # agree (both orders must agree) | balanced (log-probs over both orders)
    min_margin: float = field(default=0.0, metadata=FRACTION)  # uncertain: a verdict below this margin goes to people
    audit: float = field(default=0.1, metadata=FRACTION)       # uncertain: share of accepted verdicts people check blind
    seed: int = 0                     # seeds the audit sample
    reference: bool = True            # show the judge the prompt's reference answer where it has one
    max_tokens: int = 8               # the judge's reply (a letter)
    workers: int = 4                  # judge requests in flight
    rate: float = 0.0                 # judge requests per second at most (0: no limit)
    timeout: float = 120.0            # seconds per judge request


def check(review: Review, k: int) -> None:
    """The review settings, before anything runs."""
    from smolforge.generation.judge.verdicts import RULES

    unknown = sorted(set(review.judge) - {"endpoint", "run", "model", "api_key_env"})
    if unknown or bool(review.judge.get("endpoint")) == bool(review.judge.get("run")):
        raise RecipeError("review.judge: expected {endpoint: URL, model: NAME, api_key_env: VAR} or {run: RUN} "
                          "(a run served by vLLM while it judges)"
                          + (f"; unknown field(s) {', '.join(unknown)}" if unknown else
                             "; give one of endpoint and run"))
    if k != 2:
        raise RecipeError(f"review: the judge compares two responses; k must be 2, got {k}")
    if review.send not in SEND:
        raise RecipeError(f"review.send must be one of {', '.join(SEND)}, got {review.send!r}")
    if review.verdict not in RULES:
        raise RecipeError(f"review.verdict must be one of {', '.join(RULES)}, got {review.verdict!r}")
    if review.max_tokens < 1 or review.workers < 1 or review.rate < 0 or review.timeout <= 0:
        raise RecipeError("review: max_tokens and workers >= 1, rate >= 0 and timeout > 0 are needed")


def judge_endpoint(review: Review, cache_dir: Path | None, *, base_url: str | None = None, model: str | None = None,
                   identity: str | None = None) -> Any:
    """The judge, its model checked at the endpoint (a RecipeError or ServiceError naming it otherwise)."""
    from smolforge.generation.judge.endpoint import JudgeEndpoint, cache_for

    spec = review.judge
    judge = JudgeEndpoint(base_url or spec["endpoint"], model or spec.get("model") or "",
                          api_key_env=spec.get("api_key_env"), workers=review.workers, rate=review.rate,
                          timeout=review.timeout, progress=True, identity=identity)
    judge.check_model("review.judge.model")
    if cache_dir is not None:
        judge.cache = cache_for(cache_dir, judge.identity)
    return judge


@contextlib.contextmanager
def served_judge(review: Review, runs: Any, log_path: Path) -> Iterator[Any]:
    """The judge for one push: the recipe's endpoint, or its ``run`` served by vLLM until the judging ends
    (named, and cached, by the run's folder: the server gets a new port each time)."""
    if review.judge.get("endpoint"):
        yield judge_endpoint(review, runs.cache_dir("judge"))
        return
    from smolforge.generation.judge.endpoint import served_run

    with served_run(runs.get(review.judge["run"]), log_path) as (base_url, model, identity):
        yield judge_endpoint(review, runs.cache_dir("judge"), base_url=base_url, model=model, identity=identity)


def judge_items(judge: Any, items: list[dict], references: Mapping[str, str], review: Review) -> dict[str, dict]:
    """``{record id: {"verdict": response_1 | response_2 | tie | None, "margin", "consistent"}}``: each
    pushed item's two responses, as the records show them, judged in both orders."""
    from smolforge.generation.judge.pairs import judge_pairs

    rows = [{"prompt": item["fields"]["prompt"], "response_a": item["fields"]["response_1"],
             "response_b": item["fields"]["response_2"],
             **({"reference": references[item["id"]]} if review.reference and item["id"] in references else {})}
            for item in items]
    judged = judge_pairs(judge, rows, max_tokens=review.max_tokens, what="review pairs", rule=review.verdict)
    label = {"A": "response_1", "B": "response_2", "T": "tie", None: None}
    return {item["id"]: {"verdict": label[j["verdict"]], "margin": j["margin"], "consistent": j["consistent"]}
            for item, j in zip(items, judged)}


def unsure(judged: Mapping[str, Any], min_margin: float) -> bool:
    """No verdict, or one whose margin (where known) is below ``min_margin``.

    >>> unsure({"verdict": None, "margin": None}, 0.0), unsure({"verdict": "tie", "margin": 0.05}, 0.1)
    (True, True)
    >>> unsure({"verdict": "response_2", "margin": None}, 0.1), unsure({"verdict": "response_1", "margin": 0.4}, 0.1)
    (False, False)
    """
    if judged["verdict"] is None:
        return True
    return judged["margin"] is not None and judged["margin"] < min_margin


def route(judged: Mapping[str, Mapping], review: Review) -> dict[str, str]:
    """``{record id: all | uncertain | audit | accepted}``: who decides each pair.

    >>> judged = {f"r{i}": {"verdict": "response_1", "margin": 0.5} for i in range(10)} | {"u": {"verdict": None, "margin": None}}
    >>> routes = route(judged, Review(judge={"endpoint": "x"}, send="uncertain", audit=0.2))
    >>> Counter(routes.values()) == Counter({"accepted": 8, "audit": 2, "uncertain": 1}), routes["u"]
    (True, 'uncertain')
    """
    if review.send == "all":
        return dict.fromkeys(judged, "all")
    routes = {rid: ("uncertain" if unsure(j, review.min_margin) else "accepted") for rid, j in sorted(judged.items())}
    sure = [rid for rid, where in routes.items() if where == "accepted"]
    audited = round(review.audit * len(sure))
    if review.audit > 0 and sure and audited == 0:
        audited = 1                      # an audit was asked for: at least one pair
    for rid in random.Random(review.seed).sample(sure, audited):
        routes[rid] = "audit"
    return routes


def metadata(judged: Mapping[str, Any], where: str) -> dict:
    """The record's hidden metadata: the judge's verdict (``unsure`` for none), margin, and route."""
    out = {"judge_verdict": judged["verdict"] or UNSURE, "review": where}
    if judged["margin"] is not None:
        out["judge_margin"] = float(judged["margin"])
    return out


def store_path(cache_dir: Path, server: str, workspace: str, dataset: str) -> Path:
    """The file that keeps the judge's reading of every pair pushed to ``workspace/dataset`` on ``server``."""
    key = hashlib.sha256(f"{server}\n{workspace}\n{dataset}".encode()).hexdigest()[:16]
    return cache_dir / f"{workspace}-{dataset}-{key}.jsonl"


def load(path: Path) -> dict[str, dict]:
    """``{record id: entry}`` from :func:`save`'s file ({} when there is none)."""
    if not path.is_file():
        return {}
    entries = (json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    return {entry["id"]: entry for entry in entries}


def save(path: Path, entries: Mapping[str, dict]) -> None:
    """Merge ``entries`` into the file (a later push of the same record replaces its entry), atomically."""
    merged = load(path) | {rid: {"id": rid, **entry} for rid, entry in entries.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path) as handle:
        handle.writelines(json.dumps(merged[rid], ensure_ascii=False) + "\n" for rid in sorted(merged))


def accepted_rows(entries: Mapping[str, Mapping]) -> tuple[list[dict], list[str], int]:
    """``(preference rows, their record ids, ties)`` from the verdicts accepted without people."""
    from .pull import pair_row

    rows, ids, ties = [], [], 0
    for rid in sorted(entries):
        entry = entries[rid]
        if entry.get("route") != "accepted":
            continue
        if entry["verdict"] == "tie":
            ties += 1
            continue
        chosen = int(entry["verdict"].rsplit("_", 1)[1]) - 1
        row = pair_row({"prompt": entry["prompt"], "responses": entry["responses"]}, chosen, 1 - chosen)
        if row is not None:
            rows.append(row)
            ids.append(rid)
    return rows, ids, ties


def _people_label(record: Mapping, min_votes: int) -> str | None:
    """The people's majority label (``response_1``/``response_2``/``tie``) of a record, or None."""
    from .pull import decide

    outcome, chosen, _ = decide(record, min_votes)
    if outcome == "used":
        return f"response_{chosen + 1}"
    return "tie" if outcome == "tied" else None


def _agreement(pairs: list[tuple[str, str]]) -> dict:
    from .agreement import cohen_kappa

    judge, people = [a for a, _ in pairs], [b for _, b in pairs]
    return {"items": len(pairs), "accuracy": round(sum(a == b for a, b in pairs) / len(pairs), 3) if pairs else None,
            "kappa": _round(cohen_kappa(judge, people)) if pairs else None}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def calibration(records: list[Mapping], entries: Mapping[str, Mapping], min_votes: int) -> dict:
    """The judge against the people on the records they answered: kappa and accuracy against the
    majority (all reviewed pairs, and the audit sample), against each annotator, the confusion matrix
    (judge verdict → people's label; ``unsure`` where the judge gave none) and accuracy per verdict."""
    from .pull import QUESTION, submitted_votes

    pairs: list[tuple[str, str]] = []
    audit: list[tuple[str, str]] = []
    confusion: dict[str, Counter] = {}
    per_annotator: dict[str, list[tuple[str, str]]] = {}
    for record in records:
        entry = entries.get(str(record["id"]))
        if entry is None:
            continue
        verdict, people = entry["verdict"], _people_label(record, min_votes)
        if verdict is not None:      # each annotator's own answer, also where the people have no majority
            for vote in submitted_votes(record):
                value = vote["values"][QUESTION]
                if isinstance(value, str):
                    per_annotator.setdefault(str(vote["user_id"]), []).append((verdict, value))
        if people is None:
            continue
        confusion.setdefault(verdict or UNSURE, Counter())[people] += 1
        if verdict is not None:
            pairs.append((verdict, people))
            if entry.get("route") == "audit":
                audit.append((verdict, people))
    by_verdict = {label: round(sum(a == b for a, b in pairs if a == label) / n, 3)
                  for label, n in sorted(Counter(a for a, _ in pairs).items())}
    annotators = {user: _agreement(p) for user, p in sorted(per_annotator.items())}
    kappas = [a["kappa"] for a in annotators.values() if a["kappa"] is not None]
    return {"judge_vs_people": _agreement(pairs), "audit_agreement": _agreement(audit),
            "judge_vs_annotators": annotators,
            "judge_vs_annotators_mean_kappa": round(sum(kappas) / len(kappas), 3) if kappas else None,
            "confusion": {verdict: dict(sorted(c.items())) for verdict, c in sorted(confusion.items())},
            "accuracy_by_verdict": by_verdict}


def merge(rows: list[dict], report: dict, records: list[Mapping], entries: Mapping[str, Mapping],
          min_votes: int) -> tuple[list[dict], dict]:
    """The people's rows plus the accepted verdicts' (sorted by record id), and the report's ``review``
    section: how many pairs people saw, how many the judge settled, and :func:`calibration`."""
    people_ids = set(report["ids"])
    extra_rows, extra_ids, ties = accepted_rows({rid: e for rid, e in entries.items() if rid not in people_ids})
    merged = sorted(zip(report["ids"] + extra_ids, rows + extra_rows), key=lambda pair: pair[0])
    routes = Counter(entry.get("route") for entry in entries.values())
    section = {"pairs": len(entries), "sent_to_people": sum(n for r, n in routes.items() if r != "accepted"),
               "uncertain": routes.get("uncertain", 0), "audit": routes.get("audit", 0),
               "accepted": routes.get("accepted", 0), "accepted_rows": len(extra_rows), "accepted_ties": ties,
               "people_rows": len(rows), **calibration(records, entries, min_votes)}
    return [row for _, row in merged], report | {"ids": [rid for rid, _ in merged], "review": section}
