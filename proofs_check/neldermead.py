"""Nelder–Mead local searches run side by side, their points evaluated in one call per round.

``nelder_mead(start, maxfev, xatol, fatol)`` is scipy's Nelder–Mead
(``scipy.optimize.minimize(method="Nelder-Mead")`` with ``adaptive=False`` and no bounds)
written as a generator: it yields each point it wants evaluated and receives the value,
so it evaluates the same points in the same order as scipy, stopping at ``maxfev``
evaluations or when the simplex is within ``xatol`` and its values within ``fatol``:

1. simplex: the start and, per coordinate k, the start with x_k scaled by 1.05 (0.00025
   where x_k = 0); values sorted, best first;
2. each iteration reflects the worst vertex through the centroid x̄ of the others,
   x_r = 2x̄ − x_worst; if x_r beats the best it tries the expansion 3x̄ − 2x_worst; if it
   beats only the second worst it replaces the worst; else it contracts (outside,
   1.5x̄ − 0.5x_worst, when x_r beats the worst; inside, 0.5x̄ + 0.5x_worst, otherwise)
   and, when the contraction fails, shrinks every vertex halfway to the best.

``minimise_side_by_side(values, starts, ...)`` runs one search per start: each round
takes the next point of every search that is still running and evaluates them together
with ``values(points [S, d]) -> [S]``. A vectorised objective thus costs one call per round
instead of one per point, and every search takes exactly the steps it would take alone
(the objective must be row by row: a row's value may not depend on the other rows).
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import numpy as np

Array = np.ndarray

#: scipy's coefficients (adaptive=False): reflection, expansion, contraction, shrink.
REFLECT, EXPAND, CONTRACT, SHRINK = 1.0, 2.0, 0.5, 0.5
#: scipy's initial simplex: x_k scaled by 1 + NONZERO_STEP, or ZERO_STEP where x_k = 0.
NONZERO_STEP, ZERO_STEP = 0.05, 0.00025


class _Exhausted(Exception):
    """``maxfev`` evaluations were spent."""


def nelder_mead(
    start: Array, maxfev: int, xatol: float, fatol: float
) -> Generator[Array, float, None]:
    """Minimise by Nelder–Mead from ``start`` [d] (module docstring): yields points [d],
    receives their values (``generator.send``), returns after at most ``maxfev`` of them."""
    x0 = np.asarray(start, dtype=np.float64).flatten()
    size = x0.size
    sim = np.empty((size + 1, size))
    sim[0] = x0
    for k in range(size):
        vertex = x0.copy()
        vertex[k] = (1 + NONZERO_STEP) * vertex[k] if vertex[k] != 0 else ZERO_STEP
        sim[k + 1] = vertex
    fsim = np.full(size + 1, np.inf)
    spent = 0

    def evaluate(point: Array) -> Generator[Array, float, float]:
        nonlocal spent
        if spent >= maxfev:
            raise _Exhausted
        spent += 1
        value = yield point.copy()
        return float(value)

    try:
        for k in range(size + 1):
            fsim[k] = yield from evaluate(sim[k])
    except _Exhausted:
        return
    order = np.argsort(fsim)
    sim, fsim = np.take(sim, order, 0), np.take(fsim, order, 0)
    while spent < maxfev:
        try:
            if (
                np.max(np.ravel(np.abs(sim[1:] - sim[0]))) <= xatol
                and np.max(np.abs(fsim[0] - fsim[1:])) <= fatol
            ):
                return
            sim, fsim = yield from _iteration(sim, fsim, evaluate)
        except _Exhausted:
            return
        order = np.argsort(fsim)
        sim, fsim = np.take(sim, order, 0), np.take(fsim, order, 0)


def _iteration(sim: Array, fsim: Array, evaluate) -> Generator[Array, float, tuple[Array, Array]]:
    """One Nelder–Mead step on the sorted simplex (module docstring, step 2)."""
    size = sim.shape[1]
    xbar = np.add.reduce(sim[:-1], 0) / size
    xr = (1 + REFLECT) * xbar - REFLECT * sim[-1]
    fxr = yield from evaluate(xr)
    if fxr < fsim[0]:
        xe = (1 + REFLECT * EXPAND) * xbar - REFLECT * EXPAND * sim[-1]
        fxe = yield from evaluate(xe)
        sim[-1], fsim[-1] = (xe, fxe) if fxe < fxr else (xr, fxr)
        return sim, fsim
    if fxr < fsim[-2]:
        sim[-1], fsim[-1] = xr, fxr
        return sim, fsim
    if fxr < fsim[-1]:
        xc = (1 + CONTRACT * REFLECT) * xbar - CONTRACT * REFLECT * sim[-1]
        fxc = yield from evaluate(xc)
        if fxc <= fxr:
            sim[-1], fsim[-1] = xc, fxc
            return sim, fsim
    else:
        xcc = (1 - CONTRACT) * xbar + CONTRACT * sim[-1]
        fxcc = yield from evaluate(xcc)
        if fxcc < fsim[-1]:
            sim[-1], fsim[-1] = xcc, fxcc
            return sim, fsim
    for j in range(1, size + 1):
        sim[j] = sim[0] + SHRINK * (sim[j] - sim[0])
        fsim[j] = yield from evaluate(sim[j])
    return sim, fsim


def minimise_side_by_side(
    values: Callable[[Array], Array],
    starts: list[Array],
    *,
    maxfev: int,
    xatol: float,
    fatol: float,
) -> None:
    """Run ``nelder_mead`` from every start, the pending points of all searches evaluated
    together each round by ``values(points [S, d]) -> [S]`` (module docstring). What the
    searches find is what ``values`` records; nothing is returned."""
    runs = [nelder_mead(start, maxfev, xatol, fatol) for start in starts]
    pending: dict[int, Array] = {}
    for index, run in enumerate(runs):
        point = next(run, None)
        if point is not None:
            pending[index] = point
    while pending:
        waiting = list(pending)
        found = np.asarray(values(np.stack([pending[index] for index in waiting])))
        for index, value in zip(waiting, found, strict=True):
            try:
                pending[index] = runs[index].send(float(value))
            except StopIteration:
                del pending[index]
