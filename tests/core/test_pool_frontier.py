"""The pool-level frontier (``core.pool_frontier``): the exact solver of s, the frontier
against brute-force optima on tiny pools, and its dominance over every rule at equal KL."""

import cvxpy as cp
import numpy as np
import pytest

from cactus_theory import divergences, law, rules
from cactus_theory.core import pool_frontier
from cactus_theory.core.rules import pareto


def _pool(seed: int, count: int, vocab: int, concentration: float = 0.5):
    rng = np.random.default_rng(seed)
    target = rng.dirichlet(np.full(vocab, concentration), count)
    draft = rng.dirichlet(np.full(vocab, concentration), count)
    target[: count // 4, 0] = 0.0  # draft mass where the verifier has none
    target /= target.sum(axis=1, keepdims=True)
    draft[count // 4 : count // 2, 1] = 0.0  # verifier mass the draft never proposes
    draft /= draft.sum(axis=1, keepdims=True)
    return target, draft


@pytest.mark.parametrize("spread", [0.0, 1e-3, 0.4, 2.0, 30.0, 700.0])
def test_the_exact_scale_sums_to_one_and_matches_the_rule(spread):
    """Σ clip(p, s q, s e^κ q) = 1 to rounding, and h equals the pareto rule's (whose own
    solver is iterative; at κ = 700 it is looser, so there only our sum is checked)."""
    target, draft = _pool(0, 400, 7)
    ours = pool_frontier.pareto_law(target, draft, spread)
    np.testing.assert_allclose(ours.sum(axis=1), 1.0, atol=1e-14)
    if spread > 0:
        scale = pool_frontier.pareto_scale(target, draft, spread)[:, None]
        ratio = np.exp(spread)
        unnormalised = np.clip(draft, scale * target, scale * ratio * target).sum(axis=1)
        np.testing.assert_allclose(unnormalised, 1.0, atol=1e-13)
    if spread < 100:
        np.testing.assert_allclose(ours, pareto.pareto_target(target, draft, spread), atol=1e-12)


def test_padding_columns_change_nothing():
    """Rows packed to their support, padded with columns where both laws are 0."""
    target, draft = _pool(1, 50, 5)
    padded_target = np.concatenate([target, np.zeros((50, 3))], axis=1)
    padded_draft = np.concatenate([draft, np.zeros((50, 3))], axis=1)
    for spread in (0.5, 5.0):
        assert pool_frontier.frontier_point(padded_target, padded_draft, spread) == pytest.approx(
            pool_frontier.frontier_point(target, draft, spread), abs=1e-15
        )


def _brute_force(target, draft, budget):
    """max mean Σ min(p, h) s.t. mean KL(h‖q) <= budget, by cvxpy (Clarabel)."""
    count = target.shape[0]
    laws, objective, spent = [], 0, 0
    for q, p in zip(target, draft, strict=True):
        support = q > 0
        h = cp.Variable(int(support.sum()), nonneg=True)
        laws.append(h)
        objective += cp.sum(cp.minimum(p[support], h))
        spent += cp.sum(cp.rel_entr(h, q[support]))
    constraints = [cp.sum(h) == 1 for h in laws] + [spent <= count * budget]
    problem = cp.Problem(cp.Maximize(objective / count), constraints)
    problem.solve(solver=cp.CLARABEL)
    return problem.value


@pytest.mark.parametrize("budget", [0.01, 0.1, 0.4])
def test_frontier_acceptance_is_the_brute_force_optimum(budget):
    """On a tiny pool (6 positions, 4 tokens) the frontier's acceptance at mean KL K equals
    the optimum of the joint problem over all per-position laws (the KL budget shared
    across positions), which no per-position δ can beat."""
    target, draft = _pool(2, 6, 4)
    ours = pool_frontier.frontier_acceptance(target, draft, budget)
    assert ours == pytest.approx(_brute_force(target, draft, budget), abs=2e-6)
    kl, acceptance = pool_frontier.frontier_point(
        target, draft, pool_frontier.frontier_spread(target, draft, budget)
    )
    assert kl == pytest.approx(budget, abs=1e-9)
    assert acceptance == pytest.approx(ours, abs=1e-12)


def test_frontier_against_a_grid_on_two_binary_positions():
    """Two positions over two tokens: h is one number per position; a fine grid of (h_1,
    h_2) under the mean-KL budget gets within its resolution of the frontier, never above."""
    target = np.array([[0.7, 0.3], [0.2, 0.8]])
    draft = np.array([[0.1, 0.9], [0.6, 0.4]])
    grid = np.linspace(0, 1, 801)
    first = np.stack([grid, 1 - grid], axis=1)
    kl_1 = divergences.kl_rows(first, target[0])
    kl_2 = divergences.kl_rows(first, target[1])
    acc_1 = np.minimum(first, draft[0]).sum(axis=1)
    acc_2 = np.minimum(first, draft[1]).sum(axis=1)
    for budget in (0.02, 0.2, 0.6):
        feasible = (kl_1[:, None] + kl_2[None, :]) / 2 <= budget
        best = np.max(np.where(feasible, (acc_1[:, None] + acc_2[None, :]) / 2, -1))
        ours = pool_frontier.frontier_acceptance(target, draft, budget)
        assert best <= ours + 1e-12
        assert ours - best < 2e-3


def test_the_curve_is_monotone_and_concave_and_ends_at_the_reachable_mass():
    target, draft = _pool(3, 300, 12)
    curve = pool_frontier.frontier_curve(target, draft, pool_frontier.default_spreads(30))
    kls, accs = np.array(curve).T
    assert kls[0] == 0.0
    assert accs[0] == pytest.approx(np.minimum(target, draft).sum(axis=1).mean(), abs=1e-14)
    assert np.all(np.diff(kls) >= -1e-12) and np.all(np.diff(accs) >= -1e-12)
    # concave: slopes between successive distinct points never increase
    keep = np.concatenate([[True], np.diff(kls) > 1e-9])
    slopes = np.diff(accs[keep]) / np.diff(kls[keep])
    assert np.all(np.diff(slopes) <= 1e-6)
    reachable = np.where(target > 0, draft, 0).sum(axis=1).mean()
    assert accs[-1] == pytest.approx(reachable, abs=1e-9)
    beyond = 10 * kls[-1]  # a finite KL past the curve's end: the reachable mass
    assert pool_frontier.frontier_acceptance(target, draft, beyond) == pytest.approx(
        accs[-1], abs=1e-12
    )
    # an infinite KL allows h = p, which accepts every draft (more than the reachable mass,
    # as the engines' relaxed rules do when they accept tokens the verifier excludes)
    assert reachable < 1 - 1e-3
    assert pool_frontier.frontier_acceptance(target, draft, float("inf")) == 1.0


@pytest.mark.parametrize(
    "spec",
    [
        "sps",
        "cactus:delta=0.3",
        "cactus:delta=2.0",
        "cactus-exact:delta=0.5",
        "frontier:delta=0.2",
        "interp:alpha=0.4",
        "tas",
        "topk:k=3",
        "greedy",
    ],
)
def test_the_frontier_dominates_every_rule_at_equal_kl(spec):
    """A(rule) <= A*(mean KL of what the rule emits), on a pool where the rules differ."""
    target, draft = _pool(4, 200, 8, concentration=0.3)
    rule = rules.parse(spec)
    acceptance = law.acceptance_rows(rule, target, draft).mean()
    emitted = law.output_law_rows(rule, target, draft)
    emitted = emitted / emitted.sum(axis=1, keepdims=True)
    kl = float(divergences.kl_rows(emitted, target).mean())
    assert acceptance <= pool_frontier.frontier_acceptance(target, draft, kl) + 1e-9


def test_a_point_above_the_frontier_is_caught():
    """Negative control: SpS's acceptance plus 0.01 at KL 0 is above A*(0)."""
    target, draft = _pool(5, 100, 6)
    sps = np.minimum(target, draft).sum(axis=1).mean()
    assert sps + 0.01 > pool_frontier.frontier_acceptance(target, draft, 0.0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda t, d: pool_frontier.frontier_acceptance(t, d, -0.1), "mean_kl"),
        (lambda t, d: pool_frontier.frontier_curve(t, d, [0.1, -1]), "spreads"),
        (
            lambda t, d: pool_frontier.frontier_acceptance(t, np.pad(d, ((0, 0), (0, 1))), 0.1),
            "draft",
        ),
        (lambda t, d: pool_frontier.frontier_acceptance(t * 2, d, 0.1), "target"),
    ],
)
def test_bad_input_names_the_argument(call, message):
    target, draft = _pool(6, 5, 4)
    with pytest.raises(ValueError, match=message):
        call(target, draft)


def test_many_levels_at_once_equal_one_at_a_time():
    target, draft = _pool(7, 300, 10)
    levels = [0.0, 0.003, 0.05, 0.3, 1.0, float("inf")]
    many, curve = pool_frontier.frontier_acceptances(target, draft, levels, [0.5, 3.0])
    ones = [pool_frontier.frontier_acceptance(target, draft, level) for level in levels]
    np.testing.assert_allclose(many, ones, atol=1e-10)
    assert len(curve) == 4  # 0, 0.5, 3, MAX_SPREAD
