"""Block statistics: accepted-length law, E[L], tokens per call, speed-up, best k."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cactus_theory.core import block

rates = st.floats(0.0, 1.0)


@given(rates, st.integers(1, 30))
def test_constant_rate_closed_forms(alpha, k):
    law = block.accepted_length_distribution(alpha, k)
    assert law.shape == (k + 1,)
    assert law.sum() == pytest.approx(1.0, abs=1e-12)
    lengths = np.arange(k + 1)
    assert block.expected_accepted(alpha, k) == pytest.approx(float(lengths @ law), abs=1e-12)
    geometric = k if alpha == 1 else alpha * (1 - alpha**k) / (1 - alpha)
    # The geometric closed form itself cancels as α → 1 (error ~ε/(1−α)).
    assert block.expected_accepted(alpha, k) == pytest.approx(geometric, rel=1e-9, abs=1e-12)
    for cost in (0.0, 0.05, 0.5):
        assert block.speedup(alpha, k, cost) == pytest.approx(
            block.leviathan_speedup(alpha, k, cost), rel=1e-12
        )


@given(st.lists(rates, min_size=1, max_size=12))
def test_position_dependent_rates(alphas):
    law = block.accepted_length_distribution(alphas)
    k = len(alphas)
    for length in range(k):
        reach = np.prod(alphas[:length])
        assert law[length] == pytest.approx(reach * (1 - alphas[length]), abs=1e-15)
    assert law[k] == pytest.approx(np.prod(alphas), abs=1e-15)
    assert block.tokens_per_call(alphas) == pytest.approx(
        1 + float(np.arange(k + 1) @ law), abs=1e-12
    )


def test_known_values():
    # α = 0.8, k = 4: E[L] = .8 + .64 + .512 + .4096.
    assert block.expected_accepted(0.8, 4) == pytest.approx(2.3616)
    assert block.leviathan_speedup(0.8, 4, 0.0) == pytest.approx(3.3616)
    assert block.leviathan_speedup(1.0, 4, 0.25) == pytest.approx(5 / 2)
    assert block.leviathan_speedup(0.0, 4, 0.25) == pytest.approx(1 / 2)


@given(st.floats(0.01, 0.99), st.floats(0.0, 1.0))
def test_best_k_is_the_argmax(alpha, cost):
    k, speed = block.best_k(alpha, cost, k_max=40)
    speeds = [block.leviathan_speedup(alpha, j, cost) for j in range(1, 41)]
    assert speed == pytest.approx(max(speeds))
    assert k == int(np.argmax(speeds)) + 1
