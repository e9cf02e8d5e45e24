"""The source-level frontier: its KKT form is optimal, and it dominates every rule."""

import cvxpy as cp
import numpy as np
import pytest

from cactus_theory import divergences, law, rules
from cactus_theory.core.rules import pareto
from sims import synthetic, tradeoff


def _pairs(seed: int, count: int, vocab: int, zeros: bool = True):
    rng = np.random.default_rng(seed)
    target = rng.dirichlet(np.full(vocab, 0.5), count)
    draft = rng.dirichlet(np.full(vocab, 0.5), count)
    if zeros:
        target[:, 0] = 0.0  # draft mass where the verifier has none
        target /= target.sum(axis=1, keepdims=True)
    return target, draft


@pytest.mark.parametrize("spread", [0.3, 1.0, 3.0])
def test_pareto_target_solves_the_lagrangian_exactly(spread):
    """max Σ min(p, h) − λ KL(h‖q), λ = 1/κ, solved by cvxpy (Clarabel) on small rows."""
    target, draft = _pairs(1, 4, 6)
    price = 1.0 / spread
    ours = pareto.pareto_target(target, draft, spread)
    for q, p, h in zip(target, draft, ours, strict=True):
        support = q > 0
        variable = cp.Variable(int(support.sum()), nonneg=True)
        objective = cp.sum(cp.minimum(p[support], variable)) - price * cp.sum(
            cp.rel_entr(variable, q[support])
        )
        problem = cp.Problem(cp.Maximize(objective), [cp.sum(variable) == 1])
        problem.solve(solver=cp.CLARABEL)

        ours_value = np.minimum(p, h).sum() - price * divergences.kl(h, q)
        assert ours_value >= problem.value - 1e-6
        np.testing.assert_allclose(h[support], variable.value, atol=2e-4)
        assert np.all(h[~support] == 0)


def test_pareto_structure_and_limits():
    target, draft = _pairs(2, 50, 12)
    h = pareto.pareto_target(target, draft, 2.0)
    np.testing.assert_allclose(h.sum(axis=1), 1.0, atol=1e-12)
    ratio = np.where(target > 0, h / np.where(target > 0, target, 1), np.nan)
    spread = np.nanmax(ratio, axis=1) / np.nanmin(ratio, axis=1)
    assert np.all(spread <= np.exp(2.0) * (1 + 1e-9))
    np.testing.assert_array_equal(pareto.pareto_target(target, draft, 0.0), target)


def test_pareto_dominates_every_rule_through_supporting_lines():
    """A <= A*(κ) + (K − K*(κ))/κ for every rule point (K, A) and every κ (exact bound)."""
    pool = synthetic.dirichlet_pool(0.3, num_pairs=300, seed=3)
    frontier_points = []
    for spread in (0.2, 0.5, 1.0, 2.0, 4.0, 8.0):
        stats = tradeoff.summary(tradeoff.row_stats(pareto.ParetoFrontier(spread), pool))
        frontier_points.append((spread, stats["emitted_kl"], stats["acceptance"]))
    for spec in (
        "sps",
        "tas",
        "cactus:delta=0.3",
        "cactus-exact:delta=1.0",
        "frontier:delta=0.1",
        "frontier:delta=2.0",
        "interp:alpha=0.3",
        "topk:k=2",
    ):
        stats = tradeoff.summary(tradeoff.row_stats(rules.parse(spec), pool))
        for spread, kl_star, acc_star in frontier_points:
            bound = acc_star + (stats["emitted_kl"] - kl_star) / spread
            assert stats["acceptance"] <= bound + 1e-7, (spec, spread)


def test_per_context_frontier_beats_cactus_at_equal_emitted_kl():
    """In every context, frontier at δ = cactus's emitted KL accepts at least as much."""
    pool = synthetic.zipf_pool(noise=0.8, vocab_size=30, num_pairs=40, seed=2)
    cactus = rules.make("cactus", delta=0.5)
    stats = tradeoff.row_stats(cactus, pool)
    for row in range(pool.size):
        frontier = rules.make("frontier", delta=float(stats.emitted_kl[row]))
        accepted = law.acceptance(frontier, pool.target_probs[row], pool.draft_probs[row])
        assert accepted >= stats.acceptance[row] - 1e-9


def test_parse_and_spec_round_trip():
    rule = rules.parse("pareto:spread=2.5")
    assert isinstance(rule, pareto.ParetoFrontier) and rule.spread == 2.5
    assert rules.parse(rules.spec_of(rule)) == rule
    assert rules.parse("cactus:delta=0.5") == rules.make("cactus", delta=0.5)
    with pytest.raises(ValueError, match="^spread"):
        rules.parse("pareto:spread=-1")
    with pytest.raises(ValueError, match="^spread"):
        rules.parse("pareto:spread=abc")
    with pytest.raises(ValueError, match="^delta"):
        rules.parse("pareto:delta=1")
