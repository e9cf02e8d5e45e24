"""``sampler.law``: the torch exact law of the emitted token equals the numpy
``law.output_law`` for every rule (float64, to 1e-12), and ``emitted_divergence`` (the
decoder's meter) equals numpy's KL and TV of that law, on full rows and on large sparse
rows that it first packs to their support."""

import numpy as np
import pytest
import torch

from cactus_theory import divergences, law, rules
from cactus_theory.sampler import law as torch_law

SPECS = [
    "sps",
    "cactus:delta=0.5",
    "cactus:delta=0",
    "cactus-exact:delta=0.3",
    "cactus-exact:delta=0.1,divergence=js",
    "cactus-exact:delta=0.2,divergence=tv",
    "frontier:delta=0.2",
    "frontier:delta=0",
    "pareto:spread=1.0",
    "interp:alpha=0.3",
    "tas",
    "topk:k=3",
    "topk:k=40",
    "greedy",
]


def sparse_rows(seed: int, rows: int, vocab: int, alive: int):
    """Rows with ``alive`` random nonzero entries each (as after top-k), q and p sharing
    some of them, plus exact zeros elsewhere."""
    rng = np.random.default_rng(seed)
    target = np.zeros((rows, vocab))
    draft = np.zeros((rows, vocab))
    for row in range(rows):
        shared = rng.choice(vocab, size=alive, replace=False)
        target[row, shared] = rng.dirichlet(np.full(alive, 0.5))
        moved = shared.copy()
        moved[: alive // 3] = rng.choice(vocab, size=alive // 3, replace=False)
        np.add.at(draft[row], moved, rng.dirichlet(np.full(alive, 0.5)))
    return target, draft


@pytest.mark.parametrize("spec", SPECS)
def test_torch_law_equals_numpy(spec):
    rule = rules.parse(spec)
    rng = np.random.default_rng(0)
    target = rng.dirichlet(np.full(12, 0.4), 80)
    draft = rng.dirichlet(np.full(12, 0.4), 80)
    target[target < 0.02] = 0
    draft[draft < 0.01] = 0
    target /= target.sum(-1, keepdims=True)
    draft /= draft.sum(-1, keepdims=True)
    expected = law.output_law(rule, target, draft)
    got = torch_law.output_law(rule, torch.tensor(target), torch.tensor(draft)).numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("vocab", [30, 3000], ids=["dense", "packed"])
def test_emitted_divergence_equals_numpy(spec, vocab):
    rule = rules.parse(spec)
    target, draft = sparse_rows(1, rows=40, vocab=vocab, alive=12)
    emitted = law.output_law(rule, target, draft)
    kl, tv = torch_law.emitted_divergence(rule, torch.tensor(target), torch.tensor(draft))
    expected_kl = divergences.kl(emitted, target)
    infinite = np.isinf(expected_kl)
    assert np.array_equal(np.isinf(kl.numpy()), infinite)
    np.testing.assert_allclose(
        kl.numpy()[~infinite], expected_kl[~infinite], rtol=1e-10, atol=1e-13
    )
    np.testing.assert_allclose(tv.numpy(), divergences.tv(emitted, target), rtol=1e-10, atol=1e-13)


def test_packing_keeps_exactly_the_support():
    target, draft = sparse_rows(2, rows=5, vocab=500, alive=10)
    packed_target, packed_draft = torch_law.support_rows(torch.tensor(target), torch.tensor(draft))
    support = ((target > 0) | (draft > 0)).sum(axis=1)
    assert packed_target.shape == (5, support.max())
    for row in range(5):
        kept = (target[row] > 0) | (draft[row] > 0)
        np.testing.assert_array_equal(packed_target[row, : support[row]].numpy(), target[row, kept])
        np.testing.assert_array_equal(packed_draft[row, : support[row]].numpy(), draft[row, kept])
        assert not packed_target[row, support[row] :].any()
