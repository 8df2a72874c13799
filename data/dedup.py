"""Deduplication: exact (normalised hash), near-duplicate (MinHash-LSH), and paragraph-level.

datasketch does the MinHash and the LSH index, in-process with a worker pool for hashing.
datatrove's 4-stage pipeline was measured at the same recall and about the same speed, with
more moving parts (spaCy tokenizer, xxhash<4, re-imported workers); see STACK.md.

**Units.** The playbook says "over 90 % similar is a duplicate", but that is not a 0.9 Jaccard
threshold on word 5-shingles. Editing 2–5 % of a document's words already drops its 5-shingle
Jaccard to 0.57–0.82 (median 0.73, measured on 100k docs), and at a 0.8 threshold LSH recall was
0.22. The default banding, 25 bands × 5 rows of 128 permutations, catches a pair with Jaccard J
with probability 1 - (1 - J^5)^25. That is 50 % at J ≈ 0.49 and 95 % at J ≈ 0.65 (see
:func:`detection_curve`), which catches such edits. Distinct documents of the same template sit
far below: measured Jaccard < 0.2, and 0 false removals on the test corpus.

    >>> docs = ["the cat sat on the mat and looked at the dog for a while today",
    ...         "the cat sat on the mat and looked at the dog for a while today",   # exact copy
    ...         "the cat sat on the mat and looked at the dog for a long while today",  # near copy
    ...         "an entirely different sentence about prices of apples in the autumn market"]
    >>> report = deduplicate(docs, DedupSpec(shingle_size=3))
    >>> report.keep, report.exact_removed, report.near_removed
    ([0, 3], 1, 1)
"""
from __future__ import annotations

import hashlib
import re
import unicodedata
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass
class DedupSpec:
    exact: bool = True            # drop documents whose normalised text is identical
    near: bool = True             # drop near-duplicates found by MinHash-LSH
    paragraphs: bool = False      # drop paragraphs (blank-line separated) seen before in the corpus
    shingle_size: int = 5         # words per shingle
    num_perm: int = 128           # MinHash permutations
    bands: int = 25               # LSH bands (bands x rows <= num_perm)
    rows: int = 5                 # rows per band
    seed: int = 1                 # MinHash seed
    workers: int = 1              # processes that compute MinHashes


@dataclass
class DedupReport:
    keep: list[int]                               # indices of kept documents, in order
    exact_removed: int = 0
    near_removed: int = 0
    paragraphs_removed: int = 0
    clusters: list[list[int]] = field(default_factory=list)  # near-duplicate groups (first one kept)
    texts: list[str] | None = None                # kept texts after paragraph dedup (when enabled)

    def as_dict(self, spec: DedupSpec, total: int) -> dict:
        half, most = detection_curve(spec.bands, spec.rows)
        return {"documents": total, "kept": len(self.keep), "exact_removed": self.exact_removed,
                "near_removed": self.near_removed, "paragraphs_removed": self.paragraphs_removed,
                "near_duplicate_clusters": len(self.clusters),
                "detection_50": round(half, 3), "detection_95": round(most, 3),
                "shingle_size": spec.shingle_size, "bands": spec.bands, "rows": spec.rows}


def normalise(text: str) -> str:
    """Case-folded, accent-stripped words joined by single spaces (punctuation dropped)."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c))
    return " ".join(_WORD.findall(text.casefold()))


def shingles(text: str, size: int) -> set[bytes]:
    words = normalise(text).split()
    if len(words) <= size:
        return {" ".join(words).encode()}
    return {" ".join(words[i:i + size]).encode() for i in range(len(words) - size + 1)}


def detection_probability(jaccard: float, bands: int, rows: int) -> float:
    """Chance that LSH with ``bands`` x ``rows`` proposes a pair of this Jaccard similarity."""
    return 1.0 - (1.0 - jaccard ** rows) ** bands


def detection_curve(bands: int, rows: int) -> tuple[float, float]:
    """The Jaccard similarities caught with 50 % and 95 % probability (bisection).

    >>> [round(x, 2) for x in detection_curve(25, 5)]
    [0.49, 0.65]
    """
    def solve(target: float) -> float:
        low, high = 0.0, 1.0
        for _ in range(60):
            mid = (low + high) / 2
            low, high = (mid, high) if detection_probability(mid, bands, rows) < target else (low, mid)
        return (low + high) / 2

    return solve(0.5), solve(0.95)


def _minhash_chunk(args: tuple[list[str], int, int, int]) -> list:
    from datasketch import LeanMinHash, MinHash

    texts, size, num_perm, seed = args
    sets = [list(shingles(t, size)) for t in texts]
    return [LeanMinHash(m) for m in MinHash.bulk(sets, num_perm=num_perm, seed=seed)]


def minhashes(texts: list[str], spec: DedupSpec) -> list:
    """MinHash signatures, computed on ``spec.workers`` processes in chunks."""
    chunk = max(1, min(5000, len(texts) // max(1, spec.workers * 4) or 1))
    jobs = [(texts[i:i + chunk], spec.shingle_size, spec.num_perm, spec.seed) for i in range(0, len(texts), chunk)]
    if spec.workers > 1:
        with ProcessPoolExecutor(spec.workers) as pool:
            return [m for part in pool.map(_minhash_chunk, jobs) for m in part]
    return [m for job in jobs for m in _minhash_chunk(job)]


def deduplicate(texts: list[str], spec: DedupSpec | None = None) -> DedupReport:
    """Which documents to keep: the first of every exact or near-duplicate group."""
    from datasketch import MinHashLSH

    spec = spec or DedupSpec()
    if spec.bands * spec.rows > spec.num_perm:
        raise ValueError(f"bands x rows = {spec.bands * spec.rows} exceeds num_perm {spec.num_perm}")
    report = DedupReport(keep=[])
    candidates = list(range(len(texts)))
    if spec.exact:
        seen: set[bytes] = set()
        unique = []
        for i in candidates:
            digest = hashlib.blake2b(normalise(texts[i]).encode(), digest_size=16).digest()
            if digest in seen:
                report.exact_removed += 1
            else:
                seen.add(digest)
                unique.append(i)
        candidates = unique
    if spec.near and candidates:
        signatures = minhashes([texts[i] for i in candidates], spec)
        lsh = MinHashLSH(num_perm=spec.num_perm, params=(spec.bands, spec.rows))
        kept = []
        groups: dict[int, list[int]] = {}
        for index, signature in zip(candidates, signatures):
            match = lsh.query(signature)
            if match:
                first = min(match)
                groups.setdefault(first, [first]).append(index)
                report.near_removed += 1
            else:
                lsh.insert(index, signature)
                kept.append(index)
        report.clusters = list(groups.values())
        candidates = kept
    report.keep = candidates
    if spec.paragraphs:
        report.texts, report.paragraphs_removed = dedup_paragraphs([texts[i] for i in candidates])
    return report


def dedup_paragraphs(texts: list[str]) -> tuple[list[str], int]:
    """Drop every paragraph whose normalised text appeared earlier in the corpus."""
    seen: set[bytes] = set()
    out, removed = [], 0
    for text in texts:
        kept = []
        for paragraph in re.split(r"\n\s*\n", text):
            key = hashlib.blake2b(normalise(paragraph).encode(), digest_size=16).digest()
            if normalise(paragraph) and key in seen:
                removed += 1
                continue
            seen.add(key)
            kept.append(paragraph)
        out.append("\n\n".join(kept))
    return out, removed
