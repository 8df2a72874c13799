"""Deduplication on a corpus with known injected duplicates (2–5 % of words edited)."""
from __future__ import annotations

import pytest

from smolforge.data.dedup import DedupSpec, dedup_paragraphs, deduplicate, detection_curve, detection_probability, shingles
from smolforge.data.synthetic import duplicate_corpus


def score(texts, exact, near, report):
    removed = set(range(len(texts))) - set(report.keep)
    originals = set(exact.values()) | set(near.values())
    recall = sum(1 for copy, source in near.items() if copy in removed or source in removed) / len(near)
    wrongly_removed = removed - set(exact) - set(near) - originals
    unique = len(texts) - len(exact) - len(near)
    residual = sum(1 for copy, source in near.items() if copy not in removed and source not in removed)
    return recall, len(wrongly_removed) / unique, residual / len(report.keep)


@pytest.fixture(scope="module")
def corpus():
    return duplicate_corpus(n_unique=2000, n_exact=60, n_near=80, seed=5)


def test_defaults_catch_edited_copies_without_removing_distinct_documents(corpus):
    texts, exact, near = corpus
    report = deduplicate(texts)
    recall, false_rate, residual_rate = score(texts, exact, near, report)
    assert recall >= 0.95
    assert false_rate <= 0.01
    assert residual_rate < 0.01
    assert report.exact_removed == 60
    assert len(report.keep) == len(texts) - report.exact_removed - report.near_removed


def test_a_090_jaccard_threshold_would_miss_most_of_them(corpus):
    # the playbook's "90 % similar" read as Jaccard: bands x rows tuned for ~0.9 catch few edits
    texts, exact, near = corpus
    strict = deduplicate(texts, DedupSpec(bands=4, rows=32))
    recall, _, _ = score(texts, exact, near, strict)
    assert detection_curve(4, 32)[0] > 0.9 and recall < 0.5


def test_edited_copies_sit_where_the_defaults_catch_them(corpus):
    texts, _, near = corpus
    copy, source = next(iter(near.items()))
    a, b = shingles(texts[copy], 5), shingles(texts[source], 5)
    jaccard = len(a & b) / len(a | b)
    assert 0.5 < jaccard < 0.9
    assert detection_probability(jaccard, 25, 5) > 0.5
    half, most = detection_curve(25, 5)
    assert 0.45 < half < 0.55 and 0.6 < most < 0.7


def test_several_workers_give_the_same_answer(corpus):
    texts, _, _ = corpus
    one = deduplicate(texts[:600], DedupSpec(workers=1))
    two = deduplicate(texts[:600], DedupSpec(workers=2))
    assert one.keep == two.keep


def test_paragraphs_seen_before_are_dropped():
    texts = ["Intro one.\n\nShared boilerplate footer.", "Intro two.\n\nShared  BOILERPLATE footer!"]
    kept, removed = dedup_paragraphs(texts)
    assert removed == 1 and kept == ["Intro one.\n\nShared boilerplate footer.", "Intro two."]


def test_banding_wider_than_the_signature_is_refused():
    with pytest.raises(ValueError, match="exceeds num_perm"):
        deduplicate(["a b c"], DedupSpec(bands=30, rows=5, num_perm=128))
