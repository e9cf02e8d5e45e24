"""The frontier rule: KKT structure, edge cases, optimality, and scale."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from cactus_theory import divergences, law, rules
from cactus_theory.core.rules.frontier import frontier_constants, frontier_target
from cactus_theory.testing.strategies import pairs, positive_budgets


def acceptance(target, draft, delta):
    return float(np.minimum(draft, frontier_target(target, draft, delta)).sum())


@given(pairs(), positive_budgets)
def test_kkt_structure(pair, delta):
    target, draft = pair
    lift, cap = frontier_constants(target, draft, delta)
    adjusted = frontier_target(target, draft, delta)
    assert abs(adjusted.sum() - 1.0) < 1e-12
    if divergences.kl(draft, target) <= delta:
        assert np.array_equal(adjusted, draft)
        return
    assert lift <= 1.0 + 1e-12 and cap >= 1.0
    expected = np.clip(draft, lift * target, np.where(target > 0, cap * target, 0.0))
    assert np.allclose(adjusted, expected, atol=1e-15)
    spent = divergences.kl(adjusted, target)
    assert spent <= delta * (1 + 1e-9) + 1e-15
    # Either the budget is used up, or acceptance is already maximal: every token the
    # draft proposes where q > 0 is fully accepted (h >= p on supp q).
    saturated = np.all(adjusted[target > 0] >= draft[target > 0] - 1e-15)
    assert saturated or spent == pytest.approx(delta, rel=1e-6, abs=1e-14)


def test_draft_within_budget_gives_the_draft_and_zero_budget_gives_the_target():
    target = np.array([0.5, 0.3, 0.2])
    draft = np.array([0.45, 0.35, 0.2])
    assert divergences.kl(draft, target) < 0.01
    assert np.array_equal(frontier_target(target, draft, 0.01), draft)
    assert np.array_equal(frontier_target(target, draft, 0.0), target)
    assert acceptance(target, draft, 0.01) == pytest.approx(1.0)


def test_draft_mass_where_target_is_zero_caps_acceptance():
    """No finite budget accepts a token the verifier gives probability 0."""
    target = np.array([0.6, 0.4, 0.0])
    draft = np.array([0.2, 0.3, 0.5])
    for delta in (0.01, 0.5, 50.0):
        adjusted = frontier_target(target, draft, delta)
        assert adjusted[2] == 0.0
        assert acceptance(target, draft, delta) <= 0.5 + 1e-15
    # With budget to spare the ceiling P_draft(q > 0) = 0.5 is reached with minimal KL.
    assert acceptance(target, draft, 50.0) == pytest.approx(0.5)
    assert divergences.kl(frontier_target(target, draft, 50.0), target) < 50.0


def test_zero_draft_tokens_are_lifted_not_dropped():
    target = np.array([0.25, 0.25, 0.25, 0.25])
    draft = np.array([0.7, 0.3, 0.0, 0.0])
    adjusted = frontier_target(target, draft, 0.2)
    lift, _ = frontier_constants(target, draft, 0.2)
    assert adjusted[2] == adjusted[3] == pytest.approx(lift * 0.25)
    assert adjusted[2] > 0


def test_tiny_budget():
    rng = np.random.default_rng(3)
    target, draft = rng.dirichlet(np.ones(50), size=2)
    for delta in (1e-14, 1e-12, 1e-9):
        adjusted = frontier_target(target, draft, delta)
        assert divergences.kl(adjusted, target) == pytest.approx(delta, rel=1e-6)
        assert acceptance(target, draft, delta) >= 1 - divergences.tv(draft, target)


def test_large_vocabulary():
    """V = 200k with zeros in both rows: the solve stays exact and O(V log V)."""
    rng = np.random.default_rng(7)
    size = 200_000
    target = rng.dirichlet(np.full(size, 0.05))
    draft = rng.dirichlet(np.full(size, 0.05))
    target[:1000] = 0.0
    draft[1000:2000] = 0.0
    target /= target.sum()
    draft /= draft.sum()
    for delta in (1e-6, 0.1, 1.0):
        adjusted = frontier_target(target, draft, delta)
        assert abs(adjusted.sum() - 1.0) < 1e-12
        assert np.all(adjusted[:1000] == 0.0)
        assert divergences.kl(adjusted, target) == pytest.approx(delta, rel=1e-6)


def brute_force_acceptance(target, draft, delta, grid=700):
    """max Σ min(p, h) over a dense grid of the 2-simplex with KL(h‖q) <= δ (V = 3)."""
    first, second = np.meshgrid(np.linspace(0, 1, grid), np.linspace(0, 1, grid))
    keep = first + second <= 1
    points = np.stack([first[keep], second[keep], 1 - first[keep] - second[keep]], axis=1)
    feasible = divergences.kl_rows(points, target[None]) <= delta
    return float(np.minimum(points[feasible], draft).sum(axis=1).max())


@pytest.mark.parametrize("seed", range(6))
def test_optimal_against_a_dense_grid(seed):
    rng = np.random.default_rng(seed)
    target, draft = rng.dirichlet(np.full(3, 0.8), size=2)
    for delta in (0.02, 0.1, 0.4):
        exact = acceptance(target, draft, delta)
        grid_best = brute_force_acceptance(target, draft, delta)
        # The grid is feasible, so it cannot beat the optimum; with spacing 1/700 it comes
        # within a few grid steps of it.
        assert grid_best <= exact + 1e-12
        assert grid_best >= exact - 5e-3


@given(pairs(max_vocab=16), positive_budgets)
def test_frontier_beats_interpolation_at_equal_emitted_divergence(pair, delta):
    """interp emits h = αp + (1−α)q; at the same KL the frontier accepts at least as much."""
    target, draft = pair
    for alpha in (0.1, 0.5, 0.9):
        interp = rules.make("interp", alpha=alpha)
        spent = law.emitted_divergence(interp, target, draft)
        if np.isfinite(spent):
            assert acceptance(target, draft, spent) >= law.acceptance(interp, target, draft) - 1e-9


def reference_constants(target, draft, delta, steps=64):
    """(c_lo, c_hi) by plain nested bisection on the KKT path (an independent, slow oracle).

    For a cap c the lift c_lo solves Σ clip(p, c_lo q, c q) = 1 (bisection on [0, 1]);
    KL(h(c)‖q) rises with c, so c comes from bisection on log c over [0, log(max ratio)],
    keeping the end whose KL (``divergences.kl``) is within δ.
    """
    support = target > 0
    ratios = draft[support] / target[support]
    upper = max(1.0, float(ratios.max()))

    def law(lift, cap):
        return np.clip(draft, lift * target, np.where(support, cap * target, 0.0))

    def lift_for(cap):
        low, high = 0.0, 1.0
        for _ in range(steps):
            middle = 0.5 * (low + high)
            low, high = (middle, high) if law(middle, cap).sum() < 1.0 else (low, middle)
        return 0.5 * (low + high)

    def kl_at(log_cap):
        cap = float(np.exp(log_cap))
        return divergences.kl_rows(law(lift_for(cap), cap), target)

    if kl_at(np.log(upper)) <= delta:
        return lift_for(upper), upper
    low, high = 0.0, float(np.log(upper))
    for _ in range(steps):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if kl_at(middle) <= delta else (low, middle)
    return lift_for(float(np.exp(low))), float(np.exp(low))


@settings(max_examples=40)
@given(pairs(max_vocab=12), positive_budgets)
def test_matches_nested_bisection_on_the_kkt_path(pair, delta):
    target, draft = pair
    if divergences.kl(draft, target) <= delta:
        return
    expected_lift, expected_cap = reference_constants(target, draft, delta)
    lift, cap = frontier_constants(target, draft, delta)
    adjusted = frontier_target(target, draft, delta)
    # Feasible as the solver computes KL; rebuilding h and re-summing KL adds rounding.
    assert divergences.kl(adjusted, target) <= delta * (1 + 1e-9) + 1e-15
    expected = np.clip(
        draft, expected_lift * target, np.where(target > 0, expected_cap * target, 0)
    )
    # Same optimum: acceptance to rounding (c itself is ill-conditioned where KL is flat).
    assert acceptance(target, draft, delta) == pytest.approx(
        float(np.minimum(draft, expected).sum()), abs=1e-9
    )


def test_segment_ending_where_the_lift_reaches_zero():
    """The root's segment ends where c_lo = 0 (an infinite slope): bisect, then Newton."""
    target = np.array([5.3080619e-57, 1.0])
    draft = np.array([1.0, 0.0])
    adjusted = frontier_target(target, draft, 1e-14)
    assert divergences.kl(adjusted, target) == pytest.approx(1e-14, rel=1e-6)
    _, cap = frontier_constants(target, draft, 1e-14)
    assert cap == pytest.approx(2.0517e40, rel=1e-3)


