"""The data card: what a data run holds and what was done to get it, as JSON and as Markdown.

``data_card.json`` is for scripts (and the pipeline's lineage); ``data_card.md`` is the same
content for people, printed at the end of ``smolforge data prepare``. The figures come from the
passes in :mod:`smolforge.data.prepare`; this module counts tokens and domains, packs pretraining text,
and renders.

    >>> card = {"name": "d", "kinds": {}, "tokens": {}, "domains": {"web": {"documents": 3, "tokens": 30}},
    ...         "mixture": natural_mixture({"web": 3}), "mixture_source": "natural"}
    >>> print(summary_markdown(card).splitlines()[0])
    # Data card: d
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from smolforge.runs import RunLayout, atomic_writer

from .packed_store import PackedWriter
from .shards import files_fingerprint, kind_files, read_files
from .tokenizer import DOC_SEPARATOR

KIND_NAMES = ("pretrain", "sft", "prefs", "prompts", "feedback")


def write_bad_rows(path: Path, bad_rows: dict) -> None:
    """Every skipped row, one JSON object per line: kind, where, error (written even when empty)."""
    with atomic_writer(path) as handle:
        for kind, bad in bad_rows.items():
            for item in bad.items:
                handle.write(json.dumps({"kind": kind, **item}, ensure_ascii=False) + "\n")


def domain_counts(run_path: Path) -> dict[str, dict]:
    """``{domain: {"documents": n}}`` over the pretraining shards."""
    counts = Counter(str(row.get("domain", "default")) for _, row in read_files(kind_files(run_path, "pretrain")))
    return {d: {"documents": n} for d, n in sorted(counts.items())}


def natural_mixture(sizes: dict[str, int]) -> list[dict]:
    """One phase weighting domains by size (what pretraining does without a mixture)."""
    total = sum(sizes.values()) or 1
    return [{"until": 1.0, "weights": {d: round(n / total, 6) for d, n in sorted(sizes.items())}}]


def _chat_ids(tokenizer, conversations: list) -> list[list[int]]:
    rendered = tokenizer.apply_chat_template(conversations, tokenize=False)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def count_tokens(run_path: Path, tokenizer, kinds: tuple[str, ...] = KIND_NAMES, batch: int = 1000) -> dict[str, int]:
    """Tokens per kind: pretraining text plus its separators; chat, pairs (both answers) and feedback
    (prompt + completion) through the chat template."""
    totals = {}
    for kind in kinds:
        total, pending = 0, []

        def flush() -> int:
            if not pending:
                return 0
            if kind == "pretrain":
                ids = tokenizer([r["text"] for r in pending], add_special_tokens=False)["input_ids"]
                count = sum(len(x) + 1 for x in ids)
            elif kind == "sft":
                count = sum(map(len, _chat_ids(tokenizer, [r["messages"] for r in pending])))
            elif kind == "prompts":
                count = sum(len(_chat_ids(tokenizer, [r["prompt"]])[0]) if isinstance(r["prompt"], list) else
                            len(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) for r in pending)
            else:
                answers = ("completion",) if kind == "feedback" else ("chosen", "rejected")
                count = sum(map(len, _pair_ids(tokenizer, pending, answers)))
            pending.clear()
            return count

        for _, row in read_files(kind_files(run_path, kind)):
            pending.append(row)
            if len(pending) == batch:
                total += flush()
        total += flush()
        totals[kind] = total
    return totals


def _pair_ids(tokenizer, rows: list[dict], answers: tuple[str, ...] = ("chosen", "rejected")) -> list[list[int]]:
    out = []
    for row in rows:
        for key in answers:
            if isinstance(row["prompt"], list):
                out += _chat_ids(tokenizer, [row["prompt"] + row[key]])
            else:
                out.append(tokenizer(row["prompt"] + row[key], add_special_tokens=False)["input_ids"])
    return out


def pack(run_path: Path, tokenizer, seq_len: int, batch: int = 1000) -> dict:
    """Tokenize the pretraining shards and pack them per domain into ``packed/``."""
    sep = tokenizer.convert_tokens_to_ids(DOC_SEPARATOR)
    if sep is None or sep == tokenizer.unk_token_id:
        sep = tokenizer.eos_token_id
    with PackedWriter(RunLayout(run_path).packed_dir, seq_len) as writer:
        pending: list[dict] = []

        def flush() -> None:
            ids = tokenizer([r["text"] for r in pending], add_special_tokens=False)["input_ids"]
            for row, doc in zip(pending, ids):
                writer.add(str(row.get("domain", "default")), doc + [sep])
            pending.clear()

        for _, row in read_files(kind_files(run_path, "pretrain")):
            pending.append(row)
            if len(pending) == batch:
                flush()
        if pending:
            flush()
    meta = writer.meta
    rows = sum(d["rows"] for d in meta["domains"].values())
    tokens = sum(d["tokens"] for d in meta["domains"].values())
    meta["rows"] = rows
    meta["efficiency"] = round(rows * seq_len / tokens, 5) if tokens else 0.0  # tokens kept in full rows
    return meta


def fingerprints(run_path: Path) -> dict[str, str]:
    """``{"data/<kind>": sha256 of its shards, "packed/<domain>": sha256 of its ids}``."""
    out = {f"data/{kind}": files_fingerprint(kind_files(run_path, kind)) for kind in KIND_NAMES}
    for path in sorted(RunLayout(run_path).packed_dir.glob("*.ids.bin")):
        out[f"packed/{path.name[:-len('.ids.bin')]}"] = files_fingerprint([path])
    return out


def metrics(card: dict) -> dict:
    """Flat figures for run.json."""
    kinds = card["kinds"]
    out = {f"data/{kind}_rows": kinds[kind]["rows_out"] for kind in kinds}
    out.update({f"data/{kind}_tokens": n for kind, n in card["tokens"].items()})
    pre = kinds.get("pretrain", {})
    if pre:
        out["data/pretrain_duplicate_rate_before"] = pre["dedup"]["duplicate_rate_before"]
        out["data/pretrain_duplicate_rate_after"] = pre["dedup"].get("duplicate_rate_after")
    out["data/decontamination_hits"] = sum(k["decontamination"]["hits"] for k in kinds.values())
    out["data/bad_rows"] = sum(k["bad_rows"]["count"] for k in kinds.values())
    out["data/vocab_size"] = card.get("tokenizer", {}).get("vocab_size")
    if "packed" in card:
        out["data/packed_rows"] = card["packed"]["rows"]
    out["data/seconds"] = card.get("seconds")
    # names the earlier data stage used, which the README and docs quote
    out["data/pretrain_docs"] = out.get("data/pretrain_rows")
    out["data/sft_conversations"] = out.get("data/sft_rows")
    out["data/preference_pairs"] = out.get("data/prefs_rows")
    return out


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.2f} %"


def _table(headers: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def summary_markdown(card: dict) -> str:
    """The card as Markdown: sources, counts, tokens, filters, dedup, decontamination, mixture."""
    kinds = card["kinds"]
    out = [f"# Data card: {card['name']}", ""]
    executor = card.get("executor")
    if executor:
        out += [executor_line(executor), ""]
    if kinds:
        out += ["## Rows", ""]
        rows = []
        for kind, k in kinds.items():
            sources = "; ".join(f"{s['source']} ({s['format']}, {s['rows']:,} rows)" for s in k["sources"])
            rows.append([kind, sources, f"{k['rows_in']:,}", f"{k['bad_rows']['count']:,}", f"{k['rows_out']:,}",
                         f"{card['tokens'].get(kind, 0):,}", len(k["shards"]), k["rows_per_s"]])
        out += _table(["kind", "sources", "rows read", "bad rows", "rows kept", "tokens", "shards", "rows/s"], rows)
        bad = [(kind, item) for kind, k in kinds.items() for item in k["bad_rows"]["items"]]
        if bad:
            out += ["", f"Bad rows skipped (on_error: {card['on_error']}; all in reports/bad_rows.jsonl):", ""]
            out += [f"- {kind}: {item['where']}: {item['error']}" for kind, item in bad]
        out += ["", "## Quality filters (pretraining text)", ""]
        filters = kinds.get("pretrain", {}).get("filters")
        if filters:
            removed = filters["removed"] or {}
            out += _table(["rule", "documents removed"], [[r, f"{n:,}"] for r, n in sorted(removed.items())] or
                          [["(none)", 0]])
            out += ["", f"{filters['documents']:,} documents in, {filters['kept']:,} kept."]
        else:
            out += ["Off."]
        out += ["", "## Deduplication", ""]
        rows = []
        for kind, k in kinds.items():
            d = k["dedup"]
            rows.append([kind, f"{d['documents']:,}", f"{d['exact_removed']:,}", f"{d['near_removed']:,}",
                         f"{d['paragraphs_removed']:,}", _pct(d["duplicate_rate_before"]),
                         _pct(d.get("duplicate_rate_after"))])
        out += _table(["kind", "rows in", "exact", "near", "paragraphs", "dup rate before", "dup rate after"], rows)
        d = kinds.get("pretrain", {}).get("dedup")
        if d and d.get("near"):
            out += ["", f"Near-duplicates: MinHash-LSH on word {d['shingle_size']}-shingles, {d['num_perm']} "
                        f"permutations, {d['bands']} bands x {d['rows']} rows: a pair is caught with 50 % "
                        f"probability at Jaccard {d['detection_50']} and 95 % at {d['detection_95']} "
                        f"({d['workers']} worker process(es)). Near-duplicate dedup runs on pretraining text; "
                        "the other kinds get exact dedup (feedback: text and label). \"After\" is re-measured on "
                        "the output with a new MinHash seed: pairs near the threshold, caught by one seed and "
                        "missed by another, show up there."]
        out += ["", "## Decontamination", ""]
        suites = card.get("decontamination_suites") or {}
        if suites:
            out += [f"Checked against: {', '.join(sorted(suites))}.", ""]
            rows = [[kind, k["decontamination"]["hits"],
                     ", ".join(f"{s}: {n}" for s, n in sorted(k["decontamination"]["by_suite"].items())) or "-",
                     k["decontamination"]["action"]] for kind, k in kinds.items()]
            out += _table(["kind", "rows matching an eval item", "by suite", "action"], rows)
            examples = [(kind, h) for kind, k in kinds.items() for h in k["decontamination"]["examples"][:5]]
            if examples:
                out += [""] + [f"- {kind}: {h['where']} holds {h['suite']}/{h['file']} row {h['row']}"
                               for kind, h in examples]
        else:
            out += ["Off."]
    out += ["", "## Pretraining domains and mixture", ""]
    domains = card.get("domains") or {}
    packed = (card.get("packed") or {}).get("domains", {})
    out += _table(["domain", "documents", "tokens", "packed rows"],
                  [[d, f"{v['documents']:,}", f"{packed.get(d, {}).get('tokens', 0):,}",
                    f"{packed.get(d, {}).get('rows', 0):,}"] for d, v in domains.items()])
    out += ["", f"Mixture ({card.get('mixture_source')}):", ""]
    out += _table(["phase", "until", "weights"],
                  [[i, p["until"], ", ".join(f"{d} {w:.3f}" for d, w in p["weights"].items())]
                   for i, p in enumerate(card.get("mixture") or [])])
    if card.get("packed"):
        p = card["packed"]
        out += ["", f"Packed for pretraining: {p['rows']:,} rows of {p['seq_len']} tokens in packed/ "
                    f"({100 * p['efficiency']:.1f} % of the tokens; each domain's tail is dropped)."]
    if card.get("tokenizer"):
        out += [f"Tokenizer: {card['tokenizer']['path']}, {card['tokenizer']['vocab_size']:,} tokens."]
    changes = (executor or {}).get("rule_changes")
    if changes:
        out += ["", "## Rule changes (datatrove path vs inline)", ""]
        out += _table(["rule", "how datatrove's version differs"], [[r, t] for r, t in changes.items()])
        out += ["", "Every removed row and its rule: reports/removed-<kind>.jsonl."]
    if card.get("fingerprints"):
        out += ["", "## Fingerprints", ""]
        out += [f"- `{name}`: `{value}`" for name, value in card["fingerprints"].items()]
    return "\n".join(out) + "\n"


def executor_line(executor: dict) -> str:
    """One sentence: which executor ran, with how many tasks.

    >>> executor_line({"executor": "slurm", "tasks": 2, "workers": -1, "engine": "datatrove 0.10.1",
    ...                "slurm_jobs": {"filter": "7", "dedup": "10"}})
    'Executor: slurm (datatrove 0.10.1), 2 tasks, workers -1; Slurm jobs filter 7, dedup 10.'
    >>> executor_line({"executor": "inline", "tasks": 1, "workers": 1})
    'Executor: inline (one process pool), 1 task, workers 1.'
    """
    engine = executor.get("engine", "one process pool")
    tasks = executor["tasks"]
    line = f"Executor: {executor['executor']} ({engine}), {tasks} task{'s' if tasks != 1 else ''}, workers {executor['workers']}"
    jobs = executor.get("slurm_jobs")
    if jobs:
        line += "; Slurm jobs " + ", ".join(f"{stage} {job}" for stage, job in jobs.items())
    return line + "."


def write_summary(path: Path, card: dict) -> None:
    with atomic_writer(path) as handle:
        handle.write(summary_markdown(card))
