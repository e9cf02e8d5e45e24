"""Bracketed roots of increasing functions, returned on the feasible side.

Every budgeted solve in the toolkit has the shape "the largest x in [low, high] with
g(x) <= 0" for an increasing g (a divergence minus its budget). ``feasible_root`` solves
it with ``scipy.optimize.elementwise.find_root`` (vectorised Chandrupatla) and returns the
end of the final bracket where g <= 0, so the budget holds as computed, not only up to a
tolerance.
"""

from __future__ import annotations

from collections.abc import Callable

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
