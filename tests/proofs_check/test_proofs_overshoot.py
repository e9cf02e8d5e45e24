"""The closed form's overshoot and the sharp Cor. 6 region (proofs_check.overshoot)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate

from cactus_theory import divergences
from cactus_theory.core import gamma
from proofs_check import overshoot

masses = st.floats(min_value=1e-12, max_value=1 - 1e-12)
budgets = st.floats(min_value=1e-6, max_value=1e3)


def _direct_branch_kl(q, delta):
    raised = float(gamma.closed_form_raised_mass(q, delta))
    return float(divergences.binary("kl", raised, q))


@pytest.mark.parametrize("delta", [1e-8, 1e-4, 0.05, 0.5, 1.2564312086261695, 7.0, 1e4])
def test_measured_supremum_equals_log1p_2delta_over_delta(delta):
    value, at = overshoot.measured_overshoot(delta)
    assert value == pytest.approx(math.log1p(2 * delta) / delta, abs=1e-9)
    assert at == pytest.approx(1 / (1 + 2 * delta), rel=1e-9)


def test_the_maximum_is_attained_at_the_kink():
    delta = 0.3
    kink = float(overshoot.saturation_kink(delta))
    assert _direct_branch_kl(kink, delta) == pytest.approx(math.log1p(2 * delta), rel=1e-12)


@settings(max_examples=300, deadline=None)
@given(q=masses, delta=budgets)
def test_no_branch_exceeds_the_overshoot_bound(q, delta):
    """A counterexample search (hypothesis) against sup K(q, δ)/δ = log(1 + 2δ)/δ."""
    assert overshoot.closed_form_branch_kl(q, delta) <= math.log1p(2 * delta) * (1 + 1e-12)


@settings(max_examples=300, deadline=None)
@given(q=masses, delta=budgets)
def test_stable_branch_kl_agrees_with_the_core_binary_kl(q, delta):
    assert float(overshoot.closed_form_branch_kl(q, delta)) == pytest.approx(
        _direct_branch_kl(q, delta), rel=1e-9, abs=1e-15
    )


def test_overshoot_exceeds_one_exactly_below_the_critical_budget():
    critical = overshoot.delta_critical()
    assert math.log1p(2 * critical) == pytest.approx(critical, rel=1e-15)
    assert (
        overshoot.analytic_overshoot(critical * 0.999)
        > 1
        > overshoot.analytic_overshoot(critical * 1.001)
    )


def test_q_star_solves_its_equation_and_gamma_one_is_one_below_it():
    star = overshoot.q_star()
    assert -math.log(star) == pytest.approx((1 - star) / (2 * star), rel=1e-14)
    assert overshoot.gamma_one(star * 0.99) == 1.0
    assert overshoot.gamma_one(star * 1.01) < 1.0
    assert overshoot.gamma_one(0.7) == 0.7


@settings(max_examples=400, deadline=None)
@given(q=st.floats(min_value=1e-6, max_value=1 - 1e-6), delta=budgets)
def test_sharp_condition_predicts_the_budget_exactly(q, delta):
    """KL(h‖q) ≤ δ iff δ ≤ δ₁(q) or δ ≥ −log q (away from the boundary)."""
    kl = float(overshoot.closed_form_branch_kl(q, delta))
    if abs(kl - delta) <= 1e-9 * delta:
        return
    assert (kl <= delta) == overshoot.predicted_within_budget(q, delta)


@settings(max_examples=300, deadline=None)
@given(q=st.floats(min_value=1e-9, max_value=0.5), delta=budgets)
def test_gamma_at_most_one_minus_q_is_sufficient(q, delta):
    raised = min(1.0, q + math.sqrt(2 * delta * q * (1 - q)))
    if raised <= 1 - q:
        assert overshoot.closed_form_branch_kl(q, delta) <= delta * (1 + 1e-12)


def test_cor6_sharp_region_is_strictly_larger_than_gamma_half():
    q, delta = 0.3, 0.5  # γ ≈ 0.758 > 1/2, yet within budget
    raised = q + math.sqrt(2 * delta * q * (1 - q))
    assert raised > 0.5 and overshoot.predicted_within_budget(q, delta)
    assert overshoot.closed_form_branch_kl(q, delta) <= delta


def test_phi_1p_is_accurate_near_zero_and_far_from_it():
    """φ(1 + w) = ∫_0^w log(1 + s) ds, integrated independently by quad."""
    for shift in (-0.9, -0.04, -1e-9, 1e-12, 0.03, 0.049, 0.051, 5.0):
        expected, _ = integrate.quad(np.log1p, 0.0, shift, epsabs=0.0, epsrel=1e-13)
        assert float(overshoot.phi_1p(shift)) == pytest.approx(expected, rel=1e-11)
    assert float(overshoot.phi_1p(0.0)) == 0.0


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5])
def test_gamma_one_rejects_masses_outside_the_open_interval(bad):
    with pytest.raises(ValueError, match="^target_mass"):
        overshoot.gamma_one(bad)
