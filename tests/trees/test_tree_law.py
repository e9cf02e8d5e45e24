"""The node law engine (``trees.node_law``, ``node_acceptance``): enumeration over drafted
tuples against independent references (explicit loops), closed forms, and the chain law."""

import itertools
import math

import numpy as np
import pytest
from nodes import random_node, random_row

from cactus_theory import law, rules, trees

SCHEMES = trees.SCHEMES


def rrs_reference(target, draft, children, scheme):
    """Recursive rejection sampling for one drafted tuple, written out with loops:
    (P(end at child i) for each i, P(reject all), residual)."""
    current = np.array(target, dtype=float)
    survive, ends = 1.0, []
    for index, child in enumerate(children):
        if scheme == trees.DETERMINISTIC:
            proposal = np.zeros_like(current)
            proposal[child] = 1.0
        elif scheme == trees.WITH_REPLACEMENT:
            proposal = np.array(draft, dtype=float)
        elif scheme == trees.WITHOUT_REPLACEMENT:
            proposal = np.array(draft, dtype=float)
            proposal[list(children[:index])] = 0.0
            proposal /= proposal.sum()
        else:  # hub
            hub = int(np.argmax(draft))
            if index == 0:
                proposal = np.array(draft, dtype=float)
            elif children[0] == hub:
                proposal = np.array(draft, dtype=float)
                proposal[hub] = 0.0
                proposal /= proposal.sum()
            else:
                proposal = np.eye(len(draft))[hub]
        accept = min(1.0, current[child] / proposal[child]) if proposal[child] > 0 else 0.0
        ends.append(survive * accept)
        survive *= 1.0 - accept
        excess = np.maximum(current - proposal, 0.0)
        current = excess / excess.sum() if excess.sum() > 0 else current
    return ends, survive, current


def reference_law(target, draft, node):
    """Σ over drafted tuples, written out with itertools (the scheme's tuple probabilities
    by hand), for recursive rejection sampling."""
    vocab = len(target)
    support = [int(t) for t in np.flatnonzero(draft > 0)]
    if node.scheme == trees.DETERMINISTIC:
        tuples = [(node.children, 1.0)]
    elif node.scheme == trees.WITH_REPLACEMENT:
        tuples = [
            (x, float(np.prod([draft[t] for t in x])))
            for x in itertools.product(support, repeat=node.k)
        ]
    elif node.scheme == trees.WITHOUT_REPLACEMENT:
        tuples = []
        for x in itertools.permutations(support, node.k):
            chance, left = 1.0, 1.0
            for t in x:
                chance *= draft[t] / left
                left -= draft[t]
            tuples.append((x, chance))
    else:
        hub = int(np.argmax(draft))
        tuples = [((x, hub), draft[x]) for x in support if x != hub]
        tuples += [
            ((hub, x), draft[hub] * draft[x] / (1 - draft[hub])) for x in support if x != hub
        ]
    out, accepted = np.zeros(vocab), 0.0
    for children, chance in tuples:
        ends, survive, residual = rrs_reference(target, draft, list(children), node.scheme)
        for child, end in zip(children, ends, strict=True):
            out[child] += chance * end
        out += chance * survive * residual
        accepted += chance * (1.0 - survive)
    return out, accepted


@pytest.mark.parametrize("scheme", SCHEMES)
def test_rrs_law_and_acceptance_equal_an_independent_loop(scheme):
    rng = np.random.default_rng(1)
    for _ in range(40):
        node = random_node(rng, int(rng.integers(2, 6)), int(rng.integers(1, 4)), scheme)
        exact = trees.enumerate_node("rrs", node)
        wanted, accepted = reference_law(node.target, node.draft, node)
        np.testing.assert_allclose(exact.law, wanted, atol=1e-13)
        assert exact.acceptance == pytest.approx(accepted, abs=1e-13)
        np.testing.assert_allclose(exact.law, node.target, atol=1e-12)  # lossless


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("name", ["walk", "rrs"])
def test_lossless_rules_emit_the_target_exactly(name, scheme):
    rng = np.random.default_rng(2)
    worst = 0.0
    for _ in range(150):
        node = random_node(rng, int(rng.integers(2, 9)), int(rng.integers(1, 5)), scheme)
        worst = max(worst, np.abs(trees.node_law(name, node) - node.target).max())
    assert worst <= 1e-12


def test_walk_accepts_the_mass_of_its_children():
    rng = np.random.default_rng(3)
    for _ in range(100):
        node = random_node(rng, 7, int(rng.integers(1, 5)), trees.DETERMINISTIC)
        wanted = node.target[list(node.children)].sum()
        assert trees.node_acceptance("walk", node) == pytest.approx(wanted, abs=1e-14)


def test_rrs_with_replacement_acceptance_is_one_minus_the_product_of_tvs():
    rng = np.random.default_rng(4)
    for _ in range(100):
        node = random_node(rng, 6, int(rng.integers(1, 5)), trees.WITH_REPLACEMENT)
        residual, product = node.target, 1.0
        for _ in range(node.k):
            product *= 0.5 * np.abs(residual - node.draft).sum()
            excess = np.maximum(residual - node.draft, 0.0)
            residual = excess / excess.sum() if excess.sum() > 0 else residual
        assert trees.node_acceptance("rrs", node) == pytest.approx(1.0 - product, abs=1e-13)
        closed = trees.closed_form("rrs", node.target, node.draft, node.k, node.scheme)[1]
        assert closed == pytest.approx(1.0 - product, abs=1e-13)


CHAIN_SPECS = [
    "sps",
    "cactus:delta=0.5",
    "cactus-exact:delta=1.0",
    "frontier:delta=0.2",
    "interp:alpha=0.3",
    "tas",
    "topk:k=2",
    "greedy",
    "sglang:threshold_single=0.6,threshold_acc=0.5",
    "relaxed:top_k=3,delta=0.3",
]


