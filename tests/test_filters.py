"""Gopher quality filters: one document per rule built to fail it, hand-worked n-gram fractions,
stats, spec validation, language detection, and the demo corpus calibration."""
from __future__ import annotations

import sys

import pytest

import smolforge.data.filters as filters
from smolforge.data.filters import (DEMO_OVERRIDES, FilterSpec, FilterStats, QualityFilter, check, dup_ngram_char_frac,
                          language_score, top_ngram_char_frac, validate)
from smolforge.data.synthetic import World
from smolforge.errors import RecipeError

CLEAN = ("The old lighthouse stood at the edge of the cliff for more than a century. Every evening the "
         "keeper climbed its narrow stairs to light the lamp, and ships passing through the strait relied "
         "on that steady beam to avoid the rocks below. When the harbour was modernised, an automatic light "
         "replaced him, but the town kept the tower as a museum where visitors can still read his logbooks.")
SECOND = ("Bread has been baked in much the same way for thousands of years. Flour, water, salt and yeast are "
          "mixed into a dough, which is kneaded, left to rise, shaped and finally baked in a hot oven until "
          "the crust turns golden and crisp.")
THIRD = ("A good map tells you where you are, where you could go, and what lies between. Older maps often "
         "mixed careful survey work with rumour, drawing sea monsters in the corners they had never visited.")
GERMAN = ("Der alte Leuchtturm stand mehr als ein Jahrhundert lang am Rand der Klippe. Jeden Abend stieg der "
          "Wärter die schmalen Treppen hinauf, um die Lampe anzuzünden, und die Schiffe verließen sich auf "
          "diesen gleichmäßigen Strahl, um den Felsen auszuweichen.")
FRENCH = ("Le vieux phare se dressait au bord de la falaise depuis plus d'un siècle. Chaque soir, le gardien "
          "montait ses escaliers étroits pour allumer la lampe, et les navires comptaient sur ce faisceau "
          "régulier pour éviter les rochers.")


def only(**kwargs) -> FilterSpec:
    """A spec with every rule off except the ones given."""
    off = dict(min_words=None, max_words=None, min_mean_word_length=None, max_mean_word_length=None,
               max_symbol_word_ratio=None, max_bullet_lines=None, max_ellipsis_lines=None, min_alpha_words=None,
               min_stop_words=None, max_garbage_chars=None, max_dup_para_frac=None, max_dup_para_char_frac=None,
               max_dup_line_frac=None, max_dup_line_char_frac=None, top_ngram_char_frac=None,
               dup_ngram_char_frac=None)
    return FilterSpec(**{**off, **kwargs})


# ---- every rule: a clean paragraph passes, a document built to fail it is removed ------------------

@pytest.mark.parametrize("text", [CLEAN, SECOND, THIRD, f"{CLEAN}\n\n{SECOND}\n\n{THIRD}",
                                  "\n".join([CLEAN, SECOND, THIRD])])
def test_clean_english_passes_every_rule_including_language(text):
    assert check(text, FilterSpec()) is None
    assert check(text, FilterSpec(language="en")) is None


def test_blank_lines_are_not_duplicate_lines():
    # datatrove counts the blank lines between paragraphs: 5 paragraphs = 9 lines, 3 "duplicates"
    paragraphs = [CLEAN, SECOND, THIRD, CLEAN.replace("lighthouse", "tower"), SECOND.replace("Bread", "Cake")]
    assert check("\n\n".join(paragraphs), only(max_dup_line_frac=0.3, max_dup_line_char_frac=0.2)) is None


BULLETS = "\n".join(f"• item {i}: the {word} of the list and more" for i, word in
                    enumerate(["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"]))
ELLIPSIS = "\n".join([CLEAN[:120] + "...", SECOND, THIRD[:80] + "…", "And then the story stopped..."])
LONG_WORDS = ("Internationalisation considerations notwithstanding, telecommunications infrastructure "
              "modernisation necessitates interdisciplinary collaboration and the understanding of "
              "characteristically incomprehensible specifications.")
