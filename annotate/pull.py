"""From annotated records to preference rows: the resolution rule, the counts, agreement, the run.

Input is one plain dict per record (:func:`from_argilla` makes it from an ``rg.Record``)::

    {"id": "…", "prompt": "text" or [{"role", "content"}, ...],
     "responses": ["text of response_1", "text of response_2", ...],
     "runs": ["run behind response_1", ...],            # optional, for the per-run tally
     "answers": [{"user_id": "…", "status": "submitted" | "discarded" | "draft",
                  "values": {"preference": …, "rating": 4, "comment": "…"}}, ...]}

``preference`` is ``"response_1" | "response_2" | "tie"`` (two responses) or a ranking of the
responses: ``[{"value": "response_2", "rank": 1}, ...]`` as Argilla stores it, or the names
best first.

The rule (each record gets exactly one outcome, counted in the report):

- **pending**: fewer submitted answers than ``min_votes`` (drafts do not count), and not discarded;
- **discarded**: no submitted answer and at least one annotator discarded it;
- two responses — **used** when one label has a strict majority (more than half) of the submitted
  votes and it names a response; **tied** when that majority is ``tie``; **disagreed** otherwise
  (e.g. one vote each, or A / B / tie);
- a ranking — each response's mean rank over the submitted votes; **used** when there is a single
  best and a single worst (chosen = best, rejected = worst); otherwise **tied** when every vote is
  the same ranking, **disagreed** when they differ;
- **unusable**: the winning pair has identical or empty texts (DPO could not learn from it).

Rows come out sorted by record id, so pulling twice gives the same file. Agreement covers every
submitted vote, whatever the outcome: Cohen's kappa when exactly two annotators answered the label
question, Krippendorff's alpha (nominal) for more; rankings use ordinal alpha over
(record, response) ranks; the optional rating gets its own ordinal alpha.

    >>> rec = {"id": "r1", "prompt": "2+2?", "responses": ["4", "5"],
    ...        "answers": [{"user_id": "ann", "status": "submitted", "values": {"preference": "response_1"}},
    ...                    {"user_id": "bob", "status": "submitted", "values": {"preference": "response_1"}}]}
    >>> rows, report = resolve([rec])
    >>> rows
    [{'prompt': '2+2?', 'chosen': '4', 'rejected': '5'}]
    >>> report["counts"]["used"], report["agreement"]["metric"]
    (1, 'cohen_kappa')
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from smolforge.errors import DataError

from .agreement import cohen_kappa, krippendorff_alpha
from .records import exact_fields

__all__ = ["OUTCOMES", "TIE", "QUESTION", "resolve", "decide", "ranks_of", "agreement", "from_argilla",
           "pair_row", "submitted_votes", "write_preference_run"]

OUTCOMES = ("used", "tied", "disagreed", "discarded", "pending", "unusable")
TIE = "tie"
QUESTION = "preference"


def ranks_of(value: Any, k: int) -> dict[str, float]:
    """``{"response_i": rank}`` of one vote (1 = best; equal ranks = tie).

    >>> ranks_of("response_2", 2), ranks_of("tie", 2)
    ({'response_2': 1, 'response_1': 2}, {'response_1': 1, 'response_2': 1})
    >>> ranks_of([{"value": "response_3", "rank": 1}, {"value": "response_1", "rank": 2},
    ...           {"value": "response_2", "rank": 2}], 3)
    {'response_3': 1, 'response_1': 2, 'response_2': 2}
    >>> ranks_of(["response_2", "response_1"], 2)
    {'response_2': 1, 'response_1': 2}
    """
    names = [f"response_{i}" for i in range(1, k + 1)]
    if isinstance(value, str):
        if value == TIE:
            return {n: 1 for n in names}
        if value not in names:
            raise DataError(f"answer {value!r} is not one of {', '.join(names + [TIE])}")
        return {value: 1} | {n: 2 for n in names if n != value}
    if isinstance(value, Sequence) and value and all(isinstance(v, Mapping) for v in value):
        ranks = {v["value"]: v["rank"] for v in value}
    elif isinstance(value, Sequence) and value and all(isinstance(v, str) for v in value):
        ranks = {v: i for i, v in enumerate(value, start=1)}
    else:
        raise DataError(f"answer {value!r} is neither a label nor a ranking")
    if set(ranks) != set(names) or any(r is None for r in ranks.values()):
        raise DataError(f"ranking {value!r} must rank each of {', '.join(names)} exactly once")
    return ranks


def submitted_votes(record: Mapping) -> list[dict]:
    """Submitted answers with a preference value, one per annotator (sorted by user id)."""
    votes = [a for a in record.get("answers", []) if a.get("status") == "submitted"
             and (a.get("values") or {}).get(QUESTION) is not None]
    return sorted(votes, key=lambda a: str(a["user_id"]))


def decide(record: Mapping, min_votes: int = 1) -> tuple[str, int | None, int | None]:
    """``(outcome, chosen index, rejected index)`` of one record by the module's rule.

    >>> vote = lambda user, v: {"user_id": user, "status": "submitted", "values": {"preference": v}}
    >>> decide({"responses": ["a", "b"], "answers": [vote("x", "response_2"), vote("y", "tie")]})
    ('disagreed', None, None)
    >>> decide({"responses": ["a", "b"], "answers": [vote("x", "response_2"), vote("y", "response_2"),
    ...                                              vote("z", "tie")]})
    ('used', 1, 0)
    """
    k = len(record["responses"])
    votes = submitted_votes(record)
    if not votes:
        discarded = any(a.get("status") == "discarded" for a in record.get("answers", []))
        return ("discarded" if discarded else "pending"), None, None
    if len(votes) < min_votes:
        return "pending", None, None
    values = [v["values"][QUESTION] for v in votes]
    if k == 2 and all(isinstance(v, str) for v in values):
        for v in values:
            ranks_of(v, k)  # validates the label
        label, count = Counter(values).most_common(1)[0]
        if count * 2 <= len(values):
            return "disagreed", None, None
        if label == TIE:
            return "tied", None, None
        chosen = int(label.rsplit("_", 1)[1]) - 1
        return "used", chosen, 1 - chosen
    all_ranks = [ranks_of(v, k) for v in values]
    names = [f"response_{i}" for i in range(1, k + 1)]
    mean = [sum(r[n] for r in all_ranks) / len(all_ranks) for n in names]
    best, worst = min(mean), max(mean)
    if mean.count(best) == 1 and mean.count(worst) == 1:
        return "used", mean.index(best), mean.index(worst)
    same = all(r == all_ranks[0] for r in all_ranks)
    return ("tied" if same else "disagreed"), None, None


def _assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def pair_row(record: Mapping, chosen: int, rejected: int) -> dict | None:
    good, bad = record["responses"][chosen], record["responses"][rejected]
    if not str(good).strip() or not str(bad).strip() or good == bad:
        return None
    if isinstance(record["prompt"], list):  # conversational prompt → conversational pair
        return {"prompt": record["prompt"], "chosen": _assistant(good), "rejected": _assistant(bad)}
    return {"prompt": record["prompt"], "chosen": good, "rejected": bad}


def agreement(records: Iterable[Mapping]) -> dict:
    """Agreement over every submitted vote: ``{"metric", "value", "annotators", "items"}`` and, when
    ratings were given, ``rating_alpha`` (ordinal). ``value`` is None when undefined (see agreement.py).

    >>> vote = lambda user, v: {"user_id": user, "status": "submitted", "values": {"preference": v}}
    >>> recs = [{"id": i, "responses": ["a", "b"], "answers": [vote("x", v), vote("y", w), vote("z", v)]}
    ...         for i, (v, w) in enumerate([("response_1", "response_1"), ("response_2", "tie")])]
    >>> a = agreement(recs); a["metric"], a["annotators"], round(a["value"], 3)  # 1 - 5 * 2 / 22
    ('krippendorff_alpha_nominal', 3, 0.545)
    """
    labels: dict[str, dict[str, Any]] = {}
    ranks: dict[tuple[str, str], dict[str, float]] = {}
    ratings: dict[str, dict[str, Any]] = {}
    users: set[str] = set()
    ranking = False
    for record in records:
        rid, k = str(record["id"]), len(record["responses"])
        for vote in submitted_votes(record):
            user, value = str(vote["user_id"]), vote["values"][QUESTION]
            users.add(user)
            if k == 2 and isinstance(value, str):
                labels.setdefault(rid, {})[user] = value
            else:
                ranking = True
                for name, rank in ranks_of(value, k).items():
                    ranks.setdefault((rid, name), {})[user] = rank
            rating = vote["values"].get("rating")
            if rating is not None:
                ratings.setdefault(rid, {})[user] = rating
    out: dict[str, Any] = {"annotators": len(users),
                           "items": sum(len(v) >= 2 for v in labels.values())
                           + len({rid for (rid, _), v in ranks.items() if len(v) >= 2})}
    if ranking:
        out |= {"metric": "krippendorff_alpha_ordinal", "value": krippendorff_alpha(ranks, "ordinal")}
    elif len(users) == 2:
        a, b = sorted(users)
        out |= {"metric": "cohen_kappa",
                "value": cohen_kappa([v.get(a) for v in labels.values()], [v.get(b) for v in labels.values()])}
    elif len(users) > 2:
        out |= {"metric": "krippendorff_alpha_nominal", "value": krippendorff_alpha(labels, "nominal")}
    else:
        out |= {"metric": None, "value": None}
    if ratings:
        out["rating_alpha"] = krippendorff_alpha(ratings, "ordinal")
    return out


def resolve(records: Iterable[Mapping], min_votes: int = 1) -> tuple[list[dict], dict]:
    """Preference rows (sorted by record id) and the report ``{"counts", "agreement", "wins", "ids",
    "rule"}``; ``ids`` are the record ids of the rows, in row order.
    """
    records = sorted(records, key=lambda r: str(r["id"]))
    seen = Counter(str(r["id"]) for r in records)
    duplicated = [rid for rid, n in seen.items() if n > 1]
    if duplicated:
        raise DataError(f"record id '{duplicated[0]}' appears {seen[duplicated[0]]} times in the export")
    counts = dict.fromkeys(OUTCOMES, 0)
    wins: dict[str, Counter] = defaultdict(Counter)
    rows, ids = [], []
    for record in records:
        try:
            outcome, chosen, rejected = decide(record, min_votes)
        except DataError as exc:
            raise DataError(f"record '{record['id']}': {exc}") from None
        row = pair_row(record, chosen, rejected) if outcome == "used" else None
        if outcome == "used" and row is None:
            outcome = "unusable"
        counts[outcome] += 1
        if row is not None:
            rows.append(row)
            ids.append(str(record["id"]))
            runs = record.get("runs")
            if runs:
                wins[runs[chosen]]["won"] += 1
                wins[runs[rejected]]["lost"] += 1
    report = {"counts": counts, "records": len(records), "agreement": agreement(records),
              "wins": {run: dict(sorted(c.items())) for run, c in sorted(wins.items())}, "ids": ids,
              "min_votes": min_votes, "rule": "strict majority of submitted votes (labels) or unique best/worst "
                                              "mean rank (rankings); ties and disagreements excluded"}
    return rows, report


def from_argilla(record: Any) -> dict:
    """The plain dict :func:`resolve` takes, from an ``rg.Record`` fetched ``with_responses=True``."""
    metadata = dict(record.metadata or {})
    fields = dict(record.fields)
    if isinstance(fields.get("prompt"), list):
        fields["prompt"] = [{"role": m["role"], "content": m["content"]} for m in
                            (m if isinstance(m, Mapping) else {"role": m.role, "content": m.content}
                             for m in fields["prompt"])]
    fields = exact_fields(fields, metadata)               # the texts as pushed (records.display_fields)
    k = sum(1 for name in fields if str(name).startswith("response_"))
    by_user: dict[str, dict] = {}
    # The server's own response models first: the SDK's Response objects turn a ranking into a plain
    # list of names in submission order, dropping the ranks (and so the order and any ties).
    raw = getattr(getattr(record, "_model", None), "responses", None) or []
    for model in raw:
        status = getattr(model.status, "value", model.status)
        by_user[str(model.user_id)] = {"user_id": str(model.user_id), "status": status,
                                       "values": {name: (v or {}).get("value") for name, v in (model.values or {}).items()}}
    for response in ([] if raw else record.responses):  # a record built in memory
        status = getattr(response.status, "value", response.status)
        entry = by_user.setdefault(str(response.user_id), {"user_id": str(response.user_id), "status": status,
                                                          "values": {}})
        entry["values"][response.question_name] = response.value
    runs = [metadata.get(f"run_{i}") for i in range(1, k + 1)]
    return {"id": str(record.id), "prompt": fields["prompt"], "responses": [fields[f"response_{i}"] for i in range(1, k + 1)],
            "runs": runs if all(runs) else None,
            "answers": [by_user[u] for u in sorted(by_user)]}


def write_preference_run(runs: Any, name: str, rows: list[dict], report: dict, parents: Sequence[Any] = (), *,
                         recipe: Any = None, overwrite: bool = False, started_at: str | None = None) -> Any:
    """Write run ``name`` (stage ``annotate``): ``data/prefs/part-*.jsonl`` (what ``dpo``'s ``data:``
    reads), ``annotations.json`` (the report) and flat metrics. Rows are validated first; no rows
    is a DataError and no run is created. ``parents`` are Runs or run names/folders; ``started_at``
    (UTC ISO time) dates the run from the push rather than from the pull.
    """
    from smolforge.data.schemas import validate_row
    from smolforge.data.shards import ShardWriter, files_fingerprint
    from smolforge.runs import write_json_atomic

    for i, row in enumerate(rows):
        validate_row(row, "preference", f"{name} row {i + 1} (record {report.get('ids', ['?'] * len(rows))[i]})")
    if not rows:
        counts = ", ".join(f"{k} {v}" for k, v in report.get("counts", {}).items())
        raise DataError(f"no preference pairs to write for '{name}' ({counts or 'no records'}); "
                        "wait for submitted answers and pull again")
    parent_runs = [runs.get(p) if isinstance(p, str) else p for p in parents]
    with runs.start("annotate", name, recipe=recipe, parents=parent_runs, overwrite=overwrite) as run:
        if started_at:
            run.info["started_at"] = started_at
        with ShardWriter(run.data_shard_dir("prefs")) as writer:
            for row in rows:
                writer.write(row)
        run.info["data_fingerprints"] = {"data/prefs": files_fingerprint(writer.paths)}
        write_json_atomic(run.annotations_path, report)
        agreement_info = report.get("agreement", {})
        metrics = {f"annotate/{key}": value for key, value in report.get("counts", {}).items()}
        metrics |= {"annotate/rows": len(rows), "annotate/agreement": agreement_info.get("value"),
                    "annotate/annotators": agreement_info.get("annotators")}
        review = report.get("review")
        if review:   # judge-assisted review (smolforge.annotate.review)
            metrics |= {f"annotate/review_{key}": review[key] for key in ("pairs", "sent_to_people", "accepted",
                                                                        "accepted_rows")}
            metrics |= {"annotate/judge_kappa": review["judge_vs_people"]["kappa"],
                        "annotate/judge_accuracy": review["judge_vs_people"]["accuracy"],
                        "annotate/judge_annotator_kappa": review["judge_vs_annotators_mean_kappa"],
                        "annotate/audit_accuracy": review["audit_agreement"]["accuracy"]}
        run.finish(metrics=metrics)
    return run
