"""Compact rows are exact: processing and every rule give what the full rows give."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cactus_theory import law, rules
from cactus_theory.core import processors
from cactus_theory.core.processors import SamplingSettings
from sims import rows

SETTINGS = [
    processors.PAPER_SETTING,
    processors.PLAIN_SETTING,
    SamplingSettings(temperature=0.0),
    SamplingSettings(temperature=0.8, top_k=3),
    SamplingSettings(temperature=1.3, top_p=0.7),
    SamplingSettings(temperature=0.6, top_k=5, top_p=0.5),
]


def _rows_with_ties(seed: int, count: int = 40, vocab: int = 30) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = rng.dirichlet(np.full(vocab, 0.3), count)
    raw = np.round(raw, 2) + 1e-4  # many exact ties
    return raw / raw.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("sampling", SETTINGS, ids=lambda s: s.label)
@pytest.mark.parametrize("seed", [0, 1])
def test_process_equals_the_full_processors(sampling, seed):
    dense = _rows_with_ties(seed)
    compact = rows.process(dense, sampling)
    expected = processors.process_probs(dense, sampling)
    np.testing.assert_allclose(compact.dense(), expected, atol=1e-15)
    real = compact.ids < 30
    assert np.all(np.diff(compact.ids, axis=1)[real[:, 1:]] > 0)  # ascending ids
    assert np.all(np.diff(real.astype(int), axis=1) <= 0)  # padding only at the end
    assert np.all(compact.probs[real] > 0) and np.all(compact.probs[~real] == 0)


def test_align_keeps_both_rows_exactly():
    target = rows.process(_rows_with_ties(2), processors.PAPER_SETTING)
    draft = rows.process(_rows_with_ties(3), processors.PAPER_SETTING)
    aligned = rows.align(target, draft)
    for values, source in ((aligned.target_probs, target), (aligned.draft_probs, draft)):
        rebuilt = rows.CompactRows(aligned.ids, values, 30).dense()
        np.testing.assert_array_equal(rebuilt, source.dense())


SPECS = [
    "sps",
    "cactus:delta=0.5",
    "cactus-exact:delta=0.5",
    "frontier:delta=0.3",
    "interp:alpha=0.4",
    "tas",
    "topk:k=1",
    "topk:k=4",
    "topk:k=12",
    "greedy",
]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), spec=st.sampled_from(SPECS))
def test_rules_on_compact_rows_equal_rules_on_full_rows(seed, spec):
    sampling = SamplingSettings(temperature=0.7, top_k=6, top_p=0.9)
    target_dense = processors.process_probs(_rows_with_ties(seed, 8), sampling)
    draft_dense = processors.process_probs(_rows_with_ties(seed + 1, 8), sampling)
    aligned = rows.align(rows.from_dense(target_dense), rows.from_dense(draft_dense))
    rule = rules.parse(spec)

    def spread(values):
        return rows.CompactRows(aligned.ids, values, 30).dense()

    full_accept = rule.accept_probs(target_dense, draft_dense)
    compact_accept = rule.accept_probs(aligned.target_probs, aligned.draft_probs)
    drafted = draft_dense > 0
    np.testing.assert_allclose(spread(compact_accept)[drafted], full_accept[drafted], atol=1e-12)
    full_law = law.output_law_rows(rule, target_dense, draft_dense)
    compact_law = law.output_law_rows(rule, aligned.target_probs, aligned.draft_probs)
    np.testing.assert_allclose(spread(compact_law), full_law, atol=1e-12)


def test_column_of_rejects_a_missing_token():
    aligned = rows.align(
        rows.from_dense(np.array([[0.5, 0.5, 0.0]])), rows.from_dense(np.array([[1.0, 0, 0]]))
    )
    assert aligned.column_of(np.array([1]))[0] == 1
    with pytest.raises(ValueError, match="^tokens"):
        aligned.column_of(np.array([2]))


@pytest.mark.parametrize("limit", [200_000, 5, 0])
def test_a_row_memo_returns_exactly_what_it_would_compute(limit):
    """``RowMemo`` against the function it memoises, on batches with repeated and new
    contexts, before and after its table is full (limit 5, 0): the same ids, probs and
    width, to the last bit; and it computes each context at most once while it has room."""
    rng = np.random.default_rng(0)
    vocab = 50
    table = rng.dirichlet(np.full(vocab, 0.2), size=vocab * vocab)  # a bigram-of-pairs model
    calls = []

    def compute(contexts):
        calls.append(len(contexts))
        dense = table[contexts[:, 0] * vocab + contexts[:, 1]]
        return rows.process(dense, SamplingSettings(0.7, 5, 0.9))

    memo = rows.RowMemo(compute, vocab, limit=limit)
    pool = rng.integers(0, vocab, size=(12, 2))
    for _ in range(6):
        contexts = pool[rng.integers(0, len(pool), size=rng.integers(1, 20))]
        expected = compute(contexts)
        got = memo(contexts)
        np.testing.assert_array_equal(got.ids, expected.ids)
        np.testing.assert_array_equal(got.probs, expected.probs)
    if limit >= len(pool):
        assert memo.misses <= len(pool) and memo.hits > 0
