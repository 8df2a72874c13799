"""The data stage's passes: rows in → filter → dedup → decontaminate → shards; shards → tokens → packed rows.

Everything streams: rows arrive one source at a time and leave in batches, so a corpus larger
than memory passes through with only hashes, LSH band keys and one batch held. Each function
returns a plain dict for the data card (see :mod:`smolforge.data.card`).

    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp())
    >>> rows = [("a line 1", {"text": "the same words here again"}), ("a line 2", {"text": "the same words here again"}),
    ...         ("a line 3", {"text": "and some other words too"})]
    >>> report = process_kind("pretrain", iter(rows), out / "pretrain", ProcessSpec())
    >>> report["rows_in"], report["rows_out"], report["dedup"]["exact_removed"]
    (3, 2, 1)
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ProcessPoolExecutor
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .decontaminate import EvalIndex
from .dedup import DedupSpec, Deduplicator, minhash_signatures
from .filters import FilterSpec, QualityFilter, check
from .shards import ShardWriter, read_files

BATCH = 5000        # rows per dedup batch (MinHashes of a batch go to the worker pool together)
EXAMPLES = 20       # hits / removals quoted in the card; the full lists go to reports/*.jsonl


def row_text(kind: str, row: dict) -> str:
    """The text of a row that filters, dedup and decontamination look at.

    >>> row_text("prefs", {"prompt": [{"role": "user", "content": "Q?"}], "chosen": "A.", "rejected": "B."})
    'Q?\\nA.\\nB.'
    >>> row_text("feedback", {"prompt": "Q?", "completion": [{"role": "assistant", "content": "A."}], "label": True})
    'Q?\\nA.'
    """
    def flat(value) -> str:
        return value if isinstance(value, str) else "\n".join(m["content"] for m in value)

    if kind == "pretrain":
        return row["text"]
    if kind == "sft":
        return flat(row["messages"])
    if kind == "prompts":
        return "\n".join([flat(row["prompt"])] + ([row["answer"]] if row.get("answer") else []))
    if kind == "feedback":
        return "\n".join(flat(row[k]) for k in ("prompt", "completion"))
    return "\n".join(flat(row[k]) for k in ("prompt", "chosen", "rejected"))


def dedup_text(kind: str, row: dict) -> str:
    """What exact dedup compares: the row's text and, for feedback, its label too, so one answer marked
    good by one user and bad by another keeps both rows (decontamination reads :func:`row_text`).

    >>> dedup_text("feedback", {"prompt": "Q?", "completion": "A.", "label": False})
    'Q?\\nA.\\nlabel false'
    """
    text = row_text(kind, row)
    return f"{text}\nlabel {'true' if row['label'] else 'false'}" if kind == "feedback" else text


@dataclass
class ProcessSpec:
    """What happens to one kind's rows (the stage fills it from the recipe)."""

    filters: FilterSpec | None = None      # quality filters (pretraining text only)
    dedup: DedupSpec = field(default_factory=DedupSpec)
    index: EvalIndex | None = None         # eval n-grams to keep out; None = no decontamination
    decontam_action: str = "remove"        # remove | flag
    rows_per_shard: int = 50_000
    verify: bool = True                    # re-measure duplicates on the output (independent MinHash seed)


def _batches(rows: Iterable, size: int) -> Iterator[list]:
    batch = []
    for item in rows:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _clean_and_sign(job: tuple[list[str], FilterSpec | None, DedupSpec | None]) -> tuple[list, list]:
    """Filter verdicts for ``texts`` and MinHash signatures of those that pass (runs in a worker)."""
    texts, filters, near = job
    reasons = [check(t, filters) for t in texts] if filters is not None else [None] * len(texts)
    passing = [t for t, reason in zip(texts, reasons) if reason is None]
    return reasons, (minhash_signatures(passing, near) if near is not None and passing else [])


