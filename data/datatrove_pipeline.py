"""The data stage on datatrove's executors: the same passes as a pipeline of datatrove steps.

    smolforge data prepare recipes/demo/data.yaml --set executor=local --set tasks=2 --set workers=2
    smolforge data prepare recipes/demo/data.yaml --set executor=slurm --set tasks=8 --set slurm.partition=cpu

``executor: inline`` (the default) is :mod:`smolforge.data.prepare`'s one process pool. With
``local`` or ``slurm`` the main process reads and validates every source row (bad rows, source
labels) and splits each kind into ``tasks`` contiguous parts; then four datatrove stages run,
each on datatrove's ``LocalPipelineExecutor`` (``workers`` processes) or as a Slurm array job
(``SlurmPipelineExecutor``) that depends on the stage before it:

1. ``filter`` (``tasks`` tasks): read a part → datatrove's ``GopherQualityFilter``, smolforge's
   garbage rule, datatrove's ``GopherRepetitionFilter`` (paragraph and line rules), ``C4QualityFilter``
   / ``FineWebQualityFilter`` when ``filters.c4`` / ``filters.fineweb``, smolforge's n-gram
   repetition and language rules (datatrove's n-gram rules measure differently, see
   :data:`RULE_CHANGES`); pretraining text only → write the part → ``MinhashDedupSignature``;
2. ``buckets`` (up to ``tasks`` tasks, each taking every ``tasks``-th LSH band): ``MinhashDedupBuckets``;
3. ``cluster`` (1 task): :class:`FirstKept` (the inline rule: a document sharing a band with an earlier
   kept one goes), or datatrove's ``MinhashDedupCluster`` with ``dedup.clusters: connected``;
4. ``dedup`` (``tasks`` tasks): ``MinhashDedupFilter`` → decontamination (smolforge's eval
   n-gram index) → write the kept rows.

The main process then writes ``data/<kind>/part-*.jsonl`` in corpus order, and the tokenizer,
packed rows and data card are made exactly as on the inline path. Removals are counted from
datatrove's own per-task stats (filters) and from the rows each step excluded (dedup,
decontamination); ``reports/removed-<kind>.jsonl`` lists every removed row with its rule.

**Dedup with datatrove's MinHash.** Word 5-shingles of :func:`smolforge.data.dedup.normalise`\\d
text (the same shingles as the inline path: a whitespace word tokenizer, so no spaCy), hashed by
datatrove (xxhash64, its own permutations) into ``dedup.bands`` buckets of ``dedup.rows`` hashes.
Exact duplicates fall out of the same pass (identical text, identical signatures); a document
shorter than one shingle is one shingle of its whole text, as inline. Kinds other than pretraining
text get exact dedup only: their one shingle is the kind plus the whole normalised text (and a feedback
row's label: the same answer marked good and marked bad keeps both rows). A removed
row counts as ``exact`` when its normalised text equals that of a row that stayed, else ``near``.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from datatrove.executor import LocalPipelineExecutor, SlurmPipelineExecutor
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                              MinhashDedupFilter, MinhashDedupSignature)
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.filters.c4_filters import C4QualityFilter
from datatrove.pipeline.filters.fineweb_quality_filter import FineWebQualityFilter
from datatrove.pipeline.filters.gopher_quality_filter import GopherQualityFilter
from datatrove.pipeline.filters.gopher_repetition_filter import GopherRepetitionFilter
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter
from datatrove.utils.hashing import HashConfig
from datatrove.utils.word_tokenizers import WordTokenizer

from smolforge.errors import RunError
from smolforge.runs import RunLayout

from .dedup import DedupSpec, detection_curve, normalise
from .filters import STOP_WORDS, FilterSpec, check

EXAMPLES = 20
BUFFER = 4096       # records per read of the signature and pair files (datatrove's default, 5, reads 220 bytes at a time)
STAGES = ("filter", "buckets", "cluster", "dedup")

# datatrove's drop reasons → the inline rule of the same intent (the card counts by these names)
REASONS = {
    "gopher_short_doc": "min_words", "gopher_long_doc": "max_words",
    "gopher_below_avg_threshold": "min_mean_word_length", "gopher_above_avg_threshold": "max_mean_word_length",
    "gopher_too_many_hashes": "symbol_word_ratio", "gopher_too_many_ellipsis": "symbol_word_ratio",
    "gopher_too_many_bullets": "bullet_lines", "gopher_too_many_end_ellipsis": "ellipsis_lines",
    "gopher_below_alpha_threshold": "alpha_words", "gopher_enough_stop_words": "stop_words",
    "dup_para_frac": "dup_para_frac", "dup_para_char_frac": "dup_para_char_frac",
    "dup_line_frac": "dup_line_frac", "dup_line_char_frac": "dup_line_char_frac", "empty": "min_words",
}

# How datatrove's version of a rule differs from the inline one (data card: "rule_changes").
RULE_CHANGES = {
    "min_words": "datatrove counts words that hold a non-punctuation character; inline counts every whitespace word",
    "max_words": "datatrove counts words that hold a non-punctuation character; inline counts every whitespace word",
    "min_mean_word_length": "datatrove averages over words with a non-punctuation character only",
    "max_mean_word_length": "datatrove averages over words with a non-punctuation character only",
    "bullet_lines": "datatrove counts only lines starting with '•' or '-' and counts blank lines; inline knows 14 bullets and skips blank lines",
    "ellipsis_lines": "datatrove counts blank lines in the denominator; inline skips them",
    "alpha_words": "datatrove needs a letter in the word (isalpha); inline treats digits-and-symbols-only words as non-alphabetic",
    "stop_words": "datatrove counts distinct stop words, case- and punctuation-sensitive; inline counts occurrences of the case-folded, stripped word",
    "dup_para_frac": "datatrove splits paragraphs on 2+ newlines exactly; inline also on lines of spaces",
    "dup_para_char_frac": "datatrove divides by all characters of the text; inline by those of the stripped paragraphs",
    "dup_line_frac": "datatrove keeps whitespace-only lines as lines; inline drops them",
    "dup_line_char_frac": "datatrove divides by all characters of the text; inline by those of the stripped lines",
    "near": "MinHash from datatrove (xxhash64, its permutations) instead of datasketch's: pairs near the banding threshold can fall either way",
    "near_connected": "dedup.clusters: connected: datatrove's MinhashDedupCluster keeps one row per connected group (A~B, B~C drops C even when A and C share no band); inline drops only rows sharing a band with a kept row",
    "exact": "exact copies are found by the same MinHash pass (identical signatures); a removed row counts as exact when an earlier row has the same normalised text",
}


# ---------------------------------------------------------------------------- small datatrove pieces


class WhitespaceTokenizer(WordTokenizer):
    """Words are whitespace-separated; sentences end with . ! or ? (datatrove's default needs spaCy)."""

    _SENTENCE = re.compile(r"[^.!?]+(?:[.!?]+|$)")

    def __init__(self) -> None:
        super().__init__("whitespace")

    def word_tokenize(self, text: str) -> list[str]:
        return text.split()

    def sent_tokenize(self, text: str) -> list[str]:
        return [s.strip() for s in self._SENTENCE.findall(text) if s.strip()]

    def span_tokenize(self, text: str) -> list[tuple[int, int]]:
        return [(m.start(), m.end()) for m in self._SENTENCE.finditer(text) if m.group().strip()]


class _PretrainOnly:
    """Quality filters look at pretraining text only; rows of other kinds pass through."""

    def filter(self, doc):
        if doc.metadata.get("kind") != "pretrain":
            return True
        return super().filter(doc)


class GopherQuality(_PretrainOnly, GopherQualityFilter):
    pass


class GopherRepetition(_PretrainOnly, GopherRepetitionFilter):
    pass


class C4Quality(_PretrainOnly, C4QualityFilter):
    pass


class FineWebQuality(_PretrainOnly, FineWebQualityFilter):
    pass


class SmolforgeRules(_PretrainOnly, BaseFilter):
    """Inline rules datatrove has no matching block for (garbage characters, n-gram repetition, language)."""

    name = "smolforge rules"

    def __init__(self, spec: FilterSpec, exclusion_writer=None) -> None:
        super().__init__(exclusion_writer)
        self.spec = spec

    def filter(self, doc):
        if doc.metadata.get("kind") != "pretrain":
            return True
        reason = check(doc.text, self.spec)
        return True if reason is None else (False, reason)


_MERSENNE = np.uint64((1 << 61) - 1)
_SHIFT = np.uint64(61)


class Signature(MinhashDedupSignature):
    """datatrove's MinHash signatures over smolforge's shingles (see the module docstring)."""

    def __init__(self, output_folder: str, config: MinhashConfig, modes: dict[str, str]) -> None:
        super().__init__(output_folder, config=config, language=WhitespaceTokenizer())
        self.modes = modes             # kind -> "near" (shingles) | "exact" (one shingle); absent: not deduplicated
        self._kind = self._doc = None

    def get_shingles(self, text: str) -> np.ndarray:
        mode = self.modes.get(self._kind)
        if mode is None:
            return np.empty((0, 1), dtype=np.uint64)
        doc = self._doc
        cached = doc.metadata.pop("_words", None) if doc is not None and doc.text is text else None
        words = (cached if cached is not None else normalise(text)).split()
        n = self.config.n_grams
        if mode == "exact" or len(words) <= n:
            grams = [f"{self._kind}\x00{' '.join(words)}"]
        else:
            grams = [" ".join(words[i:i + n]) for i in range(len(words) - n + 1)]
        return np.fromiter(map(self._hash_func, grams), dtype=np.uint64, count=len(grams)).reshape((-1, 1))

    def get_signature(self, shingles: np.ndarray) -> list[list[int]]:
        """datatrove's signature bit for bit, its ``% (2**61 - 1)`` done without a division: with
        2**61 = 1 (mod p), y mod p is (y & p) + (y >> 61), less p once if that reaches p
        (``np.minimum(r, r - p)``: r - p wraps above r when r < p). 20-25 % faster (measured)."""
        if self.config.hash_config.precision != 64:
            return super().get_signature(shingles)
        a, b = self.parameters
        phv = shingles * a
        phv += b
        r = phv & _MERSENNE
        phv >>= _SHIFT
        r += phv
        np.minimum(r, r - _MERSENNE, out=r)
        return [x.tolist() for x in np.split(np.min(r, axis=0), self.config.num_buckets)]

    def run(self, data, rank: int = 0, world_size: int = 1):
        def tracked():
            for doc in data:
                self._kind, self._doc = doc.metadata.get("kind"), doc
                yield doc

        return super().run(tracked(), rank, world_size)


class Buckets(MinhashDedupBuckets):
    """``MinhashDedupBuckets`` with any number of tasks: task r takes bands r, r + tasks, ..."""

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        for bucket in range(rank, self.config.num_buckets, world_size):
            super().run(None, bucket, self.config.num_buckets)


class FirstKept(PipelineStep):
    """MinHash stage 3 with the inline rule: in corpus order, a document that shares an LSH band with
    an earlier *kept* document is removed; the first of each group stays.

    Reads the ``.dups`` files of ``MinhashDedupBuckets`` (one per band: consecutive documents with
    equal band signatures, so each run of pairs is one group of documents sharing that band) and
    writes the ``<task>.remove`` files ``MinhashDedupFilter`` reads, in datatrove's format. That is
    what datasketch's LSH query against the kept documents does inline. datatrove's own
    ``MinhashDedupCluster`` (``dedup.clusters: connected``) keeps one document per connected
    component instead: A~B and B~C drop C even when A and C share nothing, which on templated
    text removes far more (demo corpus, 6,000 documents: 3,637 kept; with this step 4,210; inline 4,233).
    """

    name = "🎯 MinHash stage 3 (first kept)"
    type = "🫂 - DEDUP"

    def __init__(self, input_folder: str, output_folder: str, lines_to_buffer: int = BUFFER) -> None:
        super().__init__()
        self.input_folder, self.output_folder, self.lines_to_buffer = input_folder, output_folder, lines_to_buffer

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        from datatrove.utils.binaryio import read_tuples_from_file

        groups_of: dict[tuple[int, int], list[int]] = {}     # document -> the groups (band runs) it is in
        group = -1
        with self.track_time():
            for path in sorted(Path(self.input_folder).glob("*.dups")):
                last = None
                with path.open("rb") as handle:
                    for f1, d1, f2, d2 in read_tuples_from_file(handle, "4I", lines_to_buffer=self.lines_to_buffer):
                        if (f1, d1) != last:            # a new run of equal signatures in this band
                            group += 1
                            groups_of.setdefault((f1, d1), []).append(group)
                        groups_of.setdefault((f2, d2), []).append(group)
                        last = (f2, d2)
            kept_in: set[int] = set()
            removed: dict[int, list[int]] = {}
            for doc in sorted(groups_of):               # (task, index): corpus order
                groups = groups_of[doc]
                if any(g in kept_in for g in groups):
                    removed.setdefault(doc[0], []).append(doc[1])
                    self.stat_update("to_remove")
                else:
                    kept_in.update(groups)
                self.stat_update("duplicates")
            out = Path(self.output_folder)
            out.mkdir(parents=True, exist_ok=True)
            for task, docs in removed.items():
                (out / f"{task:06d}.remove").write_bytes(np.array(docs, dtype="<u4").tobytes())


class Digest(PipelineStep):
    """Tags each row with a hash of its normalised text (to tell exact from near duplicates later); a
    feedback row's label is part of it (:func:`smolforge.data.prepare.dedup_text`), as inline."""

    name = "digest"
    type = "smolforge"

    def run(self, data, rank: int = 0, world_size: int = 1):
        from .prepare import dedup_text

        for doc in data:
            kind = doc.metadata.get("kind")
            words = normalise(dedup_text(kind, doc.metadata["row"]) if kind == "feedback" else doc.text)
            doc.metadata["digest"] = hashlib.blake2b(words.encode(), digest_size=8).hexdigest()
            doc.metadata["_words"] = words  # not written (see _kept_adapter); Signature shingles these
            yield doc


class Decontaminate(PipelineStep):
    """Rows holding an eval item (smolforge's n-gram index) are removed (or flagged); hits are listed."""

    name = "decontaminate"
    type = "smolforge"

    def __init__(self, index, action: str, hits_folder: str) -> None:
        super().__init__()
        self.index, self.action, self.hits_folder = index, action, hits_folder

    def run(self, data, rank: int = 0, world_size: int = 1):
        path = Path(self.hits_folder) / f"{rank:05d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as hits:
            for doc in data:
                match = self.index.match(doc.text) if self.index is not None else None
                if match is not None:
                    suite, file, line = match
                    self.stat_update("hits")
                    hits.write(json.dumps({"kind": doc.metadata["kind"], "where": doc.metadata["where"],
                                           "suite": suite, "file": file, "row": line,
                                           "digest": doc.metadata.get("digest")}) + "\n")
                    if self.action == "remove":
                        continue
                yield doc


class RankReader(JsonlReader):
    """Reads exactly ``<rank>.jsonl`` (a task that wrote nothing has no file, and reads nothing)."""

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        name = f"{rank:05d}.jsonl"
        if self.data_folder.isfile(name):
            yield from self.read_files_shard([name])


def _removed_adapter(self, document) -> dict:
    m = document.metadata
    return {"kind": m["kind"], "where": m["where"], "rule": m.get("filter_reason", "minhash"),
            "digest": m.get("digest"), "text": document.text[:120]}


def _kept_adapter(self, document) -> dict:
    meta = document.metadata
    if "_words" in meta:
        meta = {k: v for k, v in meta.items() if k != "_words"}
    return {"text": document.text, "id": document.id, "metadata": meta}


# ---------------------------------------------------------------------------- settings and stages


@dataclass
class Settings:
    """What the datatrove path needs from the recipe (the stage builds it)."""

    executor: str = "local"                 # local | slurm
    tasks: int = 1
    workers: int = 1
    filters: FilterSpec | None = field(default_factory=FilterSpec)
    dedup: DedupSpec = field(default_factory=DedupSpec)
    index: object = None                    # EvalIndex or None
    decontam_action: str = "remove"
    job_name: str = "smolforge-data"
    partition: str = "debug"
    time: str = "01:00:00"
    venv: str | None = None
    cpus_per_task: int = 1
    mem_per_cpu_gb: int = 2


def default_venv() -> str | None:
    """The activate script of the running interpreter's virtualenv (None outside one)."""
    if sys.prefix == sys.base_prefix:
        return None
    activate = Path(sys.prefix) / "bin" / "activate"
    return str(activate) if activate.is_file() else None


def quality_steps(spec: FilterSpec | None, removed: str) -> list:
    """datatrove's quality filters configured like ``spec``, then smolforge's remaining rules."""
    if spec is None or not spec.enabled:
        return []
    words = WhitespaceTokenizer()

    def excluded(name: str) -> JsonlWriter:
        return JsonlWriter(f"{removed}/{name}", compression=None, adapter=_removed_adapter)

    off = dict.fromkeys(("min_words", "max_words", "min_mean_word_length", "max_mean_word_length",
                         "max_symbol_word_ratio", "max_bullet_lines", "max_ellipsis_lines", "min_alpha_words",
                         "min_stop_words", "max_garbage_chars", "max_dup_para_frac", "max_dup_para_char_frac",
                         "max_dup_line_frac", "max_dup_line_char_frac", "top_ngram_char_frac",
                         "dup_ngram_char_frac", "language"))
    garbage = FilterSpec(**{**off, "max_garbage_chars": spec.max_garbage_chars})
    ngrams = FilterSpec(**{**off, "top_ngram_char_frac": spec.top_ngram_char_frac,
                           "dup_ngram_char_frac": spec.dup_ngram_char_frac, "language": spec.language,
                           "min_language_score": spec.min_language_score})
    # the inline order, so each removal is credited to the same rule: Gopher quality, garbage,
    # duplicate paragraphs/lines, n-gram repetition, language
    steps = [GopherQuality(min_doc_words=spec.min_words, max_doc_words=spec.max_words,
                           min_avg_word_length=spec.min_mean_word_length,
                           max_avg_word_length=spec.max_mean_word_length,
                           max_symbol_word_ratio=spec.max_symbol_word_ratio,
                           max_bullet_lines_ratio=spec.max_bullet_lines,
                           max_ellipsis_lines_ratio=spec.max_ellipsis_lines,
                           max_non_alpha_words_ratio=spec.min_alpha_words,
                           min_stop_words=spec.min_stop_words, stop_words=sorted(STOP_WORDS),
                           language=words, exclusion_writer=excluded("gopher_quality"))]
    if garbage.max_garbage_chars is not None:
        steps.append(SmolforgeRules(garbage, exclusion_writer=excluded("garbage")))
    # datatrove's n-gram rules are not the inline ones (a top n-gram seen once scores its full
    # length, so every short text fails top_2gram; duplicated n-grams count the later copies only):
    # those stay smolforge's (below); GopherRepetitionFilter does the paragraph and line rules
    steps.append(GopherRepetition(dup_line_frac=spec.max_dup_line_frac, dup_para_frac=spec.max_dup_para_frac,
                                  dup_line_char_frac=spec.max_dup_line_char_frac,
                                  dup_para_char_frac=spec.max_dup_para_char_frac, top_n_grams=(), dup_n_grams=(),
                                  language=words, exclusion_writer=excluded("gopher_repetition")))
    if getattr(spec, "c4", False):
        steps.append(C4Quality(language=words, exclusion_writer=excluded("c4")))
    if getattr(spec, "fineweb", False):
        steps.append(FineWebQuality(language=words, exclusion_writer=excluded("fineweb")))
    if ngrams.top_ngram_char_frac or ngrams.dup_ngram_char_frac or ngrams.language is not None:
        steps.append(SmolforgeRules(ngrams, exclusion_writer=excluded("ngrams_language")))
    return steps


def dedup_modes(dedup: DedupSpec, kinds) -> dict[str, str]:
    """Per kind: near (pretraining text with ``dedup.near``), exact, or absent (no dedup)."""
    modes = {}
    for kind in kinds:
        if kind == "pretrain" and dedup.near:
            modes[kind] = "near"
        elif dedup.exact:
            modes[kind] = "exact"
    return modes


def build_stages(settings: Settings, work: Path, logs: Path, kinds) -> list:
    """The four executors, each depending on the one before (run the last one to run them all)."""
    config = MinhashConfig(n_grams=settings.dedup.shingle_size, num_buckets=settings.dedup.bands,
                           hashes_per_bucket=settings.dedup.rows, seed=settings.dedup.seed,
                           hash_config=HashConfig(precision=64, hash_fc="xxhash"))
    w = {name: str(work / name) for name in ("input", "filtered", "signatures", "buckets", "clusters",
                                             "removed", "kept", "hits")}
    pipelines = {
        "filter": [RankReader(w["input"], add_file_path=False), *quality_steps(settings.filters, w["removed"] + "/filters"),
                   Digest(), JsonlWriter(w["filtered"], compression=None, adapter=_kept_adapter),
                   Signature(w["signatures"], config, dedup_modes(settings.dedup, kinds))],
        "buckets": [Buckets(w["signatures"], w["buckets"], config=config, lines_to_buffer=BUFFER)],
        "cluster": [MinhashDedupCluster(w["buckets"], w["clusters"], config=config, lines_to_buffer=BUFFER)
                    if settings.dedup.clusters == "connected" else FirstKept(w["buckets"], w["clusters"])],
        "dedup": [RankReader(w["filtered"], add_file_path=False),
                  MinhashDedupFilter(w["clusters"], lines_to_buffer=BUFFER, exclusion_writer=JsonlWriter(
                      w["removed"] + "/minhash", compression=None, adapter=_removed_adapter)),
                  Decontaminate(settings.index, settings.decontam_action, w["hits"]),
                  JsonlWriter(w["kept"], compression=None, adapter=_kept_adapter)],
    }
    tasks = {"filter": settings.tasks, "buckets": min(settings.tasks, settings.dedup.bands), "cluster": 1,
             "dedup": settings.tasks}
    executors, previous = [], None
    for name in STAGES:
        if settings.executor == "slurm":
            ex = SlurmPipelineExecutor(
                pipelines[name], tasks=tasks[name], time=settings.time, partition=settings.partition,
                cpus_per_task=settings.cpus_per_task, mem_per_cpu_gb=settings.mem_per_cpu_gb,
                workers=settings.workers, job_name=f"{settings.job_name}-{name}",
                venv_path=settings.venv or default_venv(), logging_dir=str(logs / name), depends=previous,
                qos=None, requeue=False, mail_type="NONE", skip_completed=False)
        else:
            ex = LocalPipelineExecutor(pipelines[name], tasks=tasks[name],
                                       workers=max(1, min(settings.workers, tasks[name])),
                                       logging_dir=str(logs / name), depends=previous, skip_completed=False)
        executors.append(ex)
        previous = ex
    return executors


# ---------------------------------------------------------------------------- running


def run_stages(executors: list, settings: Settings, logs: Path, poll: float = 0.5) -> dict:
    """Run the stages to completion; what ran (and the Slurm job ids) for the data card."""
    started = time.perf_counter()
    if settings.executor == "slurm":
        executors[-1].run()                      # submits every stage, each depending on the one before
        jobs = {name: ex.job_id for name, ex in zip(STAGES, executors)}
        wait_for_slurm(executors, logs, settings.job_name, poll)
        timings = None
    else:
        timings = {}
        for name, ex in zip(STAGES, executors):  # in order: each finds the one it depends on done
            begun = time.perf_counter()
            ex.run()
            timings[name] = round(time.perf_counter() - begun, 2)
        jobs = None
    info = {"stages": {name: ex.world_size for name, ex in zip(STAGES, executors)},
            "seconds": round(time.perf_counter() - started, 2)}
    if timings:
        info["stage_seconds"] = timings
    if jobs:
        info["slurm_jobs"] = jobs
    return info


def _squeue(names: list[str]) -> list[tuple[str, str, str, str]]:
    out = subprocess.run(["squeue", "-h", "-o", "%i|%j|%T|%r", "--name", ",".join(names)],
                         capture_output=True, text=True, check=True).stdout
    return [tuple(line.split("|", 3)) for line in out.splitlines() if line.strip()]


def wait_for_slurm(executors: list, logs: Path, job_name: str, poll: float = 0.5) -> None:
    """Wait until every job of the run has left the queue; RunError when a stage did not complete."""
    names = [f"{job_name}-{name}" for name in STAGES]
    ids = [str(ex.job_id) for ex in executors if ex.job_id not in (None, -1)]
    while True:
        queued = _squeue(names)
        stuck = [q for q in queued if q[2] == "PENDING" and "DependencyNeverSatisfied" in q[3]]
        if stuck:
            subprocess.run(["scancel", *ids], capture_output=True)
            break
        if not queued:
            break
        time.sleep(poll)
    for name, ex in zip(STAGES, executors):
        done = len(list((logs / name / "completions").glob("*"))) if (logs / name / "completions").is_dir() else 0
        if done < ex.world_size:
            raise RunError(f"datatrove stage '{name}' (Slurm job {ex.job_id}) completed {done} of "
                           f"{ex.world_size} tasks; see {logs / name / 'slurm_logs'} and {logs / name / 'logs'}")


# ---------------------------------------------------------------------------- input and output


def write_inputs(rows_by_kind, work: Path, tasks: int) -> dict[str, int]:
    """Spool each kind's ``(where, row)`` pairs, then split every kind into ``tasks`` contiguous
    parts: ``input/<rank>.jsonl`` holds part ``rank`` of each kind, kinds in order."""
    import orjson

    from .prepare import row_text

    spool = work / "spool"
    spool.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for kind, rows in rows_by_kind:
        n = 0
        with (spool / f"{kind}.jsonl").open("wb") as handle:
            for where, row in rows:
                text = row_text(kind, row)
                if kind == "pretrain" and text:
                    row = {**row, "text": None}          # the text travels once, as the document's text
                handle.write(orjson.dumps({"text": text or " ", "id": f"{kind}-{n}", "kind": kind,
                                           "where": where, "row": row},
                                          default=str,    # as ShardWriter: json.dumps(default=str)
                                          option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_PASSTHROUGH_DATETIME))
                n += 1
        counts[kind] = n
    folder = work / "input"
    folder.mkdir(parents=True, exist_ok=True)
    outs = [(folder / f"{rank:05d}.jsonl").open("wb") for rank in range(tasks)]
    try:
        for kind, n in counts.items():
            with (spool / f"{kind}.jsonl").open("rb") as handle:
                for i, line in enumerate(handle):
                    outs[i * tasks // n].write(line)
    finally:
        for out in outs:
            out.close()
    shutil.rmtree(spool)
    return counts


def read_kept(work: Path, tasks: int):
    """``(kind, row, digest)`` of every kept row, kind by kind... in corpus order within a kind."""
    import orjson

    for rank in range(tasks):
        path = work / "kept" / f"{rank:05d}.jsonl"
        if not path.is_file():
            continue
        with path.open("rb") as handle:
            for line in handle:
                doc = orjson.loads(line)
                meta = doc["metadata"]
                row = meta["row"]
                if meta["kind"] == "pretrain" and row.get("text", "") is None:
                    row["text"] = doc["text"]
                yield meta["kind"], row, meta.get("digest")


def _jsonl_rows(folder: Path):
    import orjson

    if not folder.is_dir():
        return
    for path in sorted(folder.rglob("*.jsonl")):
        with path.open("rb") as handle:
            for line in handle:
                yield orjson.loads(line)


def stats_of(logs: Path, stage: str) -> dict[str, int]:
    """datatrove's per-task stats of a stage, summed over tasks and steps: ``{stat: total}``."""
    totals: Counter = Counter()
    for path in sorted((logs / stage / "stats").glob("*.json")):
        for step in json.loads(path.read_text()):
            for key, value in (step.get("stats") or {}).items():
                total = value.get("total") if isinstance(value, dict) else value
                if isinstance(total, (int, float)):
                    totals[f"{step['name']}/{key}"] += total
    return dict(totals)


def filter_removals(logs: Path) -> dict[str, dict[str, int]]:
    """``{"removed": {inline rule: n}, "datatrove": {reason: n}}`` from the filter stage's stats."""
    raw: Counter = Counter()
    for key, total in stats_of(logs, "filter").items():
        step, stat = key.split("/", 1)
        if stat.startswith("dropped_"):
            raw[stat[len("dropped_"):]] += int(total)
    removed: Counter = Counter()
    for reason, n in raw.items():
        removed[rule_name(reason)] += n
    return {"removed": dict(sorted(removed.items())), "datatrove": dict(sorted(raw.items()))}


def rule_name(reason: str) -> str:
    """datatrove's drop reason as the inline rule name (``top_2_gram`` → ``top_2gram_char_frac``)."""
    if reason in REASONS:
        return REASONS[reason]
    m = re.fullmatch(r"top_(\d+)_gram", reason)
    if m:
        return f"top_{m.group(1)}gram_char_frac"
    m = re.fullmatch(r"duplicated_(\d+)_n_grams", reason)
    if m:
        return f"dup_{m.group(1)}gram_char_frac"
    return reason


def rule_changes(filters: FilterSpec | None, dedup: DedupSpec) -> dict[str, str]:
    """The enabled rules whose datatrove version differs from the inline one, and how."""
    out = {}
    if filters is not None and filters.enabled:
        for rule, attr in (("min_words", "min_words"), ("max_words", "max_words"),
                           ("min_mean_word_length", "min_mean_word_length"),
                           ("max_mean_word_length", "max_mean_word_length"),
                           ("bullet_lines", "max_bullet_lines"), ("ellipsis_lines", "max_ellipsis_lines"),
                           ("alpha_words", "min_alpha_words"), ("stop_words", "min_stop_words"),
                           ("dup_para_frac", "max_dup_para_frac"), ("dup_para_char_frac", "max_dup_para_char_frac"),
                           ("dup_line_frac", "max_dup_line_frac"), ("dup_line_char_frac", "max_dup_line_char_frac")):
            if getattr(filters, attr) is not None:
                out[rule] = RULE_CHANGES[rule]
        if getattr(filters, "c4", False):
            out["c4"] = "datatrove's C4QualityFilter (no inline equivalent)"
        if getattr(filters, "fineweb", False):
            out["fineweb"] = "datatrove's FineWebQualityFilter (no inline equivalent)"
    if dedup.near:
        out["near"] = RULE_CHANGES["near"]
        if dedup.clusters == "connected":
            out["near"] += "; " + RULE_CHANGES["near_connected"]
    if dedup.exact:
        out["exact"] = RULE_CHANGES["exact"]
    return out


# ---------------------------------------------------------------------------- the whole pass


def process(rows_by_kind, run_path: Path, settings: Settings, logging_dir: str = "datatrove/logs",
            rows_per_shard: int = 50_000, verify: bool = True) -> tuple[dict[str, dict], dict]:
    """Rows of every kind → ``data/<kind>/`` shards through datatrove; per-kind reports and executor info.

    ``rows_by_kind`` yields ``(kind, iterator of (where, row))`` in kind order. Returns reports
    shaped like :func:`smolforge.data.prepare.process_kind`'s (without ``sources``/``bad_rows``).
    """
    from .prepare import residual_duplicate_rate
    from .shards import ShardWriter

    started = time.perf_counter()
    work = RunLayout(run_path).datatrove_dir / "work"
    logs = run_path / logging_dir
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(logs, ignore_errors=True)
    work.mkdir(parents=True)
    logs.mkdir(parents=True, exist_ok=True)
    counts = write_inputs(rows_by_kind, work, settings.tasks)
    kinds = list(counts)
    executors = build_stages(settings, work, logs, kinds)
    info = run_stages(executors, settings, logs)

    # what stayed, in corpus order per kind
    writers = {kind: ShardWriter(RunLayout(run_path).data_shard_dir(kind), rows_per_shard) for kind in kinds}
    kept_digests: dict[str, set] = {kind: set() for kind in kinds}
    for writer in writers.values():
        writer.__enter__()
    try:
        for kind, row, digest in read_kept(work, settings.tasks):
            writers[kind].write(row)
            kept_digests[kind].add(digest)
    finally:
        for writer in writers.values():
            writer.__exit__(None, None, None)

    # what went, and why
    removed_rows = {kind: [] for kind in kinds}
    filter_examples: dict[str, list[str]] = {}
    for item in _jsonl_rows(work / "removed" / "filters"):
        rule = rule_name(item["rule"])
        removed_rows[item["kind"]].append({"where": item["where"], "rule": rule})
        snippets = filter_examples.setdefault(rule, [])
        if len(snippets) < 3:
            snippets.append(item["text"])
    hits = {kind: [] for kind in kinds}
    for item in _jsonl_rows(work / "hits"):
        hits[item["kind"]].append({k: item[k] for k in ("where", "suite", "file", "row")})
        kept_digests[item["kind"]].add(item["digest"])       # a copy of it was a duplicate of a row that stayed dedup
    dedup_removed = {kind: Counter() for kind in kinds}
    dedup_examples = {kind: [] for kind in kinds}
    for item in _jsonl_rows(work / "removed" / "minhash"):
        kind = item["kind"]
        # exact: the normalised text of an earlier row (removed files are read in corpus order)
        rule = "exact" if item["digest"] in kept_digests[kind] else "near"
        kept_digests[kind].add(item["digest"])
        dedup_removed[kind][rule] += 1
        removed_rows[kind].append({"where": item["where"], "rule": rule})
        if len(dedup_examples[kind]) < EXAMPLES:
            dedup_examples[kind].append({"where": item["where"], "reason": rule, "text": item["text"]})
    for kind in kinds:
        if settings.decontam_action == "remove":
            removed_rows[kind] += [{"where": h["where"], "rule": "decontamination"} for h in hits[kind]]

    filters = filter_removals(logs) if settings.filters is not None and settings.filters.enabled else None
    cluster_stats = stats_of(logs, "cluster")
    seconds = time.perf_counter() - started
    total_rows = sum(counts.values())
    modes = dedup_modes(settings.dedup, kinds)
    half, most = detection_curve(settings.dedup.bands, settings.dedup.rows)
    reports = {}
    for kind in kinds:
        rows_in = counts[kind]
        filtered_out = sum(filters["removed"].values()) if (filters and kind == "pretrain") else 0
        documents = rows_in - filtered_out
        exact, near = dedup_removed[kind]["exact"], dedup_removed[kind]["near"]
        dedup_report = {
            "documents": documents, "kept": documents - exact - near, "exact_removed": exact,
            "near_removed": near, "paragraphs_removed": 0,
            "near_duplicate_clusters": (max(0, sum(int(v) for k, v in cluster_stats.items() if k.endswith("/duplicates"))
                                            - sum(int(v) for k, v in cluster_stats.items() if k.endswith("/to_remove")))
                                        if kind == "pretrain" else None),   # all kinds together
            "detection_50": round(half, 3), "detection_95": round(most, 3),
            "shingle_size": settings.dedup.shingle_size, "bands": settings.dedup.bands,
            "rows": settings.dedup.rows, "num_perm": settings.dedup.bands * settings.dedup.rows,
            "workers": settings.workers, "exact": kind in modes, "near": modes.get(kind) == "near",
            "paragraphs": False,
            "duplicate_rate_before": round((exact + near) / documents, 5) if documents else 0.0,
            "examples": dedup_examples[kind],
        }
        paths = writers[kind].paths
        if verify and paths:
            check = DedupSpec(exact=True, near=modes.get(kind) == "near", paragraphs=False,
                              shingle_size=settings.dedup.shingle_size, num_perm=settings.dedup.num_perm,
                              bands=settings.dedup.bands, rows=settings.dedup.rows, seed=settings.dedup.seed,
                              workers=max(1, settings.workers))
            dedup_report["duplicate_rate_after"] = residual_duplicate_rate(kind, paths, check)
        report = {
            "rows_in": rows_in, "rows_out": writers[kind].rows,
            "shards": [str(p.relative_to(run_path)) for p in paths],
            "filters": ({"documents": rows_in, "kept": documents, "removed": filters["removed"],
                         "datatrove_reasons": filters["datatrove"], "examples": filter_examples}
                        if filters is not None and kind == "pretrain" else None),
            "dedup": dedup_report,
            "decontamination": {"hits": len(hits[kind]), "by_suite": dict(Counter(h["suite"] for h in hits[kind])),
                                "action": settings.decontam_action, "examples": hits[kind][:EXAMPLES]},
            "seconds": round(seconds, 2),
            "rows_per_s": round(total_rows / seconds, 1) if seconds > 0 else None,
            "removed": removed_rows[kind],     # the stage writes these two to reports/ and drops them
            "hit_list": hits[kind],
        }
        reports[kind] = report
    shutil.rmtree(work, ignore_errors=True)
    info.update(executor=settings.executor, tasks=settings.tasks, workers=settings.workers,
                logging_dir=logging_dir, engine=f"datatrove {_version()}")
    return reports, info


def _version() -> str:
    from importlib.metadata import version

    return version("datatrove")
