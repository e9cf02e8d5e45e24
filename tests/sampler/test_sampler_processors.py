"""The torch processors equal the numpy reference (``cactus_theory.processors``).

float64 logits: identical masks and values to 1e-12, ties included (duplicated logits and
a tie at the top-k boundary). float32 logits: identical masks except where the top-p
boundary mass is within 1e-5 of top_p (counted), values to 1e-5.
"""

import numpy as np
import pytest
import torch

from cactus_theory.core import processors
from cactus_theory.core.processors import SamplingSettings
from cactus_theory.sampler.processors import process_logits

SETTINGS = [
    SamplingSettings(temperature=1.0),
    SamplingSettings(temperature=0.6, top_k=20, top_p=0.95),
    SamplingSettings(temperature=0.7, top_k=5),
    SamplingSettings(temperature=1.3, top_p=0.8),
    SamplingSettings(temperature=0.0),
    SamplingSettings(temperature=0.0, top_k=3, top_p=0.5),
    SamplingSettings(temperature=1.0, top_k=1),
    SamplingSettings(temperature=1.0, top_k=500, top_p=1.0),
]


def logits_with_ties(seed, rows=300, vocab=64):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.0, size=(rows, vocab))
    logits[:, 1] = logits[:, 0]  # exact ties
    logits[::3, 2:6] = logits[::3, 7:8]  # a tie group, often at a boundary
    logits[::5, 10] = -np.inf  # masked tokens
    logits[7] = 0.0  # a uniform row
    return logits


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: s.label)
def test_float64_matches_numpy_exactly(settings):
    logits = logits_with_ties(0)
    expected = processors.process_logits(logits, settings)
    got = process_logits(torch.tensor(logits), settings).numpy()
    np.testing.assert_array_equal(got > 0, expected > 0)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: s.label)
def test_float32_matches_numpy_except_counted_boundary_ties(settings):
    logits = logits_with_ties(1).astype(np.float32)
    got = process_logits(torch.tensor(logits), settings).numpy()
    expected = processors.process_logits(logits.astype(np.float64), settings)
    near = np.zeros(len(logits), dtype=bool)
    if settings.temperature > 0 and settings.top_p < 1.0:
        # the mass strictly above each token, in the reference after top-k
        probs = processors.process_logits(
            logits.astype(np.float64),
            SamplingSettings(settings.temperature, settings.top_k, 1.0),
        )
        above = np.array([[row[row > value].sum() for value in row] for row in probs])
        near = (np.abs(above - settings.top_p) < 1e-5).any(axis=1)
    assert near.sum() <= 0.01 * len(logits)
    np.testing.assert_array_equal((got > 0)[~near], (expected > 0)[~near])
    np.testing.assert_allclose(got[~near], expected[~near], rtol=1e-5, atol=1e-6)


def test_greedy_is_the_first_argmax():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    got = process_logits(logits, SamplingSettings(temperature=0.0))
    assert got.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]


def test_batched_leading_axes():
    logits = torch.tensor(logits_with_ties(2, rows=24)).reshape(2, 3, 4, 64)
    settings = SamplingSettings(temperature=0.6, top_k=20, top_p=0.95)
    got = process_logits(logits, settings)
    expected = processors.process_logits(logits.numpy(), settings)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("top_k", [1, 3, 20])
def test_top_p_on_the_top_k_candidates_equals_the_full_sort(top_k):
    """process_logits finds the top-p threshold among the top-k survivors only (a topk
    instead of a sort over V); the mask is the one the full sort gives, ties included."""
    from cactus_theory.sampler import processors as torch_processors

    logits = torch.tensor(logits_with_ties(3, rows=200, vocab=300))
    probs = torch.softmax(logits / 0.6, dim=-1)
    keep = torch_processors.top_k_mask(probs, top_k)
    probs = torch.where(keep, probs, 0.0)
    probs = probs / probs.sum(-1, keepdim=True)
    candidates = int(keep.sum(-1).max())
    assert candidates >= top_k
    for top_p in (0.3, 0.8, 0.95, 0.999):
        full = torch_processors.top_p_mask(probs, top_p)
        fast = torch_processors.top_p_mask(probs, top_p, candidates)
        assert torch.equal(full, fast)
        assert full.any(dim=-1).all()


@pytest.mark.parametrize("top_p", [1.0, 0.95, 0.5])
@pytest.mark.parametrize("top_k", [1, 20, 63])
def test_the_top_k_first_path_equals_the_general_path(top_k, top_p):
    """With top-k set, rows without a tie at the k-th logit are processed from their k
    largest logits alone; rows with such a tie take the general path. Both kinds sit in
    one batch here (the tie rows are counted), and every row equals the general path."""
    from cactus_theory.sampler import processors as torch_processors

    logits = torch.tensor(logits_with_ties(4, rows=200, vocab=64))
    settings = SamplingSettings(temperature=0.6, top_k=top_k, top_p=top_p)
    values = torch.sort(logits, dim=-1, descending=True).values
    tied = values[:, top_k] == values[:, top_k - 1]
    assert 0 < int(tied.sum()) < len(logits)  # both paths are exercised
    fast = torch_processors.process_logits(logits, settings)
    general = torch_processors._general(logits, settings)
    assert torch.equal(fast > 0, general > 0)
    torch.testing.assert_close(fast, general, rtol=1e-12, atol=1e-15)