class CleanAndSign:
    """The per-document CPU work of a batch (quality filters + MinHash) on ``workers`` processes.

    Each process takes a contiguous chunk of the batch, so verdicts and signatures come back in
    corpus order and the result does not depend on the number of workers.
    """

    def __init__(self, filters: FilterSpec | None, dedup: DedupSpec) -> None:
        self.filters = filters
        self.near = dedup if dedup.near else None
        self.workers = dedup.workers
        self.pool = ProcessPoolExecutor(self.workers) if self.workers > 1 else None

    def submit(self, texts: list[str]) -> Callable[[], tuple[list[str | None], list | None]]:
        """Start the work on ``texts``; the returned function waits for ``(reasons, signatures)``.

        Submitting batch k+1 before absorbing batch k keeps the workers busy while the main
        process runs the LSH index, decontamination and writing.
        """
        if self.pool is None or len(texts) < 2 * self.workers:
            return lambda: self._join([_clean_and_sign((texts, self.filters, self.near))])
        size = -(-len(texts) // (self.workers * 4))
        futures = [self.pool.submit(_clean_and_sign, (texts[i:i + size], self.filters, self.near))
                   for i in range(0, len(texts), size)]
        return lambda: self._join([f.result() for f in futures])

    def _join(self, parts: list[tuple[list, list]]) -> tuple[list[str | None], list | None]:
        reasons = [r for part, _ in parts for r in part]
        signatures = [sig for _, part in parts for sig in part]
        return reasons, (signatures if self.near is not None else None)

    def __enter__(self) -> "CleanAndSign":
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def process_kind(kind: str, rows: Iterator[tuple[str, dict]], out_folder: Path, spec: ProcessSpec,
                 reports_folder: Path | None = None, progress: bool = False) -> dict:
    """Stream one kind's rows into shards under ``out_folder``; the report for the data card."""
    started = time.perf_counter()
    quality = QualityFilter(spec.filters) if spec.filters is not None and spec.filters.enabled else None
    hits: list[dict] = []
    removed_examples: list[dict] = []
    rows_in = 0
    bar = _progress(kind, progress)
    with CleanAndSign(quality.spec if quality is not None else None, spec.dedup) as work, \
            Deduplicator(spec.dedup) as dedup, ShardWriter(out_folder, spec.rows_per_shard) as writer:

        def absorb(batch: list, texts: list[str], reasons: list, signatures: list | None) -> None:
            if quality is not None:
                for text, reason in zip(texts, reasons):
                    quality.stats.add(reason, text)
            batch = [item for item, reason in zip(batch, reasons) if reason is None]
            verdicts = dedup.add([t for t, reason in zip(texts, reasons) if reason is None], signatures)
            for (where, row), (kept_text, reason) in zip(batch, verdicts):
                if reason is not None:
                    if len(removed_examples) < EXAMPLES:
                        removed_examples.append({"where": where, "reason": reason, "text": row_text(kind, row)[:120]})
                    continue
                if kind == "pretrain" and kept_text != row["text"]:
                    row = {**row, "text": kept_text}      # paragraph dedup removed repeated paragraphs
                match = spec.index.match(row_text(kind, row)) if spec.index is not None else None
                if match is not None:
                    suite, file, line = match
                    hits.append({"where": where, "suite": suite, "file": file, "row": line})
                    if spec.decontam_action == "remove":
                        continue
                writer.write(row)

        pending = None
        for batch in _batches(rows, BATCH):
            rows_in += len(batch)
            bar.update(len(batch))
            texts = [dedup_text(kind, r) for _, r in batch]
            started_work = work.submit(texts)
            if pending is not None:
                absorb(pending[0], pending[1], *pending[2]())
            pending = (batch, texts, started_work)
        if pending is not None:
            absorb(pending[0], pending[1], *pending[2]())
    bar.close()
    seconds = time.perf_counter() - started
    dedup_report = dedup.report.as_dict(spec.dedup, dedup.documents)
    dedup_report.update(num_perm=spec.dedup.num_perm, workers=spec.dedup.workers,
                        exact=spec.dedup.exact, near=spec.dedup.near, paragraphs=spec.dedup.paragraphs,
                        duplicate_rate_before=_rate(dedup.report.exact_removed + dedup.report.near_removed,
                                                    dedup.documents),
                        examples=removed_examples)
    if spec.verify and writer.paths:
        dedup_report["duplicate_rate_after"] = residual_duplicate_rate(kind, writer.paths, spec.dedup)
    if reports_folder is not None and hits:
        reports_folder.mkdir(parents=True, exist_ok=True)
        with (reports_folder / f"decontamination-{kind}.jsonl").open("w", encoding="utf-8") as handle:
            for hit in hits:
                handle.write(json.dumps(hit) + "\n")
    return {
        "rows_in": rows_in,
        "rows_out": writer.rows,
        "shards": [str(p.relative_to(out_folder.parent.parent)) for p in writer.paths],
        "filters": quality.stats.as_dict() if quality is not None else None,
        "dedup": dedup_report,
        "decontamination": {"hits": len(hits), "by_suite": dict(Counter(h["suite"] for h in hits)),
                            "action": spec.decontam_action, "examples": hits[:EXAMPLES]},
        "seconds": round(seconds, 2),
        "rows_per_s": round(rows_in / seconds, 1) if seconds > 0 else None,
    }


def residual_duplicate_rate(kind: str, paths: list[Path], spec: DedupSpec) -> float:
    """Share of output rows that are still exact or near duplicates of an earlier output row,
    measured with a fresh index and a different MinHash seed (an independent second look)."""
    check = DedupSpec(exact=True, near=spec.near, paragraphs=False, shingle_size=spec.shingle_size,
                      num_perm=spec.num_perm, bands=spec.bands, rows=spec.rows, seed=spec.seed + 1,
                      workers=spec.workers)
    total = 0
    with Deduplicator(check) as dedup:
        for batch in _batches(read_files(paths), BATCH):
            total += len(batch)
            dedup.add([dedup_text(kind, r) for _, r in batch])
        found = dedup.report.exact_removed + dedup.report.near_removed
    return _rate(found, total)


def _rate(part: int, whole: int) -> float:
    return round(part / whole, 5) if whole else 0.0


def _progress(kind: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(desc=f"data {kind}", unit=" rows", disable=not enabled, mininterval=2.0)
