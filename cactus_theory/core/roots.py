"""Bracketed roots of increasing functions, returned on the feasible side.

Every budgeted solve in the toolkit has the shape "the largest x in [low, high] with
g(x) <= 0" for an increasing g (a divergence minus its budget). ``feasible_root`` solves
it with ``scipy.optimize.elementwise.find_root`` (vectorised Chandrupatla) and returns the
end of the final bracket where g <= 0, so the budget holds as computed, not only up to a
tolerance. ``newton_from_right`` is the fast path when g is also convex (γ* for KL,
reverse KL and JS; frontier's cap): safeguarded Newton that approaches the root from the
infeasible side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
from scipy.optimize import elementwise

Array = np.ndarray


def feasible_root(
    excess: Callable[..., Array], low: Array, high: Array, args: tuple[Array, ...] = ()
) -> Array:
    """x in [low, high] with excess(x) <= 0 and the bracket around the root closed.

    Requires excess(low) < 0 < excess(high) elementwise (callers settle the other cases).
    ``args`` are arrays broadcastable with ``low``, passed to ``excess`` as find_root does.
    """
    result = elementwise.find_root(excess, (low, high), args=args, tolerances={"fatol": 0.0})
    left, right = result.bracket
    f_left, f_right = result.f_bracket
    root = np.where(f_right <= 0, right, left)
    if not np.all(np.isfinite(root)) or np.any(np.where(f_right <= 0, f_right, f_left) > 0):
        raise RuntimeError(
            "feasible_root: no feasible point was bracketed (status "
            f"{np.unique(result.status).tolist()})"
        )
    return root


#: Relative step (and bracket width) at which ``newton_from_right`` stops: a few ulps.
NEWTON_TOLERANCE = 4 * np.finfo(np.float64).eps


class NewtonTerms(Protocol):
    """What ``newton_from_right`` iterates on: the function and its slope, row by row."""

    def value_and_slope(self, point: Array) -> tuple[Array, Array]:
        """(D(x), D'(x)) at one point per remaining row."""

    def take(self, keep: Array) -> NewtonTerms:
        """The same terms for the rows selected by the boolean mask ``keep``."""


def newton_from_right(
    terms: NewtonTerms,
    delta: float | Array,
    point: Array,
    low: Array,
    high: Array,
    *,
    steps: int,
    from_newton: Array | None = None,
    geometric_above: float | None = None,
) -> tuple[Array, Array, Array, Array]:
    """Elementwise x with D(x) = δ to rounding, for D convex and increasing on [low, high].

    Newton's step x − (D(x) − δ)/D'(x) from a point with D > δ lands at or right of the
    root (convexity), so Newton from the right converges monotonically, quadratically at
    the end. Safeguards keep a bracket [low, high] with D(low) <= δ < D(high): an unusable
    slope (infinite, zero) or a step out of the bracket becomes a bisection, geometric
    (√(low·high)) when high > ``geometric_above``·low. A Newton iterate that rounding puts
    on the feasible side (D <= δ) is the root to rounding and stops there; so does a
    starting point flagged in ``from_newton`` (default: none) with D <= δ. Rows stop when
    the step or the bracket is within ``NEWTON_TOLERANCE`` (relative); the iteration keeps
    compact arrays of the unsettled rows (``terms.take``).

    ``delta`` is one budget or one per element (shaped like ``point``).

    Returns (x, low, high, settled): the last iterate and the bracket's feasible end of
    every row, whether it stopped within ``steps``, and the bracket's upper end where it did
    not (the input ``high`` where it did): callers finish those rows, e.g. with
    ``feasible_root``.
    """
    found, lows, highs = point.copy(), low.copy(), high.copy()
    budget = np.broadcast_to(np.asarray(delta, dtype=np.float64), point.shape)
    settled_rows = np.zeros(point.shape, dtype=bool)
    index = np.arange(point.size)  # the unsettled rows; the arrays below follow them
    if from_newton is None:
        from_newton = np.zeros(point.shape, dtype=bool)
    for _ in range(steps):
        value, slope = terms.value_and_slope(point)
        excess = value - budget
        over = excess > 0
        high = np.where(over, point, high)
        low = np.where(over, low, point)
        finished = (~over & from_newton) | (excess == 0)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            step = excess / slope
        usable = np.isfinite(slope) & (slope > 0)
        newton = point - step
        inside = usable & (newton >= low) & (newton <= high)
        settled = (usable & (np.abs(step) <= NEWTON_TOLERANCE * point)) | (
            high - low <= NEWTON_TOLERANCE * high
        )
        middle = 0.5 * (low + high)
        if geometric_above is not None:
            middle = np.where(high > geometric_above * low, np.sqrt(low) * np.sqrt(high), middle)
        point = np.where(finished, point, np.where(inside, newton, middle))
        from_newton = inside
        stop = finished | settled
        if stop.any():
            rows = index[stop]
            found[rows], lows[rows] = point[stop], low[stop]
            settled_rows[rows] = True
            keep = ~stop
            index, point, low, high = index[keep], point[keep], low[keep], high[keep]
            from_newton, terms, budget = from_newton[keep], terms.take(keep), budget[keep]
            if not index.size:
                break
    found[index], lows[index], highs[index] = point, low, high
    return found, lows, highs, settled_rows


def step_down_to_budget(
    value: Callable[[Array, Array], Array], point: Array, low: Array, delta: float | Array
) -> Array:
    """Move each x down by 1, 2, 4, ... ulps (not below ``low``, where the value is <= δ)
    until ``value(rows, x[rows])`` <= δ as computed: the finish of ``newton_from_right``,
    whose root is exact only to rounding. Every element is checked once, offenders again;
    ``value(rows, points)`` evaluates at the elements ``rows`` (an index array); ``delta``
    is one budget or one per element."""
    point = point.copy()
    budget = np.broadcast_to(np.asarray(delta, dtype=np.float64), point.shape)
    rows = np.arange(point.size)
    for power in range(64):
        with np.errstate(divide="ignore", invalid="ignore"):
            over = value(rows, point[rows]) > budget[rows]
        rows = rows[over]
        if not rows.size:
            break
        point[rows] = np.maximum(point[rows] - point[rows] * 2.0 ** (power - 52), low[rows])
    return point
