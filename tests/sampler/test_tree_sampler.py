"""The torch tree walk (``sampler.verify_tree``) against the numpy reference
(``core.trees.verify``), the chain sampler, and its own structure helpers.

Random batches of trees (0 to 3 children per node, depth up to 3, rows with zeros, so rows
are packed to their support for support-only rules) and float64 rows: the same uniforms
give the same path, accepted count and tokens as the reference, for every rule family and
drafting scheme.
"""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "trees"))
from random_trees import random_trees  # noqa: E402

from cactus_theory import rules, sampler, trees  # noqa: E402
from cactus_theory.core.trees.verify import depths  # noqa: E402
from cactus_theory.core.trees.verify import verify_tree as reference  # noqa: E402
from cactus_theory.sampler.tree_structure import TreeStructure, ancestors  # noqa: E402

CASES = [
    ("walk", trees.DETERMINISTIC),
    ("lift:cactus:delta=0.5", trees.DETERMINISTIC),
    ("sglang-tree:threshold_single=0.5,threshold_acc=0.7", trees.DETERMINISTIC),
    ("rrs", trees.WITH_REPLACEMENT),
    ("rrs", trees.WITHOUT_REPLACEMENT),
    ("rrs", trees.HUB),
    ("lift:cactus-exact:delta=0.3", trees.WITH_REPLACEMENT),
    ("lift:tas", trees.WITHOUT_REPLACEMENT),
]


@pytest.mark.parametrize(("spec", "scheme"), CASES)
def test_torch_walk_equals_the_numpy_reference(spec, scheme):
    rng = np.random.default_rng(abs(hash((spec, scheme))) % 2**32)
    target, draft, parents, tokens = random_trees(rng, 80, 8, scheme)
    levels = int(depths(parents).max())
    decide_u, sample_u = rng.random((80, levels)), rng.random(80)
    rule = trees.parse(spec)
    expected = reference(rule, target, draft, parents, tokens, scheme, decide_u, sample_u)
    walked = sampler.verify_tree(
        torch.tensor(target), torch.tensor(draft), torch.tensor(parents), torch.tensor(tokens),
        rule, scheme, uniforms=(torch.tensor(decide_u), torch.tensor(sample_u)),
    )  # fmt: skip
    assert np.array_equal(walked.token_ids.numpy(), expected[0])
    assert np.array_equal(walked.num_accepted.numpy(), expected[1])
    assert np.array_equal(walked.path.numpy(), expected[2])
    assert int(walked.num_accepted.max()) >= 1  # paths were walked
    assert (walked.token_ids >= -1).all() and (walked.token_ids < 8).all()


@pytest.mark.parametrize("spec", ["sps", "cactus:delta=1.0", "frontier:delta=0.5"])
def test_a_chain_tree_walks_as_the_chain_sampler(spec):
    """One child per node drafted from p: the lifted rule's torch walk equals
    ``sampler.verify`` (the chain sampler) token for token, float64."""
    generator = torch.Generator().manual_seed(1)
    batch, steps, vocab = 300, 3, 10
    target = torch.distributions.Dirichlet(torch.full((vocab,), 0.5, dtype=torch.float64))
    target_probs = target.sample((batch, steps + 1))
    draft_probs = target.sample((batch, steps + 1))
    ids = torch.multinomial(draft_probs[:, :steps].reshape(-1, vocab), 1, generator=generator)
    ids = ids.reshape(batch, steps)
    uniforms = torch.rand(batch, steps + 1, generator=generator, dtype=torch.float64)
    rule = rules.parse(spec)
    chain_ids, chain_accepted = sampler.verify(
        target_probs, draft_probs[:, :steps], ids, rule,
        uniforms=(uniforms[:, :steps], uniforms[:, steps]),
    )  # fmt: skip
    parents = torch.arange(-1, steps).expand(batch, -1)
    tokens = torch.cat([torch.zeros(batch, 1, dtype=torch.int64), ids], dim=1)
    walked = sampler.verify_tree(
        target_probs, draft_probs, parents, tokens, trees.lift(rule), trees.WITH_REPLACEMENT,
        uniforms=(uniforms[:, :steps], uniforms[:, steps]),
    )  # fmt: skip
    assert torch.equal(walked.token_ids, chain_ids)
    assert torch.equal(walked.num_accepted, chain_accepted)


