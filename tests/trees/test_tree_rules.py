"""The built-in tree rules against their papers and engines: lossless schemes emit q,
closed forms equal the enumeration, references written from the papers' and kernels'
procedures agree with the laws (exactly, or by chi-square with a negative control)."""

import numpy as np
import pytest
from goodness_of_fit import LEVEL, chi_square_pvalue
from nodes import random_node, random_row

from cactus_theory import divergences, law, rules, trees
from cactus_theory.core import gamma
from cactus_theory.core.trees import optimum
from cactus_theory.core.trees.rules import division_factor

LOSSLESS = {
    "walk": trees.SCHEMES,
    "rrs": trees.SCHEMES,
    "k-seq": (trees.WITH_REPLACEMENT,),
    "spechub": (trees.HUB,),
    "sglang-tree": (trees.DETERMINISTIC, trees.WITHOUT_REPLACEMENT),
    "cactus-tree:delta=0": trees.SCHEMES,
    "cactus-rrs:delta=0": trees.SCHEMES,
    "lift:sps": trees.SCHEMES,
}


@pytest.mark.parametrize("spec", list(LOSSLESS))
def test_every_lossless_rule_emits_the_target(spec):
    rng = np.random.default_rng(20)
    rule = trees.parse(spec)
    assert rule.lossless
    worst = 0.0
    for scheme in LOSSLESS[spec]:
        for _ in range(60):
            node = random_node(rng, int(rng.integers(2, 8)), int(rng.integers(1, 4)), scheme)
            worst = max(worst, np.abs(trees.node_law(rule, node) - node.target).max())
    assert worst <= 1e-12


@pytest.mark.parametrize("scheme", [s for s in trees.SCHEMES])
def test_the_optimal_verifier_is_lossless_and_attains_alpha_star(scheme):
    rng = np.random.default_rng(21)
    rule = trees.make("optimal", scheme=scheme)
    for _ in range(25):
        node = random_node(rng, int(rng.integers(2, 7)), int(rng.integers(1, 4)), scheme)
        exact = trees.enumerate_node(rule, node)
        np.testing.assert_allclose(exact.law, node.target, atol=1e-12)
        best = trees.optimal_acceptance(node, method="cut")
        assert exact.acceptance == pytest.approx(best, abs=1e-9)
        for other in ("rrs", "walk"):
            assert trees.node_acceptance(other, node) <= best + 1e-12


def test_alpha_star_by_sort_equals_cut_and_the_special_cases():
    rng = np.random.default_rng(22)
    for _ in range(200):
        width = int(rng.integers(1, 5))
        node = random_node(rng, int(rng.integers(2, 9)), width, trees.WITH_REPLACEMENT)
        cut = trees.optimal_acceptance(node, method="cut")
        assert trees.optimal_acceptance(node, method="sort") == pytest.approx(cut, abs=1e-12)
        if node.k == 1:
            assert cut == pytest.approx(1 - divergences.tv(node.target, node.draft), abs=1e-12)
    node = random_node(rng, 6, 3, "deterministic")
    wanted = node.target[list(node.children)].sum()
    for method in ("cut", "sort"):
        assert trees.optimal_acceptance(node, method=method) == pytest.approx(wanted)
    with pytest.raises(ValueError, match="^method: 'sort' needs children drawn i.i.d."):
        trees.optimal_acceptance(random_node(rng, 5, 2, "without-replacement"), method="sort")
    with pytest.raises(ValueError, match="^method: expected one of"):
        trees.optimal_acceptance(node, method="simplex")


@pytest.mark.parametrize(
    "spec, scheme",
    [
        ("rrs", trees.WITH_REPLACEMENT),
        ("k-seq", trees.WITH_REPLACEMENT),
        ("spechub", trees.HUB),
    ],
)
def test_closed_form_acceptances_equal_the_enumeration(spec, scheme):
    rng = np.random.default_rng(23)
    for _ in range(60):
        node = random_node(rng, int(rng.integers(2, 8)), int(rng.integers(1, 4)), scheme)
        _, closed = trees.closed_form(spec, node.target, node.draft, node.k, node.scheme)
        assert closed == pytest.approx(trees.node_acceptance(spec, node), abs=1e-13)


