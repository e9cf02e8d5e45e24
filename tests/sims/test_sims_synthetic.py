"""Synthetic pools: valid, seeded, with the mismatch they promise, and named errors."""

import numpy as np
import pytest

from sims import synthetic
from sims.pools import PairPool


@pytest.mark.parametrize(
    "make",
    [
        lambda seed: synthetic.dirichlet_pool(0.1, num_pairs=300, seed=seed),
        lambda seed: synthetic.dirichlet_pool(2.0, vocab_size=10, num_pairs=300, seed=seed),
        lambda seed: synthetic.zipf_pool(1.2, noise=0.3, num_pairs=200, seed=seed),
        lambda seed: synthetic.peaked_pool(0.95, num_pairs=300, seed=seed),
    ],
)
def test_pools_are_valid_and_seeded(make):
    pool = make(4)
    for rows in (pool.target_probs, pool.draft_probs):
        assert np.all(rows >= 0)
        np.testing.assert_allclose(rows.sum(axis=1), 1.0, atol=1e-12)
    again, other = make(4), make(5)
    np.testing.assert_array_equal(pool.target_probs, again.target_probs)
    np.testing.assert_array_equal(pool.draft_probs, again.draft_probs)
    assert not np.array_equal(pool.target_probs, other.target_probs)


@pytest.mark.parametrize("tv", [0.2, 0.4, 0.7])
def test_zipf_mismatch_is_dialled_exactly(tv):
    pool = synthetic.zipf_pool_at_tv(tv, num_pairs=200, vocab_size=100)
    measured = 0.5 * np.abs(pool.target_probs - pool.draft_probs).sum(axis=1).mean()
    assert measured == pytest.approx(tv, abs=1e-8)


def test_peaked_verifier_is_one_hot_ish_and_agreement_is_respected():
    pool = synthetic.peaked_pool(0.9, agreement=1.0, num_pairs=500)
    assert np.all(pool.target_probs.max(axis=1) >= 0.9)
    agree = np.argmax(pool.target_probs, 1) == np.argmax(pool.draft_probs, 1)
    assert agree.all()
    never = synthetic.peaked_pool(0.9, agreement=0.0, num_pairs=500)
    assert not np.any(np.argmax(never.target_probs, 1) == np.argmax(never.draft_probs, 1))


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: synthetic.dirichlet_pool(0.0), "concentration"),
        (lambda: synthetic.dirichlet_pool(1.0, vocab_size=1), "vocab_size"),
        (lambda: synthetic.dirichlet_pool(1.0, num_pairs=0), "num_pairs"),
        (lambda: synthetic.zipf_pool(noise=-1.0), "noise"),
        (lambda: synthetic.zipf_pool_at_tv(1.5), "tv"),
        (lambda: synthetic.zipf_pool_at_tv(0.001, num_pairs=50), "tv"),
        (lambda: synthetic.peaked_pool(1.2), "mass"),
    ],
)
def test_bad_settings_are_named(make, argument):
    with pytest.raises(ValueError, match=f"^{argument}"):
        make()


def test_an_empty_source_is_an_error():
    with pytest.raises(ValueError, match="^target_probs: the source 'empty' is empty"):
        PairPool.full("empty", np.zeros((0, 5)), np.zeros((0, 5)))
    with pytest.raises(ValueError, match="^target"):
        PairPool.full("bad", np.full((2, 3), 0.5), np.full((2, 3), 1 / 3))