def test_tiny_moved_mass_next_to_a_large_draft_mass():
    """E(r_k) must not pick up the rounding of p_k − r_k q_k for the token k itself."""
    target = np.array([4.66171647e-114, 7.97494595e-10, 9.99999998e-01, 1.15924137e-09, 0, 0])
    draft = np.array([1.70194749e-36, 1.0, 2.22044326e-16, 3.07664168e-44, 8.66e-56, 2.79e-22])
    target, draft = target / target.sum(), draft / draft.sum()
    lift, cap = frontier_constants(target, draft, 50.0)
    assert cap == draft[0] / target[0]  # the curve ends before the budget is spent
    adjusted = frontier_target(target, draft, 50.0)
    assert abs(adjusted.sum() - 1.0) < 1e-15
    assert divergences.kl(adjusted, target) < 50.0


def test_root_within_rounding_of_c_equal_one():
    """δ far below KL's resolution near c = 1 still gets (most of) the budget."""
    target = np.array([4.0369109596765466e-13, 9.9999999999959632e-01])
    draft = np.array([3.4133048484121593e-38, 1.0])
    adjusted = frontier_target(target, draft, 1e-14)
    assert 0.5e-14 <= divergences.kl(adjusted, target) <= 1e-14


def test_masses_below_the_rounding_of_one_keep_h_a_law():
    """q = (1, 1e-251, 2e-255), p = (1, 1e-268, 7e-251), δ = 1e-250: the small parts do not
    balance in float64, which put c_lo at 6.5 and h_0 = 6.5 (found by the rule contract);
    c_lo <= 1 <= c_hi keeps h a law within the budget, in numpy and torch alike."""
    target = np.array([1.0, 1e-251, 2e-255])
    draft = np.array([1.0, 1e-268, 7e-251])
    rule = rules.make("frontier", delta=1e-250)
    emitted = law.output_law(rule, target, draft)
    assert emitted[0] == 1.0 and emitted.sum() == 1.0
    assert divergences.kl(emitted, target) <= 1e-250
    torch = pytest.importorskip("torch")
    from cactus_theory.sampler.rules.frontier import frontier_constants as torch_constants

    lift, cap = torch_constants(torch.as_tensor(target)[None], torch.as_tensor(draft)[None], 1e-250)
    assert float(lift[0]) <= 1.0 <= float(cap[0])
