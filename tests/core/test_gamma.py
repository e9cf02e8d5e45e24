"""γ*(q_n, δ): feasibility, tightness, saturation, monotonicity and the cap."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cactus_theory import divergences
from cactus_theory.core import gamma

DIVERGENCES = ("kl", "reverse-kl", "chi2", "hellinger", "tv", "js")
# Subnormal masses (< 2.2e-308) are excluded: their products lose all precision.
masses = st.one_of(
    st.floats(0.0, 1.0).filter(lambda value: value == 0.0 or value >= 1e-300),
    st.sampled_from([0.0, 1e-300, 1e-12, 1e-6, 0.5, 1 - 1e-12, 1.0]),
)
budgets = st.sampled_from([1e-12, 1e-8, 1e-4, 0.01, 0.1, 0.5, 1.0, 3.0])


@given(masses, budgets, st.sampled_from(DIVERGENCES))
def test_exact_mass_is_feasible_and_maximal(q_n, delta, name):
    raised = float(gamma.exact_raised_mass(np.array([q_n]), delta, name)[0])
    assert q_n <= raised <= 1.0
    # Feasible as computed, for roots and closed forms alike.
    assert float(divergences.binary(name, raised, q_n)) <= delta
    # Maximal: any visibly larger γ breaks the budget (or there is no larger γ).
    step = 1e-6 * (raised - q_n) + 8 * np.spacing(raised)
    larger = raised + step
    if larger < 1.0:
        assert float(divergences.binary(name, larger, q_n)) > delta, (raised, larger)
    if float(divergences.binary(name, 1.0, q_n)) <= delta:
        assert raised == 1.0


@given(masses, st.sampled_from(DIVERGENCES))
def test_raised_mass_grows_with_budget(q_n, name):
    values = [float(gamma.exact_raised_mass([q_n], d, name)[0]) for d in (0, 1e-6, 0.01, 0.3, 2)]
    assert values == sorted(values)
    assert values[0] == q_n


@given(st.lists(masses, min_size=1, max_size=8), budgets, st.sampled_from(DIVERGENCES))
def test_cap_returns_min_of_root_and_cap(q_list, delta, name):
    q_n = np.array(q_list)
    cap = np.random.default_rng(len(q_list)).random(q_n.shape)
    capped = gamma.exact_raised_mass(q_n, delta, name, cap=cap)
    plain = gamma.exact_raised_mass(q_n, delta, name)
    assert np.allclose(capped, np.minimum(plain, cap), rtol=1e-12, atol=1e-15)


def test_closed_forms():
    q_n, delta = 0.2, 0.05
    assert gamma.exact_raised_mass([q_n], delta, "chi2")[0] == pytest.approx(
        q_n + math.sqrt(delta * q_n * (1 - q_n))
    )
    assert gamma.exact_raised_mass([q_n], delta, "tv")[0] == pytest.approx(q_n + delta)
    theta = math.asin(math.sqrt(q_n)) + math.acos(1 - delta)
    assert gamma.exact_raised_mass([q_n], delta, "hellinger")[0] == pytest.approx(
        math.sin(theta) ** 2
    )
    assert gamma.closed_form_raised_mass([q_n], delta)[0] == pytest.approx(
        q_n + math.sqrt(2 * delta * q_n * (1 - q_n))
    )


def test_special_masses():
    # KL: a token the verifier never emits cannot be raised; reverse KL and JS can.
    assert gamma.exact_raised_mass([0.0], 0.5, "kl")[0] == 0.0
    assert gamma.exact_raised_mass([0.0], 0.5, "reverse-kl")[0] == pytest.approx(1 - math.exp(-0.5))
    assert gamma.exact_raised_mass([0.0], 0.1, "js")[0] > 0.0
    for name in DIVERGENCES:
        assert gamma.exact_raised_mass([1.0], 0.5, name)[0] == 1.0
    # KL saturates at γ = 1 exactly when −log q_n <= δ.
    assert gamma.exact_raised_mass([math.exp(-0.5)], 0.5, "kl")[0] == 1.0
    assert gamma.exact_raised_mass([math.exp(-0.5) * 0.999], 0.5, "kl")[0] < 1.0


def test_closed_form_is_the_second_order_kl_root_and_can_overshoot():
    """Cor. 5's γ is exact for χ²/2; in KL it is accurate for small δ and overshoots."""
    q_n = np.array([0.3])
    small = gamma.closed_form_raised_mass(q_n, 1e-8)
    exact = gamma.exact_raised_mass(q_n, 1e-8, "kl")
    assert small[0] - q_n[0] == pytest.approx(exact[0] - q_n[0], rel=1e-3)
    assert np.allclose(
        gamma.closed_form_raised_mass(q_n, 0.1), gamma.exact_raised_mass(q_n, 0.2, "chi2")
    )
    # At q_n = 0.5, δ = 0.5 the closed form saturates (γ = 1): KL = log 2 > δ.
    saturated = gamma.closed_form_raised_mass(np.array([0.5]), 0.5)
    assert saturated[0] == 1.0
    assert divergences.binary_kl(saturated, 0.5)[0] == pytest.approx(math.log(2))
    # ... and below saturation it can undershoot (q_n = 0.01: KL ≈ 0.168 < δ = 0.5).
    assert divergences.binary_kl(gamma.closed_form_raised_mass(np.array([0.01]), 0.5), 0.01) < 0.5


