"""Hypothesis strategies over what a rule sees: probability rows, (target, draft) pairs,
drafted tokens, processed rows and budgets.

The edge cases are where rules break, so every row strategy mixes shapes on purpose:
dense rows, sparse rows (exact zeros), ties (repeated values), one-hot rows, near-one-hot
rows (one entry 1 − ε, ε down to 1e−12), rows with masses near 1e−300, and Dirichlet rows
from very peaked to flat. Pairs add disjoint supports (the draft puts mass only where the
target has none) and rows after the samplers' processors (temperature, top-k, top-p).

>>> from hypothesis import given
>>> from cactus_theory.testing import strategies
>>> @given(strategies.pairs(max_vocab=16))
... def test_acceptance_is_a_probability(pair):
...     target, draft = pair
...     ...

Every strategy returns float64 numpy rows that sum to 1 within 1e−12. Vocabulary sizes run
from ``min_vocab`` to ``max_vocab`` (``large_pairs`` goes to 10^5 with a draft of small
support, as after top-k, so that O(V·support) checks stay fast).

hypothesis is an optional dependency (``pip install "cactus-theory[testing]"``);
importing this module without it raises ImportError saying so.
"""

from __future__ import annotations

import numpy as np

try:
    from hypothesis import strategies as st
except ImportError as error:  # pragma: no cover - exercised only without hypothesis
    raise ImportError(
        'cactus_theory.testing.strategies needs hypothesis: pip install "cactus-theory[testing]"'
    ) from error

from cactus_theory.core import processors

#: Probabilities below this fraction of a row's largest entry are set to 0 (products of
#: subnormal numbers underflow; a float64 limit, not a rule's).
SMALLEST = 1e-300
#: The kinds of row ``rows`` draws.
KINDS = ("dense", "sparse", "ties", "one_hot", "near_one_hot", "tiny", "dirichlet")


def _normalise(weights: np.ndarray) -> np.ndarray:
    weights = np.where(weights < SMALLEST * weights.max(), 0.0, weights)
    return weights / weights.sum()


@st.composite
def rows(draw, vocab_size: int, kinds: tuple[str, ...] = KINDS) -> np.ndarray:
    """One probability row of length ``vocab_size``, of a kind drawn from ``kinds``."""
    kind = draw(st.sampled_from(kinds))
    if vocab_size == 1:
        return np.ones(1)
    if kind == "dirichlet":
        seed = draw(st.integers(0, 2**32 - 1))
        concentration = draw(st.sampled_from([0.02, 0.1, 0.5, 1.0, 5.0]))
        row = np.random.default_rng(seed).dirichlet(np.full(vocab_size, concentration))
        return _normalise(row) if row.max() > 0 else np.eye(vocab_size)[0]
    if kind == "one_hot":
        return np.eye(vocab_size)[draw(st.integers(0, vocab_size - 1))]
    seed = draw(st.integers(0, 2**32 - 1))
    weights = np.random.default_rng(seed).random(vocab_size)
    if kind == "sparse":
        keep = np.random.default_rng(seed + 1).random(vocab_size) < 0.4
        keep[draw(st.integers(0, vocab_size - 1))] = True
        weights = np.where(keep, weights, 0.0)
    elif kind == "ties":
        levels = np.array([0.0, 0.1, 0.3, 0.3, 0.6, 1.0])
        weights = levels[np.random.default_rng(seed).integers(0, levels.size, vocab_size)]
        if weights.sum() <= 0:
            weights[0] = 1.0
    elif kind == "near_one_hot":
        peak = draw(st.integers(0, vocab_size - 1))
        epsilon = draw(st.sampled_from([0.0, 1e-12, 1e-9, 1e-6, 1e-3, 1e-2]))
        rest = np.delete(weights, peak)
        rest = rest / rest.sum() * epsilon
        return _normalise(np.insert(rest, peak, 1.0 - rest.sum()))
    elif kind == "tiny":
        # Most of the mass on a few tokens, the rest near the float64 floor.
        exponents = np.random.default_rng(seed).uniform(-299, -250, vocab_size)
        weights = 10.0**exponents
        weights[draw(st.integers(0, vocab_size - 1))] = 1.0
    return _normalise(weights)


