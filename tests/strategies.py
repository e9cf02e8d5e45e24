"""Hypothesis strategies over the probability simplex (V from 2 to 64).

Rows come in several shapes, because the edge cases are where rules break: dense rows,
sparse rows (exact zeros), near-one-hot rows (one entry 1 − ε with ε down to 1e−12, or
exactly one-hot), and Dirichlet rows at concentrations from very peaked to flat.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

MAX_VOCAB = 64


#: Probabilities below this are set to 0: products of subnormal numbers underflow, so
#: rows with subnormal entries cannot keep h_i > 0 where q_i > 0 (a float64 limit).
SMALLEST = 1e-300


def _normalise(weights: np.ndarray) -> np.ndarray:
    weights = np.where(weights < SMALLEST * weights.max(), 0.0, weights)
    return weights / weights.sum()


@st.composite
def simplex_rows(draw, vocab_size: int) -> np.ndarray:
    """One probability row of length ``vocab_size``."""
    kind = draw(st.sampled_from(["dense", "sparse", "near_one_hot", "dirichlet"]))
    if kind == "dirichlet":
        seed = draw(st.integers(0, 2**32 - 1))
        concentration = draw(st.sampled_from([0.02, 0.1, 0.5, 1.0, 5.0]))
        row = np.random.default_rng(seed).dirichlet(np.full(vocab_size, concentration))
        # Dirichlet rows with tiny concentration can underflow to exact zeros; keep a support.
        return _normalise(row) if row.max() > 0 else np.eye(vocab_size)[0]
    weights = np.array(
        draw(st.lists(st.floats(0.0, 1.0), min_size=vocab_size, max_size=vocab_size)),
        dtype=np.float64,
    )
    if kind == "sparse":
        keep = np.array(draw(st.lists(st.booleans(), min_size=vocab_size, max_size=vocab_size)))
        weights = np.where(keep, weights, 0.0)
    if kind == "near_one_hot":
        peak = draw(st.integers(0, vocab_size - 1))
        epsilon = draw(st.sampled_from([0.0, 1e-12, 1e-9, 1e-6, 1e-3, 1e-2]))
        rest = np.delete(weights, peak)
        rest = rest / rest.sum() * epsilon if rest.sum() > 0 else rest * 0.0
        row = np.insert(rest, peak, 1.0 - rest.sum())
        return _normalise(row)
    if weights.sum() <= 0:
        weights[draw(st.integers(0, vocab_size - 1))] = 1.0
    return _normalise(weights)


@st.composite
def pairs(draw, min_vocab: int = 2, max_vocab: int = MAX_VOCAB):
    """(target_probs, draft_probs) over the same vocabulary."""
    vocab_size = draw(st.integers(min_vocab, max_vocab))
    return draw(simplex_rows(vocab_size)), draw(simplex_rows(vocab_size))


@st.composite
def pairs_with_token(draw, min_vocab: int = 2, max_vocab: int = MAX_VOCAB):
    """(target_probs, draft_probs, token) with draft_probs[token] > 0."""
    target_probs, draft_probs = draw(pairs(min_vocab, max_vocab))
    support = np.flatnonzero(draft_probs > 0)
    token = int(draw(st.sampled_from(support.tolist())))
    return target_probs, draft_probs, token


budgets = st.sampled_from([0.0, 1e-10, 1e-4, 0.01, 0.05, 0.1, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0])
positive_budgets = st.sampled_from([1e-10, 1e-4, 0.01, 0.05, 0.1, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0])
