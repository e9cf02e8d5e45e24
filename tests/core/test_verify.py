"""The numpy reference verify step: layout, validity, and Monte Carlo against exact laws.

Sampling tests use fixed seeds and the level ``goodness_of_fit.LEVEL`` (1e-3); each has a
negative control, a deliberately wrong sampler, that the same test must reject.
"""

from __future__ import annotations

import numpy as np
import pytest
from goodness_of_fit import LEVEL, chi_square_pvalue
from hypothesis import given
from hypothesis import strategies as st

from cactus_theory import law, rules
from cactus_theory.core import block
from cactus_theory.core.verify import inverse_cdf, verify_block
from cactus_theory.testing.strategies import pairs

SAMPLES = 100_000
RULES = [
    "sps",
    "cactus:delta=0.5",
    "cactus-exact:delta=0.3",
    "cactus-exact:delta=0.2,divergence=hellinger",
    "frontier:delta=0.1",
    "interp:alpha=0.4",
    "tas:epsilon=0.3",
    "topk:k=3",
    "greedy",
]


def instance(seed: int = 11, vocab: int = 12, concentration: float = 0.7):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(vocab, concentration)), rng.dirichlet(
        np.full(vocab, concentration)
    )


def first_position(rule, target, draft, samples=SAMPLES, seed=0):
    """Emitted token and acceptance at one position (k = 1), sampled with verify_block."""
    rng = np.random.default_rng(seed)
    vocab = target.shape[0]
    drafted = rng.choice(vocab, size=(samples, 1), p=draft)
    tokens, accepted = verify_block(
        rule,
        np.broadcast_to(target, (samples, 2, vocab)),
        np.broadcast_to(draft, (samples, 1, vocab)),
        drafted,
        rng.random((samples, 1)),
        rng.random(samples),
    )
    return tokens[:, 0], accepted


@pytest.mark.parametrize("spec", RULES)
def test_sampled_emissions_follow_the_exact_law(spec):
    rule = rules.parse(spec)
    target, draft = instance()
    emitted, accepted = first_position(rule, target, draft)
    exact = law.output_law(rule, target, draft)
    counts = np.bincount(emitted, minlength=target.shape[0])
    assert chi_square_pvalue(counts, exact) > LEVEL
    rate = law.acceptance(rule, target, draft)
    spread = 4.5 * np.sqrt(max(rate * (1 - rate), 1e-12) / SAMPLES)
    assert abs(accepted.mean() - rate) <= spread + 1e-12


def test_negative_control_wrong_residual_is_rejected():
    """Cactus acceptance with SpS's residual (q − p)_+ is a real bug class; catch it.

    On this instance the wrong sampler's law is far enough from the exact one that the
    chi-square noncentrality at N = 1e5 is about 240 (power ~1 at level 1e-3).
    """
    rule = rules.make("cactus", delta=0.1)
    target, draft = instance(seed=6, vocab=8, concentration=0.4)
    rng = np.random.default_rng(1)
    drafted = rng.choice(target.shape[0], size=SAMPLES, p=draft)
    accept = rule.accept_probs(target, draft)[drafted] > rng.random(SAMPLES)
    wrong_residual = rules.make("sps").residuals_for(target, draft, np.array(0))
    recovered = inverse_cdf(
        np.broadcast_to(wrong_residual, (SAMPLES, target.shape[0])), rng.random(SAMPLES)
    )
    emitted = np.where(accept, drafted, recovered)
    counts = np.bincount(emitted, minlength=target.shape[0])
    assert chi_square_pvalue(counts, law.output_law(rule, target, draft)) < LEVEL


def test_negative_control_target_law_is_not_the_cactus_law():
    """The emitted law of cactus is not q: sampling cactus and testing against q must fail."""
    rule = rules.make("cactus", delta=0.5)
    target, draft = instance()
    emitted, _ = first_position(rule, target, draft, seed=2)
    counts = np.bincount(emitted, minlength=target.shape[0])
    assert chi_square_pvalue(counts, target) < LEVEL


