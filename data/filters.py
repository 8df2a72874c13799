"""Document quality filters: the Gopher rules (Rae et al. 2021, appendix A) plus garbage and language.

:func:`check` names the first rule a document fails, or returns None when it passes;
:class:`QualityFilter` validates a :class:`FilterSpec` once and counts removals per rule.
Rules run cheapest first and stop at the first failure. A threshold set to None turns its rule
off. The rules, in order:

- ``min_words`` / ``max_words``: words (whitespace split) outside ``[min_words, max_words]``.
- ``min_mean_word_length`` / ``max_mean_word_length``: mean characters per word outside the range.
- ``symbol_word_ratio``: '#' per word, or ellipses ('...' or '…') per word, above the maximum.
- ``bullet_lines``: share of non-blank lines starting with a bullet (•, -, *, ...) above the maximum.
- ``ellipsis_lines``: share of non-blank lines ending with '...' or '…' above the maximum.
- ``alpha_words``: share of words holding an alphabetic character below the minimum.
- ``stop_words``: fewer than ``min_stop_words`` of Gopher's eight English stop words (a Gopher
  rule; case- and punctuation-insensitive, so it also drops most non-English text).
- ``garbage_chars``: share of characters that are U+FFFD, control (not \\n \\t \\r) or private-use.
- ``dup_para_frac`` / ``dup_para_char_frac``, ``dup_line_frac`` / ``dup_line_char_frac``: share of
  paragraphs (lines) that repeat an earlier one, and their share of the characters.
- ``top_{n}gram_char_frac``: characters covered by the most frequent repeated word n-gram.
- ``dup_{n}gram_char_frac``: characters of words covered by any word n-gram occurring twice or
  more, each word counted once however many duplicated n-grams overlap it.
- ``language``: langdetect's probability for ``language`` below ``min_language_score``.

**Units.** Character fractions of the n-gram rules are over word characters (whitespace not
counted), as in RedPajama-v2's quality signals; the line and paragraph ones are over the
characters of the stripped, non-blank lines (paragraphs). A top n-gram that occurs only once is
not repetition and scores 0 (otherwise every 3-word document would fail ``top_2gram``).
Deliberate differences from datatrove's GopherRepetitionFilter: the first occurrence of a
duplicated n-gram is counted too (datatrove counts only the later copies, halving the fraction of
a text pasted twice); blank lines are not lines (datatrove counts them, so a text of five
paragraphs has 3 of 9 lines "duplicated" and fails ``dup_line_frac``); words are not run
through NLTK's tokenizer.

**Calibration.** The Gopher defaults assume web pages of 50+ words. On the demo corpus (6000
short templated documents, ``World.generate(0, 40).pretrain_corpus(6000, seed=1)``) they keep
only 2084. The 1548 sums ("3 + 4 = 7. 6 plus 0 is 6.") have a mean word length near 2 and few
alphabetic words; the fact documents have few stop words ("Shimi eats rice. Shimi comes from
Pallis.") and repeat their entity and template in every sentence ("The favourite food of Drarax
is beans. The favourite color of Drarax is black."), which the top 2/3/4-gram rules flag. The
sum template also repeats 5-grams ("The sum of 2 and"). :data:`DEMO_OVERRIDES` turns those five
rules off for the demo and keeps all 6000.

    >>> spec = FilterSpec()
    >>> check("The cat sat on the mat, and the dog slept by the warm fire all afternoon.", spec) is None
    True
    >>> check("Buy the best watches and the cheapest rings now. " * 5, spec)
    'top_2gram_char_frac'
    >>> check("Hello world and the rest", FilterSpec(min_words=10))
    'min_words'
    >>> quality = QualityFilter(FilterSpec(min_stop_words=None))
    >>> [quality(t) for t in ["1 + 2 = 3.", "The cat sat on the mat."]]
    ['min_mean_word_length', None]
    >>> quality.stats.as_dict()["removed"]
    {'min_mean_word_length': 1}
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import accumulate

from smolforge.recipe import FRACTION
from smolforge.errors import RecipeError

STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})  # Gopher's list
BULLETS = ("•", "‣", "⁃", "◦", "▪", "▫", "●", "○", "■", "□", "-", "*", "–", "—")
ELLIPSES = ("...", "…")
_GARBAGE = re.compile("[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"
                      "\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd]")
_NON_ALPHA_WORD = re.compile(r"(?<!\S)(?:[^\w\s]|[\d_])+(?!\S)")  # a word without a letter (any script)
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_PUNCTUATION = "\"'()[]{}.,;:!?«»“”‘’"

# Overrides for the embedded demo corpus (short templated documents, a quarter of them sums);
# the count is what the rule removes on the 6000-document demo corpus when it alone is on.
DEMO_OVERRIDES: dict = {
    "min_mean_word_length": None,   # 1548: "3 + 4 = 7." has mean word length 1.2
    "min_alpha_words": None,        # 1548: ... and no alphabetic word
    "min_stop_words": None,         # 1132: "Shimi eats rice. Shimi comes from Pallis." has none
    "top_ngram_char_frac": None,    # 2390: "The favourite" and "of Drarax" recur in every document
    "dup_ngram_char_frac": None,    # 111: "The sum of 2 and" recurs in the sums
}


def _top_default() -> dict:
    return {2: 0.20, 3: 0.18, 4: 0.16}


def _dup_default() -> dict:
    return {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}


@dataclass
class FilterSpec:
    enabled: bool = True                       # False: every document passes
    min_words: int | None = 3                  # fewer words fail (Gopher: 50; demo documents are 1-3 sentences)
    max_words: int | None = 100_000            # more words fail
    min_mean_word_length: float | None = 3.0   # mean characters per word below this fail
    max_mean_word_length: float | None = 10.0  # ... above this fail
    max_symbol_word_ratio: float | None = 0.1  # '#' per word, or ellipses per word, above this fail
    max_bullet_lines: float | None = 0.9       # share of lines starting with a bullet
    max_ellipsis_lines: float | None = 0.3     # share of lines ending with an ellipsis
    min_alpha_words: float | None = 0.8        # share of words holding an alphabetic character
    min_stop_words: int | None = 2             # Gopher's stop words (the, be, to, of, and, that, have, with) needed
    max_garbage_chars: float | None = 0.05     # share of characters that are U+FFFD, control or private-use
    max_dup_para_frac: float | None = 0.3      # share of paragraphs repeating an earlier paragraph
    max_dup_para_char_frac: float | None = 0.2  # ... their share of the characters
    max_dup_line_frac: float | None = 0.3      # share of lines repeating an earlier line
    max_dup_line_char_frac: float | None = 0.2  # ... their share of the characters
    top_ngram_char_frac: dict | None = field(default_factory=_top_default)  # n -> max share of the top repeated n-gram
    dup_ngram_char_frac: dict | None = field(default_factory=_dup_default)  # n -> max share covered by duplicated n-grams
    language: str | None = None                # langdetect code ("en", "de", "zh-cn"); None: any language
    min_language_score: float = field(default=0.65, metadata=FRACTION)          # langdetect probability of ``language`` needed
    c4: bool = False                           # datatrove's C4QualityFilter too (executor: local or slurm)
    fineweb: bool = False                      # datatrove's FineWebQualityFilter too (executor: local or slurm)


# ---- measurements ---------------------------------------------------------------------------------

def _word_ids(words: list[str]) -> tuple[list[int], list[int]]:
    """An id per word (equal words, equal ids) and the character length of each id."""
    index = dict.fromkeys(words)
    for i, word in enumerate(index):
        index[word] = i
    return list(map(index.__getitem__, words)), list(map(len, index))


def _ngrams(ids: list[int], n: int) -> list[tuple[int, ...]]:
    return list(zip(*[ids[k:] for k in range(n)]))


def _covered_chars(starts: Iterable[int], n: int, prefix: list[int]) -> int:
    """Characters of the words covered by n-grams starting at ``starts`` (ascending), each once."""
    covered = end = 0
    for i in starts:
        begin, end = max(i, end), i + n
        covered += prefix[end] - prefix[begin]
    return covered


def _prefix(words: list[str]) -> list[int]:
    """Characters in the first i words, for i = 0..len(words)."""
    return list(accumulate(map(len, words), initial=0))


def _top_ngram_chars(ids: list[int], id_lengths: list[int], prefix: list[int], n: int,
                     enough: float = 0.0) -> int:
    """Characters covered by the most frequent n-gram (the longest of those tied), 0 if none repeats.

    Occurrences of an n-gram overlap only in runs like "ha ha ha", so count x length is exact
    almost always and an upper bound otherwise: when it is at most ``enough`` it is returned as is.
    """
    grams = _ngrams(ids, n)
    if not grams:
        return 0
    counts = Counter(grams)
    top = max(counts.values())
    if top < 2:
        return 0
    best = max((g for g, c in counts.items() if c == top), key=lambda g: sum(id_lengths[i] for i in g))
    bound = top * sum(id_lengths[i] for i in best)
    if bound <= enough:
        return bound
    return _covered_chars((i for i, g in enumerate(grams) if g == best), n, prefix)


def _dup_ngram_chars(ids: list[int], prefix: list[int], n: int) -> int:
    grams = _ngrams(ids, n)
    counts = Counter(grams)
    if len(counts) == len(grams):
        return 0
    return _covered_chars((i for i, g in enumerate(grams) if counts[g] > 1), n, prefix)


def top_ngram_char_frac(words: list[str], n: int) -> float:
    """Share of word characters covered by the most frequent word n-gram, 0 if none repeats.

    >>> top_ngram_char_frac("to be or not to be".split(), 2)   # "to be" twice: 8 of 13 characters
    0.6153846153846154
    """
    ids, id_lengths = _word_ids(words)
    prefix = _prefix(words)
    return _top_ngram_chars(ids, id_lengths, prefix, n) / prefix[-1] if prefix[-1] else 0.0


def dup_ngram_char_frac(words: list[str], n: int) -> float:
    """Share of word characters covered by word n-grams that occur more than once.

    >>> dup_ngram_char_frac("a bb a bb cc".split(), 2)   # "a bb" at words 0 and 2: 6 of 8 characters
    0.75
    """
    ids, _ = _word_ids(words)
    prefix = _prefix(words)
    return _dup_ngram_chars(ids, prefix, n) / prefix[-1] if prefix[-1] else 0.0


def _duplicates(items: list[str]) -> tuple[float, float]:
    """(share of items equal to an earlier one, their share of the characters)."""
    seen: set[str] = set()
    count = chars = 0
    for item in items:
        if item in seen:
            count += 1
            chars += len(item)
        else:
            seen.add(item)
    total = sum(map(len, items))
    return count / len(items), (chars / total if total else 0.0)


def _stop_words(words: list[str], needed: int) -> int:
    found = 0
    for w in words:
        if w.strip(_PUNCTUATION).lower() in STOP_WORDS:
            found += 1
            if found >= needed:
                break
    return found


_detector_factory = None


def _language_factory():
    global _detector_factory
    if _detector_factory is None:
        try:
            from langdetect.detector_factory import PROFILES_DIRECTORY, DetectorFactory
        except ImportError:
            raise RecipeError("filters.language needs langdetect: pip install langdetect") from None
        factory = DetectorFactory()
        factory.load_profile(PROFILES_DIRECTORY)
        factory.set_seed(0)  # langdetect samples n-grams at random; a fixed seed makes it deterministic
        _detector_factory = factory
    return _detector_factory


def language_score(text: str, language: str) -> float:
    """langdetect's probability that ``text`` is in ``language`` (0 when it finds no letters).

    >>> language_score("The weather was cold, so we stayed inside and read books all day.", "en") > 0.9
    True
    """
    factory = _language_factory()   # RecipeError when langdetect is missing
    from langdetect.lang_detect_exception import LangDetectException

    detector = factory.create()
    detector.append(text)
    try:
        found = detector.get_probabilities()
    except LangDetectException:
        return 0.0
    return next((guess.prob for guess in found if guess.lang == language), 0.0)


# ---- the rules ------------------------------------------------------------------------------------

def _thresholds(table: dict | None) -> list[tuple[int, float]]:
    """``{2: 0.2, "3": 0.18, 4: None}`` as ``[(2, 0.2), (3, 0.18)]``; YAML keys may be strings."""
    return sorted((int(n), limit) for n, limit in (table or {}).items() if limit is not None)


def _check(text: str, spec: FilterSpec, top: list[tuple[int, float]], dup: list[tuple[int, float]]) -> str | None:
    if not spec.enabled:
        return None
    words = text.split()
    n_words = len(words)
    if spec.min_words is not None and n_words < spec.min_words:
        return "min_words"
    if spec.max_words is not None and n_words > spec.max_words:
        return "max_words"
    word_chars = sum(map(len, words))
    if n_words:
        mean = word_chars / n_words
        if spec.min_mean_word_length is not None and mean < spec.min_mean_word_length:
            return "min_mean_word_length"
        if spec.max_mean_word_length is not None and mean > spec.max_mean_word_length:
            return "max_mean_word_length"
        if spec.max_symbol_word_ratio is not None:
            symbols = max(text.count("#"), text.count("...") + text.count("…"))
            if symbols / n_words > spec.max_symbol_word_ratio:
                return "symbol_word_ratio"
    lines = [s for s in (line.strip() for line in text.splitlines()) if s]
    if lines:
        if spec.max_bullet_lines is not None:
            if sum(line.startswith(BULLETS) for line in lines) / len(lines) > spec.max_bullet_lines:
                return "bullet_lines"
        if spec.max_ellipsis_lines is not None:
            if sum(line.endswith(ELLIPSES) for line in lines) / len(lines) > spec.max_ellipsis_lines:
                return "ellipsis_lines"
    if n_words and spec.min_alpha_words is not None:
        if 1 - len(_NON_ALPHA_WORD.findall(text)) / n_words < spec.min_alpha_words:
            return "alpha_words"
    if spec.min_stop_words and _stop_words(words, spec.min_stop_words) < spec.min_stop_words:
        return "stop_words"
    if text and spec.max_garbage_chars is not None:
        garbage = len(_GARBAGE.findall(text))
        if garbage / len(text) > spec.max_garbage_chars:
            return "garbage_chars"
    if spec.max_dup_para_frac is not None or spec.max_dup_para_char_frac is not None:
        paragraphs = [s for s in (p.strip() for p in _PARAGRAPH_BREAK.split(text)) if s]
        if len(paragraphs) > 1:
            share, char_share = _duplicates(paragraphs)
            if spec.max_dup_para_frac is not None and share > spec.max_dup_para_frac:
                return "dup_para_frac"
            if spec.max_dup_para_char_frac is not None and char_share > spec.max_dup_para_char_frac:
                return "dup_para_char_frac"
    if len(lines) > 1:
        share, char_share = _duplicates(lines)
        if spec.max_dup_line_frac is not None and share > spec.max_dup_line_frac:
            return "dup_line_frac"
        if spec.max_dup_line_char_frac is not None and char_share > spec.max_dup_line_char_frac:
            return "dup_line_char_frac"
    if (top or dup) and word_chars:
        ids, id_lengths = _word_ids(words)
        prefix = _prefix(words)
        for n, limit in top:
            chars = _top_ngram_chars(ids, id_lengths, prefix, n, limit * word_chars)
            if chars / word_chars > limit:
                return f"top_{n}gram_char_frac"
            if chars == 0:   # no n-gram repeats, so no longer one does
                break
        for n, limit in dup:
            chars = _dup_ngram_chars(ids, prefix, n)
            if chars / word_chars > limit:
                return f"dup_{n}gram_char_frac"
            if chars == 0:
                break
    if spec.language is not None and language_score(text, spec.language) < spec.min_language_score:
        return "language"
    return None


def check(text: str, spec: FilterSpec) -> str | None:
    """The name of the first rule ``text`` fails (e.g. 'min_words', 'dup_line_frac',
    'top_2gram_char_frac', 'garbage_chars', 'language'), or None when it passes."""
    return _check(text, spec, _thresholds(spec.top_ngram_char_frac), _thresholds(spec.dup_ngram_char_frac))


# ---- validation, stats, the filter -------------------------------------------------------------

def _number(name: str, value, low: float = 0.0, high: float | None = None, integer: bool = False) -> None:
    if value is None:
        return
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise RecipeError(f"filters.{name} must be {kind} or null, got {value!r}")
    if math.isnan(value) or value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f">= {low}"
        raise RecipeError(f"filters.{name} must be {bounds}, got {value}")


def _ngram_table(name: str, table) -> None:
    if table is None:
        return
    if not isinstance(table, dict):
        raise RecipeError(f"filters.{name} must be a mapping n -> fraction (e.g. {{2: 0.2}}) or null, got {table!r}")
    for n, limit in table.items():
        try:
            size = int(n)
        except (TypeError, ValueError):
            raise RecipeError(f"filters.{name}: n-gram size {n!r} is not an integer") from None
        if isinstance(n, bool) or (isinstance(n, float) and n != size) or size < 1:
            raise RecipeError(f"filters.{name}: n-gram size must be an integer >= 1, got {n!r}")
        _number(f"{name}.{n}", limit, 0.0, 1.0)


def validate(spec: FilterSpec) -> None:
    """Raise RecipeError naming the field (``filters.<field>``) of the first nonsense value."""
    for name in ("enabled", "c4", "fineweb"):
        if not isinstance(getattr(spec, name), bool):
            raise RecipeError(f"filters.{name} must be true or false, got {getattr(spec, name)!r}")
    for name in ("min_words", "max_words", "min_stop_words"):
        _number(name, getattr(spec, name), integer=True)
    for name in ("min_mean_word_length", "max_mean_word_length", "max_symbol_word_ratio"):
        _number(name, getattr(spec, name))
    for name in ("max_bullet_lines", "max_ellipsis_lines", "min_alpha_words", "max_garbage_chars",
                 "max_dup_para_frac", "max_dup_para_char_frac", "max_dup_line_frac", "max_dup_line_char_frac"):
        _number(name, getattr(spec, name), 0.0, 1.0)
    if spec.min_language_score is None:
        raise RecipeError("filters.min_language_score must be a number between 0 and 1, got None")
    _number("min_language_score", spec.min_language_score, 0.0, 1.0)
    for low, high in (("min_words", "max_words"), ("min_mean_word_length", "max_mean_word_length")):
        a, b = getattr(spec, low), getattr(spec, high)
        if a is not None and b is not None and a > b:
            raise RecipeError(f"filters.{low} ({a}) exceeds filters.{high} ({b})")
    _ngram_table("top_ngram_char_frac", spec.top_ngram_char_frac)
    _ngram_table("dup_ngram_char_frac", spec.dup_ngram_char_frac)
    if spec.language is not None:
        if not isinstance(spec.language, str) or not spec.language:
            raise RecipeError(f"filters.language must be a language code such as 'en', got {spec.language!r}")
        known = _language_factory().get_lang_list()
        if spec.language not in known:
            raise RecipeError(f"filters.language '{spec.language}' is not a langdetect language; "
                              f"known: {', '.join(sorted(known))}")


@dataclass
class FilterStats:
    """Documents seen and kept, removals per rule, and the first few removed snippets per rule."""

    documents: int = 0
    kept: int = 0
    removed: dict[str, int] = field(default_factory=dict)          # rule -> documents it removed
    examples: dict[str, list[str]] = field(default_factory=dict)   # rule -> first removed snippets
    max_examples: int = 3                                          # snippets kept per rule
    snippet_chars: int = 120                                       # characters kept per snippet

    def add(self, reason: str | None, text: str) -> None:
        self.documents += 1
        if reason is None:
            self.kept += 1
            return
        self.removed[reason] = self.removed.get(reason, 0) + 1
        examples = self.examples.setdefault(reason, [])
        if len(examples) < self.max_examples:
            examples.append(text[:self.snippet_chars])

    def as_dict(self) -> dict:
        return {"documents": self.documents, "kept": self.kept, "removed": dict(self.removed),
                "examples": {rule: list(snippets) for rule, snippets in self.examples.items()}}


class QualityFilter:
    """Validates ``spec`` once; calling it checks one document and records the outcome in ``stats``.

    >>> quality = QualityFilter(FilterSpec(min_words=2))
    >>> quality("hi"), quality.stats.as_dict()["examples"]
    ('min_words', {'min_words': ['hi']})
    """

    def __init__(self, spec: FilterSpec | None = None) -> None:
        self.spec = spec or FilterSpec()
        validate(self.spec)
        self._top = _thresholds(self.spec.top_ngram_char_frac)
        self._dup = _thresholds(self.spec.dup_ngram_char_frac)
        self.stats = FilterStats()

    def __call__(self, text: str) -> str | None:
        reason = _check(text, self.spec, self._top, self._dup)
        self.stats.add(reason, text)
        return reason

