"""Divergences: exact values, zeros, infinities, and the two-point forms."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cactus_theory import divergences
from cactus_theory.testing.strategies import pairs


def test_known_values():
    half = [0.5, 0.5]
    point = [1.0, 0.0]
    assert divergences.kl(point, half) == pytest.approx(math.log(2), abs=1e-15)
    assert divergences.kl(half, point) == math.inf
    assert divergences.reverse_kl(half, point) == pytest.approx(math.log(2), abs=1e-15)
    assert divergences.tv(point, half) == 0.5
    assert divergences.chi2(point, half) == pytest.approx(1.0, abs=1e-15)
    assert divergences.chi2(half, point) == math.inf
    assert divergences.hellinger(point, [0.0, 1.0]) == pytest.approx(1.0, abs=1e-15)
    assert divergences.hellinger(point, half) == pytest.approx(1 - math.sqrt(0.5), abs=1e-15)
    assert divergences.js(point, [0.0, 1.0]) == pytest.approx(math.log(2), abs=1e-15)


def test_zeros_in_both_rows_contribute_nothing():
    a = [0.0, 0.25, 0.75]
    b = [0.0, 0.5, 0.5]
    for name in divergences.NAMES:
        two = divergences.divergence(name, a[1:], b[1:])
        three = divergences.divergence(name, a, b)
        assert three == pytest.approx(two, abs=1e-15), name


@given(pairs())
def test_divergences_are_nonnegative_and_zero_on_the_diagonal(pair):
    target, draft = pair
    for name in divergences.NAMES:
        assert divergences.divergence(name, draft, target) >= 0.0
        assert divergences.divergence(name, target, target) == pytest.approx(0.0, abs=1e-15)
    assert divergences.tv(draft, target) == divergences.tv(target, draft)
    assert divergences.hellinger(draft, target) <= 1.0 + 1e-15
    assert divergences.js(draft, target) <= math.log(2) + 1e-15
    # Pinsker: TV <= sqrt(KL / 2); and KL <= log(1 + χ²).
    kl = divergences.kl(draft, target)
    assert divergences.tv(draft, target) <= math.sqrt(kl / 2) + 1e-12
    assert kl <= math.log1p(divergences.chi2(draft, target)) + 1e-12


def test_batched_rows():
    a = np.array([[1.0, 0.0], [0.5, 0.5]])
    b = np.array([[0.5, 0.5], [0.5, 0.5]])
    assert np.allclose(divergences.kl(a, b), [math.log(2), 0.0])


@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_binary_forms_equal_the_two_point_rows(x, y):
    for name in divergences.NAMES:
        two_point = divergences.rows(name, np.array([x, 1 - x]), np.array([y, 1 - y]))
        binary = divergences.binary(name, x, y)
        if math.isinf(two_point):
            assert math.isinf(binary), name
        else:
            assert binary == pytest.approx(two_point, rel=1e-9, abs=1e-15), name


def test_binary_kl_is_accurate_near_the_diagonal():
    """The log1p form keeps full relative precision where the textbook form cancels."""
    mpmath.mp.dps = 50
    for x, y in [(0.3 + 1e-7, 0.3), (0.999, 0.999 - 1e-9), (1e-5 + 1e-12, 1e-5)]:
        exact = mpmath.mpf(x) * mpmath.log(mpmath.mpf(x) / mpmath.mpf(y)) + (
            1 - mpmath.mpf(x)
        ) * mpmath.log((1 - mpmath.mpf(x)) / (1 - mpmath.mpf(y)))
        assert divergences.binary_kl(x, y) == pytest.approx(float(exact), rel=1e-9)


def test_kl_terms_are_accurate_for_extreme_ratios():
    assert divergences.kl_terms(np.array(1e-300), np.array(1e300)) == pytest.approx(1e300)
    assert divergences.kl_terms(np.array(2.0), np.array(1e-300)) == pytest.approx(
        2 * math.log(2e300) - 2
    )
    assert divergences.kl_terms(np.array(0.0), np.array(0.3)) == pytest.approx(0.3)
    assert divergences.kl_terms(np.array(0.3), np.array(0.0)) == math.inf


def test_binary_kl_upper_inverse():
    assert divergences.binary_kl_upper_inverse(0.5, math.log(2)) == pytest.approx(1.0)
    assert divergences.binary_kl_upper_inverse(0.0, 1.0) == 0.0
    assert divergences.binary_kl_upper_inverse(0.3, 0.0) == 0.3
    x = divergences.binary_kl_upper_inverse(0.2, 0.05)
    assert divergences.binary_kl(x, 0.2) == pytest.approx(0.05, rel=1e-12)
    assert divergences.binary_kl(x, 0.2) <= 0.05
    assert x > 0.2
