"""The side-by-side Nelder–Mead takes exactly scipy's steps (same points, same order, same
stopping), and running several searches together changes none of them."""

import numpy as np
import pytest
from scipy import optimize

from proofs_check import neldermead


def rosenbrock(point):
    return float(np.sum(100.0 * (point[1:] - point[:-1] ** 2) ** 2 + (1.0 - point[:-1]) ** 2))


def plateau(point):
    """Flat away from the origin: ties, failed contractions and shrinks."""
    return float(np.floor(np.sum(np.abs(point)) * 4.0))


def bowl(point):
    """Converges before maxfev (the xatol/fatol stop)."""
    return float(np.sum((point - 0.3) ** 2))


def scipy_points(function, start, maxfev, xatol, fatol):
    seen = []

    def record(point):
        seen.append(np.array(point))
        return function(point)

    optimize.minimize(
        record,
        start,
        method="Nelder-Mead",
        options={"maxfev": maxfev, "xatol": xatol, "fatol": fatol},
    )
    return seen


def generator_points(function, start, maxfev, xatol, fatol):
    seen = []
    run = neldermead.nelder_mead(start, maxfev, xatol, fatol)
    point = next(run, None)
    while point is not None:
        seen.append(point)
        try:
            point = run.send(function(point))
        except StopIteration:
            point = None
    return seen


CASES = [
    (rosenbrock, np.array([-1.2, 1.0, 0.5]), 400, 1e-12, 1e-15),
    (rosenbrock, np.array([0.0, 0.0]), 37, 1e-12, 1e-15),  # stops mid-iteration
    (plateau, np.array([2.0, -1.0, 0.0, 3.0]), 300, 1e-12, 1e-15),
    (bowl, np.array([5.0, -4.0]), 10_000, 1e-6, 1e-9),
]


@pytest.mark.parametrize(("function", "start", "maxfev", "xatol", "fatol"), CASES)
def test_nelder_mead_evaluates_scipys_points_in_scipys_order(function, start, maxfev, xatol, fatol):
    expected = scipy_points(function, start, maxfev, xatol, fatol)
    found = generator_points(function, start, maxfev, xatol, fatol)
    assert len(found) == len(expected) <= maxfev
    for ours, theirs in zip(found, expected, strict=True):
        np.testing.assert_array_equal(ours, theirs)


def test_converged_search_stops_before_maxfev():
    found = generator_points(bowl, np.array([5.0, -4.0]), 10_000, 1e-6, 1e-9)
    assert 10 < len(found) < 10_000


def test_side_by_side_searches_take_the_steps_they_take_alone():
    starts = [case[1][:2] for case in CASES[:3]] + [np.array([0.7, 0.1])]
    calls = []

    def values(points):
        calls.append(points.shape[0])
        return np.array([rosenbrock(point) for point in points])

    seen: dict[bytes, int] = {}

    def counting(points):
        for point in points:
            seen[point.tobytes()] = seen.get(point.tobytes(), 0) + 1
        return values(points)

    neldermead.minimise_side_by_side(counting, starts, maxfev=150, xatol=1e-12, fatol=1e-15)
    alone = [scipy_points(rosenbrock, start, 150, 1e-12, 1e-15) for start in starts]
    expected: dict[bytes, int] = {}
    for points in alone:
        for point in points:
            expected[point.tobytes()] = expected.get(point.tobytes(), 0) + 1
    assert seen == expected
    assert sum(calls) == sum(len(points) for points in alone)
    assert len(calls) == max(len(points) for points in alone)  # one call per round
    assert calls[0] == len(starts)