def test_k_seq_division_factor_solves_its_equation_and_k1_is_sps():
    rng = np.random.default_rng(24)
    for _ in range(50):
        q, p, width = random_row(rng, 7), random_row(rng, 7), int(rng.integers(2, 5))
        rho = float(division_factor(q, p, width)[0])
        beta = np.minimum(q / rho, p).sum()
        assert 1.0 <= rho <= width
        assert 1 - (1 - beta) ** width <= rho * beta + 1e-15
        if rho > 1.0 + 1e-12:  # the root: a hair smaller ρ breaks the inequality
            smaller = rho * (1 - 1e-9)
            beta = np.minimum(q / smaller, p).sum()
            assert 1 - (1 - beta) ** width > smaller * beta
        node = trees.Node(target=q, draft=p, k=1)
        sps = law.acceptance(rules.make("sps"), q, p)
        assert trees.node_acceptance("k-seq", node) == pytest.approx(sps)


def sglang_kernel(target, children, coin, final_coin, single, acc):
    """SGLang's TreeSpeculativeSamplingTargetOnly at one node, as its CUDA loop reads."""
    removed = np.zeros_like(target)
    prob_acc = 0.0
    for child in children:
        prob_acc += target[child]
        if coin <= prob_acc / max(acc, 1e-9) or target[child] >= single:
            return child
        removed[child] = target[child]
    relu = np.maximum(target - removed, 0.0)
    cumulative = np.cumsum(relu)
    index = int(np.searchsorted(cumulative, final_coin * cumulative[-1], side="right"))
    return min(index, len(target) - 1)


@pytest.mark.parametrize("single, acc", [(1.0, 1.0), (1.0, 0.5), (0.3, 0.7), (0.25, 0.2)])
def test_sglang_tree_is_the_kernel(single, acc):
    """Same uniforms, same tokens as the kernel's loop (ours accepts on u < C, the kernel on
    u <= C: they differ only on a boundary of probability 0)."""
    rng = np.random.default_rng(25)
    rule = trees.make("sglang-tree", threshold_single=single, threshold_acc=acc)
    for _ in range(40):
        node = random_node(rng, 8, int(rng.integers(1, 5)), trees.DETERMINISTIC)
        coins, finals = rng.random(200), rng.random(200)
        children = np.broadcast_to(np.asarray(node.children), (200, node.k))
        _, ours = trees.verify_node(rule, node, children, coins, finals)
        theirs = [
            sglang_kernel(node.target, node.children, c, f, single, acc)
            for c, f in zip(coins, finals, strict=True)
        ]
        np.testing.assert_array_equal(ours, theirs)


def test_sglang_tree_kl_per_node_at_t_half():
    """threshold_acc = 0.5, one child: kl_bin(min(1, 2 q(S)) ‖ q(S)); 0.105 nats at
    q(S) = 0.9 and 0.044 at 0.1."""
    rule = trees.make("sglang-tree", threshold_acc=0.5)
    for mass, wanted in ((0.9, 0.10536051565782628), (0.1, 0.044403007586882)):
        q = np.array([mass, (1 - mass) / 2, (1 - mass) / 2])
        node = trees.Node(target=q, draft=[0.2, 0.4, 0.4], children=[0])
        assert trees.node_divergence(rule, node) == pytest.approx(wanted, rel=1e-9)
        expected = divergences.binary_kl(min(1.0, 2 * mass), mass)
        assert trees.node_divergence(rule, node) == pytest.approx(float(expected), rel=1e-9)


def spechub_paper(target, draft, pair, coins):
    """SpecHub's verification as its paper's docstring reads (one coin per try)."""
    hub = int(np.argmax(draft))
    others = [i for i in range(len(draft)) if i != hub]
    first = {i: draft[i] for i in others}
    second = {i: draft[hub] * draft[i] / (1 - draft[hub]) for i in others}
    q1 = {i: max(target[i] - first[i], 0.0) for i in others}
    rej_first = {i: max(first[i] - target[i], 0.0) for i in others}
    rej_second = {i: max(second[i] - q1[i], 0.0) for i in others}
    m1, m2 = sum(rej_second.values()), sum(rej_first.values())
    qa1 = max(target[hub] - m1, 0.0)
    if pair[1] == hub:  # (i, a): try i, then a
        i = pair[0]
        if coins[0] < min(1.0, target[i] / first[i]):
            return i
        if m2 > 0 and coins[1] < min(1.0, qa1 / m2):
            return hub
    else:  # (a, i): try i, then a
        i = pair[1]
        if second[i] > 0 and coins[0] < min(1.0, q1[i] / second[i]):
            return i
        if m1 > 0 and coins[1] < min(1.0, target[hub] / m1):
            return hub
    return None


