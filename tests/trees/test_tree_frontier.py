"""The lossless optimum and the constrained frontier: closed forms, the lexicographically
optimal base, dominance over every rule at its own KL, and cvxpy on small nodes."""

import numpy as np
import pytest
from nodes import random_node

from cactus_theory import divergences, trees
from cactus_theory.core import gamma
from cactus_theory.core.rules.frontier import frontier_target
from proofs_check import trees_lp

SAMPLED_RULES = {
    trees.WITH_REPLACEMENT: ["rrs", "k-seq", "cactus-rrs:delta=0.3", "medusa-typical"],
    trees.WITHOUT_REPLACEMENT: [
        "rrs",
        "walk",
        "cactus-tree:delta=0.3",
        "sglang-tree:threshold_acc=0.5",
    ],
    trees.HUB: ["spechub", "cactus-rrs:delta=1.0"],
    trees.DETERMINISTIC: ["walk", "sglang-tree:threshold_acc=0.4", "cactus-tree:delta=0.2"],
}


def test_deterministic_frontier_is_the_two_level_tilt():
    rng = np.random.default_rng(40)
    for _ in range(40):
        node = random_node(rng, 7, int(rng.integers(1, 4)), trees.DETERMINISTIC)
        mass = node.target[list(node.children)].sum()
        for delta in (0.0, 0.1, 1.0):
            best = trees.frontier_acceptance(node, delta=delta)
            assert best == pytest.approx(float(gamma.exact_raised_mass(mass, delta)))
            tree = trees.node_acceptance(trees.make("cactus-tree", delta=delta), node)
            assert tree == pytest.approx(best, abs=1e-12)  # Cactus-tree is the frontier
            tv = trees.frontier_acceptance(node, delta=delta, divergence="tv")
            assert tv == pytest.approx(min(1.0, mass + delta))


@pytest.mark.parametrize("scheme", [trees.WITH_REPLACEMENT, trees.WITHOUT_REPLACEMENT, trees.HUB])
def test_the_base_gives_alpha_star_at_zero_budget_and_is_in_the_core(scheme):
    rng = np.random.default_rng(41)
    for _ in range(30):
        node = random_node(rng, int(rng.integers(2, 7)), int(rng.integers(1, 4)), scheme)
        base = trees.core_base(node)
        assert base.sum() == pytest.approx(1.0, abs=1e-12)
        assert np.minimum(base, node.target).sum() == pytest.approx(
            trees.optimal_acceptance(node, method="cut"), abs=1e-12
        )
        assert trees.frontier_acceptance(node, delta=0.0) == pytest.approx(
            trees.optimal_acceptance(node, method="cut"), abs=1e-12
        )
        # In the core: the lossless optimum against s itself accepts everything.
        against = trees.Node(target=base, draft=node.draft, k=node.k, scheme=node.scheme)
        assert trees.optimal_acceptance(against, method="cut") == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("scheme", list(SAMPLED_RULES))
def test_the_frontier_dominates_every_rule_at_its_own_kl(scheme):
    rng = np.random.default_rng(42)
    for _ in range(25):
        node = random_node(rng, int(rng.integers(2, 7)), int(rng.integers(1, 4)), scheme)
        for spec in SAMPLED_RULES[scheme]:
            exact = trees.enumerate_node(spec, node)
            spent = divergences.kl(exact.law / exact.law.sum(), node.target)
            if not np.isfinite(spent):
                continue
            assert exact.acceptance <= trees.frontier_acceptance(node, delta=spent) + 1e-12
            tv = divergences.tv(exact.law, node.target)
            best = trees.frontier_acceptance(node, delta=tv, divergence="tv")
            assert exact.acceptance <= best + 1e-12


def test_the_frontier_is_attained_and_monotone():
    rng = np.random.default_rng(43)
    for _ in range(30):
        node = random_node(rng, 6, int(rng.integers(2, 4)), trees.WITH_REPLACEMENT)
        values = [trees.frontier_acceptance(node, delta=d) for d in (0.0, 0.05, 0.2, 1.0, 5.0)]
        assert np.all(np.diff(values) >= -1e-12)
        base = trees.core_base(node)
        emitted = frontier_target(node.target, base, 0.2)
        assert divergences.kl(emitted, node.target) <= 0.2 * (1 + 1e-12) + 1e-15
        attained = trees.optimal_acceptance(
            trees.Node(target=emitted, draft=node.draft, k=node.k), method="cut"
        )
        assert attained >= values[2] - 1e-12
    rows = np.stack([random_node(rng, 6, 2, trees.WITH_REPLACEMENT).target for _ in range(5)])
    drafts = np.stack([random_node(rng, 6, 2, trees.WITH_REPLACEMENT).draft for _ in range(5)])
    batch = trees.frontier_rows(rows, drafts, 2, 0.3)
    for row in range(5):
        node = trees.Node(target=rows[row], draft=drafts[row], k=2)
        assert batch[row] == pytest.approx(trees.frontier_acceptance(node, delta=0.3), abs=1e-13)


@pytest.mark.parametrize("scheme", [trees.WITH_REPLACEMENT, trees.WITHOUT_REPLACEMENT])
def test_alpha_star_and_the_frontier_agree_with_cvxpy(scheme):
    rng = np.random.default_rng(44)
    for _ in range(4):
        node = random_node(rng, int(rng.integers(3, 6)), int(rng.integers(2, 4)), scheme)
        assert trees.optimal_acceptance(node, method="lp") == pytest.approx(
            trees.optimal_acceptance(node, method="cut"), abs=1e-8
        )
        for divergence in ("kl", "tv"):
            solved, _ = trees_lp.frontier_lp(node, 0.1, divergence)
            ours = trees.frontier_acceptance(node, delta=0.1, divergence=divergence)
            assert solved == pytest.approx(ours, abs=1e-6)


def test_bad_arguments_are_named():
    node = trees.Node(target=[0.5, 0.5], draft=[0.5, 0.5], k=2)
    with pytest.raises(ValueError, match="^delta: must be >= 0"):
        trees.frontier_acceptance(node, delta=-1.0)
    with pytest.raises(ValueError, match="^divergence: expected one of"):
        trees.frontier_acceptance(node, delta=0.1, divergence="js")


def test_children_whose_masses_sum_above_one_by_rounding():
    """q(S) computed as a sum can round to 1 + 2e-16 (found by the full claims run): the
    tilt and the frontier treat it as 1."""
    target = np.array(
        [
            0.0868571962684537,
            0.09410960950489868,
            0.38887885423359286,
            0.36223846555667666,
            0.06791587443637817,
        ]
    )
    node = trees.Node(target=target, draft=target, children=[4, 3, 2, 1, 0])
    assert target[[4, 3, 2, 1, 0]].sum() > 1.0
    for spec in (
        "cactus-tree:delta=0.5",
        "cactus-tree:delta=0.5,exact=false",
        "cactus-rrs:delta=1",
    ):
        assert trees.node_acceptance(spec, node) == pytest.approx(1.0, abs=1e-15)
    assert trees.frontier_acceptance(node, delta=0.3) == 1.0


def test_the_coupling_lp_is_exact_on_near_one_hot_rows():
    """At HiGHS's default tolerance (1e-7) this node read α* = 1 (found by the full run)."""
    node = trees.Node(
        target=[4.120542742164502e-08, 0.9999999587945726],
        draft=[0.9999471485852804, 5.285141471954276e-05],
        children=[1],
    )
    exact = trees.optimal_acceptance(node, method="cut")
    assert trees.optimal_acceptance(node, method="lp") == pytest.approx(exact, abs=1e-12)