@st.composite
def pairs(draw, min_vocab: int = 1, max_vocab: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """(target_probs, draft_probs) over one vocabulary of size in [min_vocab, max_vocab];
    one pair in ten has disjoint supports."""
    vocab_size = draw(st.integers(min_vocab, max_vocab))
    if vocab_size >= 2 and draw(st.integers(0, 9)) == 0:
        return draw(disjoint_pairs(vocab_size))
    return draw(rows(vocab_size)), draw(rows(vocab_size))


@st.composite
def disjoint_pairs(draw, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """A pair whose supports do not meet: the draft puts mass only where q = 0."""
    split = draw(st.integers(1, vocab_size - 1))
    target = np.zeros(vocab_size)
    draft = np.zeros(vocab_size)
    target[:split] = draw(rows(split))
    draft[split:] = draw(rows(vocab_size - split))
    order = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).permutation(vocab_size)
    return target[order], draft[order]


@st.composite
def pairs_with_token(draw, min_vocab: int = 1, max_vocab: int = 32):
    """(target_probs, draft_probs, token) with draft_probs[token] > 0."""
    target, draft = draw(pairs(min_vocab, max_vocab))
    token = int(draw(st.sampled_from(np.flatnonzero(draft > 0).tolist())))
    return target, draft, token


@st.composite
def processed_pairs(draw, min_vocab: int = 2, max_vocab: int = 64):
    """A pair as a decoder sees it: logits of both models through the same temperature,
    top-k and top-p (``core.processors``), so both rows have few nonzero entries."""
    vocab_size = draw(st.integers(min_vocab, max_vocab))
    seed = draw(st.integers(0, 2**32 - 1))
    generator = np.random.default_rng(seed)
    logits = generator.normal(size=vocab_size) * draw(st.sampled_from([0.5, 2.0, 5.0]))
    noise = generator.normal(size=vocab_size) * draw(st.sampled_from([0.1, 1.0, 3.0]))
    settings = processors.SamplingSettings(
        temperature=draw(st.sampled_from([0.3, 0.6, 1.0])),
        top_k=draw(st.sampled_from([None, 1, 5, 20])),
        top_p=draw(st.sampled_from([1.0, 0.95, 0.8])),
    )
    return (
        processors.process_logits(logits, settings),
        processors.process_logits(logits + noise, settings),
    )


@st.composite
def large_pairs(draw, max_vocab: int = 100_000, draft_support: int = 64):
    """A pair over a vocabulary of up to ``max_vocab`` (10, 1,000, ..., 10^5 and sizes in
    between): a dense Dirichlet target and a draft on at most ``draft_support`` tokens."""
    vocab_size = draw(
        st.sampled_from([v for v in (10, 257, 1_000, 49_152, 100_000) if v <= max_vocab])
    )
    generator = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    target = _normalise(generator.dirichlet(np.full(vocab_size, 0.05)))
    support = generator.choice(vocab_size, size=min(draft_support, vocab_size), replace=False)
    draft = np.zeros(vocab_size)
    draft[support] = generator.dirichlet(np.full(support.size, 0.3))
    return target, _normalise(draft)


def everyday_pairs():
    """Pairs of every kind (V up to 32) or after the processors (V up to 64): what the
    kit's law checks draw from."""
    return st.one_of(pairs(1, 32), processed_pairs(2, 64))


#: Divergence budgets from none to generous (nats).
budgets = st.sampled_from([0.0, 1e-10, 1e-4, 0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.0, 5.0])
#: The same without 0.
positive_budgets = st.sampled_from([1e-10, 1e-4, 0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.0, 5.0])