FAILING = [
    ("min_words", "Hello there."),
    ("max_words", "the cat and the dog " * 20_001),
    ("min_mean_word_length", "It is so. I am on it. We go to it as we do and he is up to it."),
    ("max_mean_word_length", LONG_WORDS),
    ("symbol_word_ratio", CLEAN + " " + " ".join(f"#tag{i}" for i in range(12))),
    ("symbol_word_ratio", "Well... and then... the rest of it... came to nothing... as you know... " + THIRD),
    ("bullet_lines", BULLETS),
    ("ellipsis_lines", ELLIPSIS),
    ("alpha_words", CLEAN + " " + " ".join(str(123456 + 7 * i) for i in range(30))),
    ("stop_words", "Quick brown foxes jump over lazy dogs near quiet rivers during warm summer evenings."),
    ("garbage_chars", "".join(c if i % 10 else "\ufffd" for i, c in enumerate(CLEAN))),
    ("dup_para_frac", "\n\n".join([CLEAN, SECOND, CLEAN, THIRD, SECOND])),
    ("dup_para_char_frac", "\n\n".join([CLEAN, "A short note.", "Another one here.", "And a third.",
                                        "One more line.", "The end is near.", CLEAN])),
    ("dup_line_frac", "\n".join([CLEAN, SECOND, CLEAN, THIRD, SECOND])),
    ("dup_line_char_frac", "\n".join([CLEAN, "A short note.", "Another one here.", "And a third.",
                                      "One more line.", "The end is near.", CLEAN])),
    ("top_2gram_char_frac", "Buy the best watches and the cheapest rings now. " * 5),
    ("dup_5gram_char_frac", CLEAN + " " + " ".join(CLEAN.split()[:25])),
]


@pytest.mark.parametrize("rule, text", FAILING, ids=[f"{rule}-{i}" for i, (rule, _) in enumerate(FAILING)])
def test_each_rule_removes_a_document_built_to_fail_it(rule, text):
    assert check(text, FilterSpec()) == rule