@pytest.mark.parametrize("spec", CHAIN_SPECS)
def test_a_lifted_chain_rule_at_one_child_has_the_chain_law(spec):
    """Tree rules and chain rules share one law: K = 1, with replacement, is output_law."""
    rng = np.random.default_rng(5)
    chain = rules.parse(spec)
    tree = trees.lift(chain)
    assert trees.spec_of(tree) == "lift:" + rules.spec_of(chain)
    assert trees.parse(trees.spec_of(tree)) == tree
    for _ in range(30):
        target, draft = random_row(rng, 6), random_row(rng, 6)
        node = trees.Node(target=target, draft=draft, k=1)
        exact = trees.enumerate_node(tree, node)
        np.testing.assert_allclose(exact.law, law.output_law(chain, target, draft), atol=1e-13)
        assert exact.acceptance == pytest.approx(law.acceptance(chain, target, draft), abs=1e-13)


def test_rrs_is_sps_lifted_and_walk_is_rrs_on_one_hot_proposals():
    rng = np.random.default_rng(6)
    for scheme in SCHEMES:
        node = random_node(rng, 5, 2, scheme)
        np.testing.assert_allclose(
            trees.node_law("rrs", node), trees.node_law("lift:sps", node), atol=1e-15
        )
    node = random_node(rng, 6, 3, trees.DETERMINISTIC)
    assert trees.node_acceptance("walk", node) == pytest.approx(
        trees.node_acceptance("rrs", node), abs=1e-15
    )


def test_packing_to_the_support_changes_nothing():
    """A support-only rule is enumerated on packed rows; unpacked (declaring nothing) gives
    the same law."""

    class Unpacked(trees.RecursiveRejection):
        name = "test-unpacked-rrs"
        support_only = False

    target = np.array([0.0, 0.4, 0.0, 0.35, 0.25, 0.0])
    draft = np.array([0.0, 0.1, 0.0, 0.6, 0.0, 0.3])
    for scheme in (trees.WITH_REPLACEMENT, trees.WITHOUT_REPLACEMENT):
        node = trees.Node(target=target, draft=draft, k=2, scheme=scheme)
        np.testing.assert_allclose(
            trees.node_law("rrs", node), trees.node_law(Unpacked(), node), atol=1e-15
        )
    node = trees.Node(target=target, draft=draft, children=[2, 4])
    assert trees.node_acceptance("walk", node) == pytest.approx(0.25)


def test_node_law_rows_batches_deterministic_nodes():
    rng = np.random.default_rng(8)
    target = np.stack([random_row(rng, 8) for _ in range(20)])
    draft = np.stack([random_row(rng, 8) for _ in range(20)])
    children = np.stack([rng.permutation(8)[:3] for _ in range(20)])
    for spec in ("walk", "lift:cactus:delta=0.5"):
        laws, accepted = trees.node_law_rows(spec, target, draft, children)
        for row in range(20):
            node = trees.Node(target=target[row], draft=draft[row], children=list(children[row]))
            one = trees.enumerate_node(spec, node)
            np.testing.assert_allclose(laws[row], one.law, atol=1e-15)
            assert accepted[row] == pytest.approx(one.acceptance, abs=1e-15)


def test_ends_sum_to_one_and_acceptance_is_their_accepted_part():
    rng = np.random.default_rng(9)
    node = random_node(rng, 6, 3, trees.WITHOUT_REPLACEMENT)
    exact = trees.enumerate_node("lift:cactus:delta=1.0", node)
    assert exact.ends.sum() == pytest.approx(1.0, abs=1e-14)
    assert exact.acceptance == pytest.approx(exact.ends[:-1].sum(), abs=1e-14)
    assert exact.tuples == math.perm(int(np.count_nonzero(node.draft)), node.k)


def test_bad_nodes_and_rules_are_named_errors():
    q, p = [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]
    with pytest.raises(ValueError, match="^children: deterministic children must differ"):
        trees.Node(target=q, draft=p, children=[1, 1])
    with pytest.raises(ValueError, match="^children: token id 3 is out of range"):
        trees.Node(target=q, draft=p, children=[3])
    with pytest.raises(ValueError, match="^children: give the drafted children, or k"):
        trees.Node(target=q, draft=p)
    with pytest.raises(ValueError, match="^k: 4 distinct children"):
        trees.Node(target=q, draft=p, k=4, replacement=False)
    with pytest.raises(ValueError, match="^k: SpecHub's hub scheme drafts 2 children"):
        trees.Node(target=q, draft=p, k=3, scheme="hub")
    with pytest.raises(ValueError, match="^scheme: sampled children use one of"):
        trees.Node(target=q, draft=p, k=2, scheme="beam")
    with pytest.raises(ValueError, match="^target: rows must sum to 1"):
        trees.Node(target=[0.5, 0.6, 0.0], draft=p, children=[0])
    with pytest.raises(ValueError, match="^draft: shape"):
        trees.Node(target=q, draft=[0.5, 0.5], children=[0])
    with pytest.raises(ValueError, match="^rule: expected a tree rule"):
        trees.node_law(rules.make("sps"), trees.Node(target=q, draft=p, children=[0]))
    with pytest.raises(ValueError, match="^name: unknown tree rule 'nope'"):
        trees.node_law("nope", trees.Node(target=q, draft=p, children=[0]))
    with pytest.raises(ValueError, match="too many to enumerate"):
        trees.node_law(
            "rrs", trees.Node(target=np.full(200, 0.005), draft=np.full(200, 0.005), k=3)
        )