def test_accepted_length_follows_block_statistics():
    rule = rules.make("cactus-exact", delta=0.2)
    target, draft = instance(seed=5)
    k, samples = 4, 50_000
    rng = np.random.default_rng(3)
    vocab = target.shape[0]
    drafted = rng.choice(vocab, size=(samples, k), p=draft)
    _, accepted = verify_block(
        rule,
        np.broadcast_to(target, (samples, k + 1, vocab)),
        np.broadcast_to(draft, (samples, k, vocab)),
        drafted,
        rng.random((samples, k)),
        rng.random(samples),
    )
    alpha = law.acceptance(rule, target, draft)
    expected = block.accepted_length_distribution(alpha, k)
    assert chi_square_pvalue(np.bincount(accepted, minlength=k + 1), expected) > LEVEL
    # Negative control: the same counts against a wrong rate must fail.
    wrong = block.accepted_length_distribution(alpha * 0.97, k)
    assert chi_square_pvalue(np.bincount(accepted, minlength=k + 1), wrong) < LEVEL


@given(pairs(max_vocab=20), st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_layout_and_validity(pair, k, seed):
    target, draft = pair
    rng = np.random.default_rng(seed)
    vocab = target.shape[0]
    batch = 16
    drafted = rng.choice(vocab, size=(batch, k), p=draft)
    accept_u = rng.random((batch, k))
    accept_u[0] = 0.0  # u = 0 accepts every token with positive acceptance probability
    sample_u = rng.random(batch)
    sample_u[1] = np.nextafter(1.0, 0.0)  # the top of [0, 1) must not run off the end
    for spec in RULES:
        rule = rules.parse(spec)
        tokens, accepted = verify_block(
            rule,
            np.broadcast_to(target, (batch, k + 1, vocab)),
            np.broadcast_to(draft, (batch, k, vocab)),
            drafted,
            accept_u,
            sample_u,
        )
        assert tokens.shape == (batch, k + 1) and accepted.shape == (batch,)
        for row in range(batch):
            n = accepted[row]
            assert np.array_equal(tokens[row, :n], drafted[row, :n])
            assert 0 <= tokens[row, n] < vocab
            assert np.all(tokens[row, n + 1 :] == -1)
            emitted = tokens[row, n]
            if n == k:
                assert target[emitted] > 0  # bonus from the verifier's next distribution
            else:
                residual = rule.residuals_for(target, draft, np.array(drafted[row, n]))
                assert residual[emitted] > 0


@given(st.integers(2, 30), st.integers(0, 2**32 - 1))
def test_inverse_cdf_never_returns_a_zero_probability_token(vocab, seed):
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(vocab), size=50) * (rng.random((50, vocab)) < 0.4)
    probs[:, -1] = 0.0
    probs[probs.sum(axis=1) == 0, 0] = 1.0
    probs /= probs.sum(axis=1, keepdims=True)
    uniforms = np.concatenate([rng.random(48), [0.0, np.nextafter(1.0, 0.0)]])
    picked = inverse_cdf(probs, uniforms)
    assert np.all(probs[np.arange(50), picked] > 0)


def test_bad_inputs():
    target, draft = instance()
    rule = rules.make("sps")
    good = dict(
        target_probs=np.broadcast_to(target, (2, 2, 12)),
        draft_probs=np.broadcast_to(draft, (2, 1, 12)),
        draft_ids=np.zeros((2, 1), dtype=int),
        accept_uniforms=np.zeros((2, 1)),
        sample_uniforms=np.zeros(2),
    )
    cases = [
        ({"draft_ids": np.full((2, 1), 12)}, r"draft_ids: ids must lie in \[0, 12\)"),
        ({"draft_ids": np.zeros((2, 2), dtype=int)}, "draft_ids: expected integer ids"),
        ({"target_probs": np.broadcast_to(target, (2, 3, 12))}, "target_probs: shape"),
        (
            {"accept_uniforms": np.full((2, 1), 1.5)},
            r"accept_uniforms: values must lie in \[0, 1\]",
        ),
        ({"sample_uniforms": np.zeros(3)}, "accept_uniforms: expected shape"),
        ({"draft_probs": np.full((2, 1, 12), np.nan)}, "draft_probs: contains NaN"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            verify_block(rule, **{**good, **change})