@pytest.mark.parametrize("garbage", ["\x00", "\x07", "\x1b", "\x7f", "\x85", "\ue000", "\U000f0001", "\ufffd"])
def test_garbage_characters_are_control_private_use_and_replacement(garbage):
    text = CLEAN + garbage * (len(CLEAN) // 10)
    assert check(text, only(max_garbage_chars=0.05)) == "garbage_chars"


def test_newlines_tabs_and_carriage_returns_are_not_garbage():
    assert check(CLEAN + "\t\r\n" * 30, only(max_garbage_chars=0.05)) is None


def test_longer_top_and_duplicate_ngrams_each_fire_with_string_keys_from_yaml():
    spam = "Buy the best watches and the cheapest rings now. " * 5
    assert check(spam, only(top_ngram_char_frac={"3": 0.18})) == "top_3gram_char_frac"
    assert check(spam, only(top_ngram_char_frac={"4": 0.16, 2: None})) == "top_4gram_char_frac"
    repeated = CLEAN + " " + " ".join(CLEAN.split()[5:17])   # a 12-word passage twice
    assert check(repeated, only(dup_ngram_char_frac={"10": 0.10})) == "dup_10gram_char_frac"
    assert check(repeated, only(dup_ngram_char_frac={"10": 0.10, 5: None})) == "dup_10gram_char_frac"
    assert check(repeated, only(dup_ngram_char_frac={"13": 0.10})) is None   # nothing 13 words long repeats


def test_a_disabled_rule_or_filter_lets_the_document_through():
    assert check("Hello there.", FilterSpec(min_words=None, min_stop_words=None)) is None
    assert check("Hello there.", FilterSpec(enabled=False)) is None
    assert check("", FilterSpec(min_words=None, min_stop_words=None)) is None   # no division by zero
    assert check("", FilterSpec(min_words=None)) == "stop_words"
    assert check("", FilterSpec()) == "min_words"


# ---- n-gram fractions worked by hand ------------------------------------------------------------

def test_ngram_fractions_match_hand_worked_values():
    # words: one(3) two(3) three(5) four(4) one(3) two(3) three(5) five(4) -> 30 characters.
    words = "one two three four one two three five".split()
    # 2-grams at 0..6: "one two" @0,@4 and "two three" @1,@5 repeat, the rest occur once.
    # top: both tie at count 2; the longer one, "two three" (8 chars), covers 2 x 8 = 16 -> 16/30.
    assert top_ngram_char_frac(words, 2) == pytest.approx(16 / 30)
    # duplicated 2-grams start at 0, 1, 4, 5 and cover words 0-2 and 4-6: 11 + 11 = 22 -> 22/30.
    # Summing every duplicated occurrence would double-count "two": (6 + 8) x 2 = 28.
    assert dup_ngram_char_frac(words, 2) == pytest.approx(22 / 30)
    # 3-grams: only "one two three" repeats (@0, @4): the same words 0-2 and 4-6 -> 22/30 for both.
    assert top_ngram_char_frac(words, 3) == pytest.approx(22 / 30)
    assert dup_ngram_char_frac(words, 3) == pytest.approx(22 / 30)
    # 4-grams: none repeats -> 0.
    assert top_ngram_char_frac(words, 4) == 0.0 and dup_ngram_char_frac(words, 4) == 0.0
    # the thresholds compare strictly: 16/30 = 0.5333 fails 0.53 and passes 0.54
    text = " ".join(words)
    assert check(text, only(top_ngram_char_frac={2: 0.53})) == "top_2gram_char_frac"
    assert check(text, only(top_ngram_char_frac={2: 0.54})) is None
    assert check(text, only(dup_ngram_char_frac={2: 0.73})) == "dup_2gram_char_frac"
    assert check(text, only(dup_ngram_char_frac={2: 0.74})) is None


def test_overlapping_occurrences_are_counted_once():
    # ha(2) ha(2) ha(2) joke(4) = 10 characters; "ha ha" occurs @0 and @1, overlapping on word 1.
    # It covers words 0-2 = 6 characters -> 0.6 (count x length would say 8/10).
    words = "ha ha ha joke".split()
    assert top_ngram_char_frac(words, 2) == pytest.approx(0.6)
    assert dup_ngram_char_frac(words, 2) == pytest.approx(0.6)
    assert top_ngram_char_frac(words, 3) == 0.0            # "ha ha ha", "ha ha joke": once each
    assert check(" ".join(words), only(top_ngram_char_frac={2: 0.59})) == "top_2gram_char_frac"
    assert check(" ".join(words), only(top_ngram_char_frac={2: 0.61})) is None


def test_a_single_occurrence_is_not_a_top_ngram():
    assert top_ngram_char_frac("the cat sat".split(), 2) == 0.0
    assert check("Seven small cats sat.", only(top_ngram_char_frac={2: 0.2})) is None


# ---- stats -------------------------------------------------------------------------------------------

def test_stats_count_per_rule_and_keep_the_first_three_truncated_examples():
    quality = QualityFilter(FilterSpec())
    texts = [CLEAN, "Hi.", "Hi there.", SECOND, "One.", "Two.", "Three.", LONG_WORDS]
    reasons = [quality(t) for t in texts]
    assert reasons == [None, "min_words", "min_words", None, "min_words", "min_words", "min_words",
                       "max_mean_word_length"]
    stats = quality.stats.as_dict()
    assert stats["documents"] == 8 and stats["kept"] == 2
    assert stats["removed"] == {"min_words": 5, "max_mean_word_length": 1}
    assert stats["examples"]["min_words"] == ["Hi.", "Hi there.", "One."]
    assert stats["examples"]["max_mean_word_length"] == [LONG_WORDS[:120]]
    assert len(stats["examples"]["max_mean_word_length"][0]) == 120


def test_stats_add_directly():
    stats = FilterStats()
    stats.add(None, "kept")
    stats.add("language", "x" * 500)
    assert stats.as_dict() == {"documents": 2, "kept": 1, "removed": {"language": 1},
                               "examples": {"language": ["x" * 120]}}


# ---- spec validation ------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("min_words", -1), ("max_words", 2.5), ("min_stop_words", -2), ("min_mean_word_length", -0.5),
    ("max_symbol_word_ratio", "lots"), ("max_bullet_lines", 1.5), ("max_ellipsis_lines", -0.1),
    ("min_alpha_words", 2), ("max_garbage_chars", float("nan")), ("max_dup_para_frac", 1.01),
    ("max_dup_para_char_frac", -1), ("max_dup_line_frac", True), ("max_dup_line_char_frac", 3),
    ("min_language_score", 1.2), ("min_language_score", None), ("enabled", "yes"),
    ("top_ngram_char_frac", [0.2]), ("dup_ngram_char_frac", "0.1"),
])
def test_nonsense_values_raise_naming_the_field(field, value):
    with pytest.raises(RecipeError, match=rf"filters\.{field}"):
        QualityFilter(FilterSpec(**{field: value}))