@given(masses.filter(lambda value: value < 1.0), budgets, st.sampled_from(gamma.ROOT))
def test_newton_starts_right_of_the_root(q_n, delta, name):
    """start_bound is an upper bound on γ*: D >= δ there (or it is past γ = 1)."""
    start = float(gamma.start_bound(name, np.array([q_n]), delta)[0])
    assert start >= float(gamma.exact_raised_mass([q_n], delta, name)[0])
    if start < 1.0 and (q_n > 0.0 or name != "kl"):
        assert float(divergences.binary(name, start, q_n)) >= delta * (1 - 1e-12)


@given(
    masses.filter(lambda value: 0.0 < value < 1.0), st.floats(0.0, 1.0), st.sampled_from(gamma.ROOT)
)
def test_newton_terms_match_the_binary_divergence(q_n, fraction, name):
    """The iterates' value is divergences.binary to rounding; the slope is its derivative."""
    x = q_n + fraction * (1.0 - q_n)
    if not q_n < x < 1.0:
        return
    value, slope = (float(v[0]) for v in gamma.newton_terms(name, np.array([x]), np.array([q_n])))
    # Both sum O(x − q) terms with O(ε) relative error each, and 1 − x, x − q carry
    # absolute rounding ε: agreement to rounding, not to 1e-9, near x = q or x = 1.
    logs = 1.0 + abs(math.log(x / q_n)) + abs(math.log((1.0 - x) / (1.0 - q_n)))
    expected = float(divergences.binary(name, x, q_n))
    slack = 1e-9 + 1e-15 / min(x - q_n, 1.0 - x)
    assert value == pytest.approx(expected, rel=slack, abs=1e-14 * (x - q_n) * logs)
    step = 1e-7 * min(x - q_n, 1.0 - x)
    if step > 1e-12 * x:
        ahead = float(divergences.binary(name, x + step, q_n))
        behind = float(divergences.binary(name, x - step, q_n))
        assert slope == pytest.approx((ahead - behind) / (2 * step), rel=1e-4)


@pytest.mark.parametrize("name", DIVERGENCES)
def test_scalar_inputs_match_arrays(name):
    """0-d inputs (ufuncs turn 0-d results into numpy scalars) get the same answers."""
    for q_n, delta, cap in (
        (0.3, 0.1, 0.35),
        (0.3, 0.1, 0.9),
        (0.3, 0.1, None),
        (0.3, 1e-9, 0.30001),
    ):
        scalar = gamma.exact_raised_mass(q_n, delta, name, cap)
        row = gamma.exact_raised_mass([q_n], delta, name, None if cap is None else [cap])
        assert np.shape(scalar) == () and float(scalar) == row[0]
    assert float(gamma.exact_raised_mass(0.3, 0.1, name, cap=0.35)) == 0.35
