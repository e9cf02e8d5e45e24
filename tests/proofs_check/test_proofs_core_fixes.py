"""Regression tests for the two core bugs the exact checks (proofs_check) found.

1. frontier lost tails of tiny verifier mass (total − prefix cancels): with q ≈ (1, 5e−27,
   5e−27) and the draft on the tiny tokens it returned h = (0.5, 0.25, 0.25), KL ≈ 29 for
   a budget of 0.016.
2. A branch whose γ_n equals q_n must leave q unchanged (δ = 0 is SpS); with q_n rounding
   to 1 next to tiny positive masses the targets zeroed them (reverse KL = +inf).
"""

import numpy as np
import pytest
from scipy import optimize

from cactus_theory import divergences, law, rules
from cactus_theory.core import gamma


def _symmetric_tail_acceptance(tiny: float, delta: float) -> float:
    """q = (1 − 2ε, ε, ε), p = (0, ½, ½): h = (1 − 2m, m, m) with KL(h‖q) = δ; acceptance 2m."""

    def excess(mass: float) -> float:
        h = np.array([1 - 2 * mass, mass, mass])
        q = np.array([1 - 2 * tiny, tiny, tiny])
        return float(divergences.kl_rows(h, q)) - delta

    return 2 * optimize.brentq(excess, tiny, 0.25, xtol=1e-18, rtol=1e-15)


@pytest.mark.parametrize("tiny", [4.94224065e-27, 1e-12, 1e-300])
def test_frontier_keeps_a_tail_of_tiny_masses(tiny):
    target = np.array([1 - 2 * tiny, tiny, tiny])
    draft = np.array([0.0, 0.5, 0.5])
    delta = 0.016358981089270183
    rule = rules.make("frontier", delta=delta)
    adjusted = rule.target_law(target / target.sum(), draft)
    assert divergences.kl_rows(adjusted, target) <= delta * (1 + 1e-12)
    expected = _symmetric_tail_acceptance(tiny, delta)
    assert law.acceptance(rule, target, draft) == pytest.approx(expected, rel=1e-9)


def test_frontier_budget_holds_on_full_rows_for_a_confident_verifier():
    target = np.array([0.9999999957059823, 4.2940177003047814e-09])
    draft = np.array([0.13340906930741614, 0.8665909306925837])
    delta = 0.04943190735967431
    adjusted = rules.make("frontier", delta=delta).target_law(target, draft)
    assert divergences.kl_rows(adjusted, target) <= delta * (1 + 1e-12)
    assert adjusted.sum() == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize(
    "spec",
    ["cactus:delta=0", "cactus-exact:delta=0", "cactus-exact:delta=0,divergence=reverse-kl"],
)
def test_zero_budget_branch_targets_equal_the_verifier_bit_for_bit(spec):
    target = np.array([1.0, 2.3039711656101e-31, 0.0])
    draft = np.array([0.2, 0.5, 0.3])
    rule = rules.parse(spec)
    for token in range(3):
        assert np.array_equal(rule.targets_for(target, draft, np.asarray(token)), target)


def test_reverse_kl_branch_stays_finite_when_the_drafted_mass_rounds_to_one():
    target = np.array([1.0, 2.3039711656101e-31])
    rule = rules.make("cactus-exact", delta=0.0026, divergence="reverse-kl")
    adjusted = rule.targets_for(target, np.array([0.5, 0.5]), np.asarray(0))
    assert divergences.rows("reverse-kl", adjusted, target) <= 0.0026


def _bisect(target_mass, delta, divergence):
    """Largest γ in [q, 1] with binary D(γ‖q) <= δ, by 200 halvings (low stays feasible)."""
    low, high = target_mass.copy(), np.ones_like(target_mass)
    top = divergences.binary(divergence, high, target_mass) <= delta
    low[top] = 1.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        feasible = divergences.binary(divergence, middle, target_mass) <= delta
        low = np.where(~top & feasible, middle, low)
        high = np.where(~top & ~feasible, middle, high)
    return low


@pytest.mark.parametrize("divergence", ["chi2", "hellinger", "tv"])
@pytest.mark.parametrize("delta", [1e-10, 6.892122167423409e-08, 1.3e-05, 0.3, 0.9])
def test_closed_form_raised_mass_is_within_budget_as_computed(divergence, delta):
    """Closed forms rounded one ulp high exceeded tiny budgets (a third of all q_n at δ=1e−8)."""
    rng = np.random.default_rng(7)
    target_mass = np.concatenate(
        [1 / (1 + np.exp(-rng.uniform(-36, 36, 4000))), [0.9999744230133439, 0.999971689731251]]
    )
    raised = gamma.exact_raised_mass(target_mass, delta, divergence)
    assert np.all(divergences.binary(divergence, raised, target_mass) <= delta)
    assert np.all(raised >= target_mass)
    # Still the optimum: equal to plain bisection of the scalar problem up to a few ulps.
    exact = _bisect(target_mass, delta, divergence)
    np.testing.assert_allclose(raised, exact, rtol=0, atol=4 * np.spacing(1.0))