@pytest.mark.parametrize("table, message", [
    ({2: 1.5}, r"filters\.top_ngram_char_frac\.2 "), ({"two": 0.2}, r"filters\.top_ngram_char_frac: n-gram size"),
    ({0: 0.2}, r"filters\.top_ngram_char_frac: n-gram size"), ({2.5: 0.2}, r"n-gram size"),
    ({"3": -0.1}, r"filters\.top_ngram_char_frac\.3 "),
])
def test_ngram_tables_are_validated_key_by_key(table, message):
    with pytest.raises(RecipeError, match=message):
        validate(FilterSpec(top_ngram_char_frac=table))


def test_min_above_max_names_both_fields():
    with pytest.raises(RecipeError, match=r"filters\.min_words \(50\) exceeds filters\.max_words \(10\)"):
        QualityFilter(FilterSpec(min_words=50, max_words=10))
    with pytest.raises(RecipeError, match=r"filters\.min_mean_word_length"):
        QualityFilter(FilterSpec(min_mean_word_length=12))


def test_valid_specs_pass_validation():
    QualityFilter(FilterSpec())
    QualityFilter(FilterSpec(top_ngram_char_frac={"2": 0.2, "3": None}, dup_ngram_char_frac=None, language="de"))
    QualityFilter(FilterSpec(**DEMO_OVERRIDES))


def test_unknown_language_code_is_rejected():
    with pytest.raises(RecipeError, match=r"filters\.language 'english' is not a langdetect language"):
        QualityFilter(FilterSpec(language="english"))


def test_missing_langdetect_says_how_to_install(monkeypatch):
    monkeypatch.setattr(filters, "_detector_factory", None)
    monkeypatch.setitem(sys.modules, "langdetect", None)
    monkeypatch.setitem(sys.modules, "langdetect.detector_factory", None)
    with pytest.raises(RecipeError, match="pip install langdetect"):
        QualityFilter(FilterSpec(language="en"))
    assert QualityFilter(FilterSpec()).spec.language is None   # not needed without a language


# ---- language ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("foreign", [GERMAN, FRENCH])
def test_language_filter_keeps_english_and_removes_german_and_french(foreign):
    spec = FilterSpec(language="en", min_stop_words=None)   # the stop-word rule alone drops them too
    assert check(CLEAN, spec) is None
    assert check(foreign, spec) == "language"
    assert check(foreign, FilterSpec(language="de" if foreign is GERMAN else "fr", min_stop_words=None)) is None
    assert language_score(foreign, "en") < 0.1


def test_language_detection_is_deterministic():
    mixed = "Le vieux phare. The old lighthouse stood there. Der alte Leuchtturm."
    assert len({language_score(mixed, "en") for _ in range(5)}) == 1


# ---- the demo corpus ---------------------------------------------------------------------------------

def test_demo_corpus_passes_with_the_demo_overrides_and_not_with_gopher_defaults():
    docs = [r["text"] for r in World.generate(seed=0, n_entities=40).pretrain_corpus(n_docs=6000, seed=1)]
    demo = QualityFilter(FilterSpec(**DEMO_OVERRIDES))
    assert [demo(d) for d in docs].count(None) == 6000
    gopher = QualityFilter(FilterSpec())
    for d in docs:
        gopher(d)
    removed = gopher.stats.as_dict()["removed"]
    assert removed["min_mean_word_length"] == sum(r["domain"] == "math" for r in
                                                  World.generate(0, 40).pretrain_corpus(6000, seed=1))
    assert set(removed) <= {"min_mean_word_length", "stop_words", "top_2gram_char_frac", "top_3gram_char_frac",
                            "top_4gram_char_frac", "dup_5gram_char_frac"}
