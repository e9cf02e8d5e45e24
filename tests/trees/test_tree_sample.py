"""The numpy node sampler (``trees.sample_node``, ``verify_node``) against the exact node law,
by chi-square at ``goodness_of_fit.LEVEL`` with fixed seeds and negative controls."""

import numpy as np
import pytest
from goodness_of_fit import LEVEL, chi_square_pvalue

from cactus_theory import trees

Q = np.array([0.35, 0.25, 0.2, 0.12, 0.08, 0.0])
P = np.array([0.1, 0.4, 0.05, 0.25, 0.1, 0.1])

NODES = {
    "deterministic": trees.Node(target=Q, draft=P, children=[1, 3, 5]),
    "with-replacement": trees.Node(target=Q, draft=P, k=3),
    "without-replacement": trees.Node(target=Q, draft=P, k=3, replacement=False),
    "hub": trees.Node(target=Q, draft=P, k=2, scheme="hub"),
}
SPECS = ["walk", "rrs", "lift:cactus:delta=1.0", "sglang-tree:threshold_acc=0.4"]


@pytest.mark.parametrize("scheme", list(NODES))
@pytest.mark.parametrize("spec", SPECS)
def test_sampled_tokens_follow_the_exact_law(spec, scheme):
    rule, node = trees.parse(spec), NODES[scheme]
    if scheme not in rule.schemes:
        pytest.skip(f"{spec} is not defined for {scheme}")
    exact = trees.enumerate_node(rule, node)
    draws = trees.sample_node(rule, node, 40_000, seed=3)
    counts = np.bincount(draws.token, minlength=node.vocab_size)
    assert chi_square_pvalue(counts, exact.law) > LEVEL
    outcomes = np.bincount(draws.outcome, minlength=node.k + 1)
    assert chi_square_pvalue(outcomes, exact.ends) > LEVEL
    assert draws.token.min() >= 0 and draws.token.max() < node.vocab_size


def test_the_chi_square_catches_a_wrong_law():
    """Negative control: walk samples against the law of a lossy rule are rejected."""
    node = NODES["deterministic"]
    draws = trees.sample_node("walk", node, 40_000, seed=3)
    counts = np.bincount(draws.token, minlength=node.vocab_size)
    wrong = trees.node_law("sglang-tree:threshold_acc=0.6", node)
    assert np.abs(wrong - node.target).max() > 0.05
    assert chi_square_pvalue(counts, wrong) < LEVEL


def test_drafted_children_follow_the_scheme():
    node = NODES["without-replacement"]
    children = trees.draft_children(node, np.random.default_rng(0).random((30_000, 3)))
    assert all(len(set(row)) == 3 for row in children[:500].tolist())
    first = np.bincount(children[:, 0], minlength=node.vocab_size)
    assert chi_square_pvalue(first, P) > LEVEL
    hub = trees.draft_children(NODES["hub"], np.random.default_rng(1).random((1000, 2)))
    assert np.all((hub[:, 0] == 1) | (hub[:, 1] == 1))  # a = argmax p = 1 in every pair


def test_same_seed_same_samples_and_uniforms_decide():
    node = NODES["with-replacement"]
    first = trees.sample_node("rrs", node, 500, seed=9)
    second = trees.sample_node("rrs", node, 500, seed=9)
    np.testing.assert_array_equal(first.token, second.token)
    children = np.array([[1, 1, 3]])
    # u = 0 accepts the first child whenever a_1 > 0; u close to 1 rejects all here.
    outcome, token = trees.verify_node("rrs", node, children, [0.0], [0.5])
    assert outcome[0] == 0 and token[0] == 1
    outcome, token = trees.verify_node("rrs", node, children, [0.999999], [0.0])
    assert outcome[0] == 3 and token[0] == 0  # residual's first token with mass


def test_verify_node_refuses_bad_input():
    node = NODES["deterministic"]
    with pytest.raises(ValueError, match="^children: ids must lie in"):
        trees.verify_node("walk", node, np.array([[1, 7, 2]]), [0.1], [0.1])
    with pytest.raises(ValueError, match="^accept_uniforms: values must lie in"):
        trees.verify_node("walk", node, np.array([[1, 3, 5]]), [1.5], [0.1])
    with pytest.raises(ValueError, match="^node: tree rule 'sglang-tree' is defined for"):
        trees.sample_node("sglang-tree", NODES["with-replacement"], 10)
