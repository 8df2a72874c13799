"""Decontamination: find training documents that contain evaluation items (word n-gram overlap).

Every registered suite folder (lm-eval task YAML + JSONL, e.g. ``evals/suites/embedded``) is read
as plain JSONL. Each row becomes one item: its string fields in order, plus the gold choice when
the row has ``choices`` and ``gold``. The item is normalised like :func:`smolforge.data.dedup.normalise` and
cut into word n-grams (13 by default, as in the GPT-3/Llama reports). An item shorter than n
words counts only when it appears whole in a document. Items under ``min_words`` words are not
indexed, because a phrase that short says nothing about leakage. A document matching an item is
contaminated, and the report names the suite, file and row.

    >>> import json, pathlib, tempfile
    >>> suite = pathlib.Path(tempfile.mkdtemp()) / "quiz"; suite.mkdir()
    >>> row = {"question": "What is the name of the tallest mountain on the planet Zorb?", "answer": "Mount Vel"}
    >>> _ = (suite / "quiz.jsonl").write_text(json.dumps(row) + "\\n")
    >>> index = EvalIndex.from_suites([suite], n=8)
    >>> docs = ["Trivia: what is the name of the tallest mountain on the planet Zorb? Mount Vel.", "Unrelated text."]
    >>> report = decontaminate(docs, index)
    >>> report.hits[0]["suite"], report.keep
    ('quiz', [1])
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .dedup import normalise


# Row fields that label an item rather than hold its text.
METADATA_FIELDS = frozenset({"id", "doc_id", "kind", "task", "domain", "source", "split", "category", "label"})


def item_text(row: dict) -> str:
    """A row's prompt and answer as one text: string fields (not metadata), then the gold choice."""
    parts = [v for k, v in row.items() if isinstance(v, str) and k not in METADATA_FIELDS]
    choices, gold = row.get("choices"), row.get("gold")
    if isinstance(choices, list) and isinstance(gold, int) and 0 <= gold < len(choices):
        parts.append(str(choices[gold]))
    return " ".join(parts)


def ngrams(words: list[str], n: int) -> set[str]:
    if len(words) < n:
        return {" ".join(words)} if words else set()
    return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


@dataclass
class EvalIndex:
    """Word n-grams (and whole short items) of evaluation items → (suite, file, row)."""

    n: int = 13
    min_words: int = 8
    sources: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    short: dict[str, tuple[str, str, int]] = field(default_factory=dict)  # whole items of < n words
    short_lengths: set[int] = field(default_factory=set)  # word counts of the short items
    _starts: set | None = field(default=None, init=False, repr=False, compare=False)  # first two words of each key

    @classmethod
    def from_suites(cls, folders: list[str | Path], n: int = 13, min_words: int = 8) -> "EvalIndex":
        index = cls(n=n, min_words=min_words)
        for folder in map(Path, folders):
            for path in sorted(folder.glob("*.jsonl")):
                for row_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                    if line.strip():
                        index.add(normalise(item_text(json.loads(line))).split(), (folder.name, path.name, row_no))
        return index

    def add(self, words: list[str], source: tuple[str, str, int]) -> None:
        if len(words) < self.min_words:
            return
        target = self.sources if len(words) >= self.n else self.short
        if len(words) < self.n:
            self.short_lengths.add(len(words))
        for gram in ngrams(words, self.n):
            target.setdefault(gram, source)

    def match(self, text: str) -> tuple[str, str, int] | None:
        """The item of the first indexed n-gram in ``text`` (by position), else of the first short
        item held whole (shortest first); None when there is none. Windows are joined and looked up
        only where their first two words start some indexed key (most positions start none)."""
        words = normalise(text).split()
        if self._starts is None:
            self._starts = {tuple(key.split(" ", 2)[:2]) for table in (self.sources, self.short) for key in table}
        starts, count = self._starts, len(words)
        if count < self.n:
            whole = " ".join(words)
            if words and whole in self.sources:
                return self.sources[whole]
        else:
            for i in range(count - self.n + 1):
                if self.n < 2 or (words[i], words[i + 1]) in starts:
                    hit = self.sources.get(" ".join(words[i:i + self.n]))
                    if hit:
                        return hit
        for length in sorted(self.short_lengths):
            for i in range(count - length + 1):
                if length < 2 or (words[i], words[i + 1]) in starts:
                    hit = self.short.get(" ".join(words[i:i + length]))
                    if hit:
                        return hit
        return None


@dataclass
class DecontaminationReport:
    keep: list[int]                                  # documents without a match
    hits: list[dict] = field(default_factory=list)   # one per contaminated document

    def by_suite(self) -> dict[str, int]:
        return dict(Counter(hit["suite"] for hit in self.hits))


def decontaminate(texts: list[str], index: EvalIndex) -> DecontaminationReport:
    """Which documents contain an evaluation item (by n-gram, or whole when the item is short)."""
    report = DecontaminationReport(keep=[])
    for i, text in enumerate(texts):
        match = index.match(text)
        if match is None:
            report.keep.append(i)
        else:
            suite, file, row = match
            report.hits.append({"document": i, "suite": suite, "file": file, "row": row})
    return report