def test_structure_matches_the_reference_and_ancestors_are_paths():
    rng = np.random.default_rng(5)
    _, _, parents, _ = random_trees(rng, 30, 5, trees.DETERMINISTIC, depth=4)
    structure = TreeStructure.of(torch.tensor(parents))
    assert np.array_equal(structure.depth.numpy(), depths(parents))
    seen = ancestors(structure.parents, structure.levels)
    for row in range(30):
        for node in range(parents.shape[1]):
            kids = np.flatnonzero(parents[row] == node)
            width = structure.num_children[row, node]
            assert list(structure.children[row, node, :width].numpy()) == list(kids)
            chain, above = {node}, parents[row, node]
            while above >= 0:
                chain.add(int(above))
                above = parents[row, above]
            assert set(np.flatnonzero(seen[row, node].numpy())) == chain


def test_outcomes_and_children_per_depth():
    """outcomes[b, d] is the accepted child's rank (or K when all were rejected) at the node
    visited at depth d; num_children its K."""
    rng = np.random.default_rng(6)
    target, draft, parents, tokens = random_trees(rng, 50, 6, trees.DETERMINISTIC)
    structure = TreeStructure.of(torch.tensor(parents))
    walked = sampler.verify_tree(
        torch.tensor(target), None, structure, torch.tensor(tokens), trees.make("walk"),
        generator=torch.Generator().manual_seed(2),
    )  # fmt: skip
    for row in range(50):
        for depth in range(structure.levels):
            outcome, count = int(walked.outcomes[row, depth]), int(walked.num_children[row, depth])
            node = int(walked.path[row, depth])
            if node < 0 or count == 0:
                assert outcome == -1 and count == 0
                continue
            assert count == int(structure.num_children[row, node])
            if outcome < count:
                assert int(structure.children[row, node, outcome]) == walked.path[row, depth + 1]
            else:
                assert outcome == count and walked.num_accepted[row] == depth


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rule": "sps"}, "rule: expected a tree rule"),
        ({"scheme": "sideways"}, "scheme: expected one of"),
        ({"draft_probs": None, "scheme": trees.WITH_REPLACEMENT}, "draft_probs: sampled"),
        ({"tokens": torch.full((2, 3), 99)}, "tokens: drafted ids"),
        ({"uniforms": (torch.zeros(2, 0), torch.zeros(2))}, "decide_uniforms: expected at"),
        ({"uniforms": (torch.ones(2, 2), torch.zeros(2))}, "decide_uniforms: values must"),
    ],
)
def test_bad_inputs_are_value_errors(change, message):
    rows = torch.full((2, 3, 5), 0.2, dtype=torch.float64)
    arguments = {
        "target_probs": rows, "draft_probs": rows, "parents": torch.tensor([[-1, 0, 1]] * 2),
        "tokens": torch.tensor([[0, 1, 2]] * 2), "rule": trees.make("walk"),
        "scheme": trees.DETERMINISTIC,
    }  # fmt: skip
    arguments.update(change)
    if isinstance(arguments["rule"], str):
        arguments["rule"] = rules.parse(arguments["rule"])
    with pytest.raises(ValueError, match=message):
        sampler.verify_tree(**arguments)


class NumpyWalk(trees.Walk):
    """The walk as a user's rule that does not declare the array API: the torch walk hands
    it float64 numpy copies and takes its results back as tensors."""

    name = "test-numpy-walk"
    array_api = False

    def sibling_accepts(self, target_probs, proposals, children):
        assert isinstance(target_probs, np.ndarray) and isinstance(children, np.ndarray)
        return super().sibling_accepts(target_probs, proposals, children)


def test_a_rule_without_the_array_api_gets_numpy_rows():
    rng = np.random.default_rng(8)
    target, draft, parents, tokens = random_trees(rng, 40, 8, trees.DETERMINISTIC)
    levels = int(depths(parents).max())
    decide_u, sample_u = rng.random((40, levels)), rng.random(40)
    expected = reference(
        trees.make("walk"), target, draft, parents, tokens, trees.DETERMINISTIC, decide_u, sample_u
    )
    walked = sampler.verify_tree(
        torch.tensor(target), None, torch.tensor(parents), torch.tensor(tokens), NumpyWalk(),
        uniforms=(torch.tensor(decide_u), torch.tensor(sample_u)), measure=True,
    )  # fmt: skip
    assert np.array_equal(walked.token_ids.numpy(), expected[0])
    assert float(walked.kl.abs().max()) < 1e-12  # lossless: the meter reads 0