def test_spechub_is_the_papers_procedure():
    rng = np.random.default_rng(26)
    q = np.array([0.3, 0.1, 0.25, 0.2, 0.15])
    p = np.array([0.1, 0.45, 0.2, 0.05, 0.2])
    node = trees.Node(target=q, draft=p, k=2, scheme="hub")
    pairs = trees.draft_children(node, rng.random((30_000, 2)))
    accepted = np.zeros(6)
    for pair, coins in zip(pairs, rng.random((30_000, 2)), strict=True):
        token = spechub_paper(q, p, tuple(pair), coins)
        accepted[5 if token is None else token] += 1
    exact = trees.enumerate_node("spechub", node)
    assert chi_square_pvalue(accepted, np.append(exact.accepted, 1 - exact.acceptance)) > LEVEL
    other = trees.enumerate_node("rrs", trees.Node(target=q, draft=p, k=2))
    wrong = np.append(other.accepted, 1 - other.acceptance)
    assert chi_square_pvalue(accepted, wrong) < LEVEL  # negative control: i.i.d. RRS


def test_cactus_tree_accepts_the_raised_mass_within_its_budget():
    rng = np.random.default_rng(27)
    for delta in (0.05, 0.5, 2.0):
        for _ in range(30):
            node = random_node(rng, 8, int(rng.integers(1, 4)), trees.DETERMINISTIC)
            mass = node.target[list(node.children)].sum()
            exact = trees.enumerate_node(trees.make("cactus-tree", delta=delta), node)
            assert exact.acceptance == pytest.approx(float(gamma.exact_raised_mass(mass, delta)))
            assert divergences.kl(exact.law, node.target) <= delta * (1 + 1e-12) + 1e-15
            closed_form = trees.make("cactus-tree", delta=delta, exact=False)
            closed = trees.node_acceptance(closed_form, node)
            assert closed == pytest.approx(min(1, mass + np.sqrt(2 * delta * mass * (1 - mass))))
            sampled = random_node(rng, 6, 2, trees.WITHOUT_REPLACEMENT)
            tree = trees.node_divergence(trees.make("cactus-tree", delta=delta), sampled)
            assert tree <= delta * (1 + 1e-12) + 1e-15  # the mixture is within δ too


@pytest.mark.parametrize("exact, chain", [(True, "cactus-exact"), (False, "cactus")])
def test_cactus_rrs_with_one_child_is_cactus(exact, chain):
    rng = np.random.default_rng(28)
    for _ in range(30):
        q, p = random_row(rng, 7), random_row(rng, 7)
        node = trees.Node(target=q, draft=p, k=1)
        tree = trees.make("cactus-rrs", delta=0.4, exact=exact)
        wanted = law.output_law(rules.make(chain, delta=0.4), q, p)
        np.testing.assert_allclose(trees.node_law(tree, node), wanted, atol=1e-13)


def test_medusa_typical_accepts_the_best_passing_child():
    q = np.array([0.5, 0.3, 0.12, 0.06, 0.02])
    entropy = -np.sum(q * np.log(q + 1e-5))
    threshold = min(0.09, 0.3 * np.exp(-entropy))
    rule = trees.make("medusa-typical")
    node = trees.Node(target=q, draft=np.full(5, 0.2), children=[4, 2, 1])
    exact = trees.enumerate_node(rule, node)
    assert threshold < 0.12  # children 2 and 1 pass; 1 is the more likely
    np.testing.assert_allclose(exact.ends, [0.0, 0.0, 1.0, 0.0])
    nobody = trees.Node(target=q, draft=np.full(5, 0.2), children=[4, 3])
    kept = np.where(q >= threshold, q, 0.0)
    np.testing.assert_allclose(trees.node_law(rule, nobody), kept / kept.sum(), atol=1e-15)


def test_every_builtin_is_registered_with_a_spec_round_trip():
    for name in trees.names():
        rule = trees.make(name, **({"delta": 0.5} if name.startswith("cactus") else {}))
        assert trees.parse(trees.spec_of(rule)) == rule


def test_optimal_flow_is_a_coupling():
    rng = np.random.default_rng(29)
    node = random_node(rng, 6, 3, trees.WITH_REPLACEMENT)
    tuples, chance = trees.tuple_law(node)
    flow = optimum.optimal_flow(node.target, tuples, chance)
    assert np.all(flow.inflow <= node.target + 1e-15)
    assert np.all(flow.accepted.sum(axis=1) <= flow.chance + 1e-15)
    assert flow.acceptance == pytest.approx(optimum.optimal_acceptance(node), abs=1e-9)
