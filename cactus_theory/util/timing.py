"""Best-of-N wall-clock timing, the one timer every ``cactus bench`` command uses.

The minimum over repeats is the least noisy estimate of a cost on a shared machine (noise
only adds time). ``synchronize`` is called before starting and after stopping the clock,
so asynchronous devices (CUDA) are timed to completion.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def best_seconds(
    function: Callable[[], object],
    repeats: int,
    synchronize: Callable[[], object] | None = None,
) -> float:
    """The fastest of ``repeats`` calls of ``function()``, in seconds."""
    if repeats < 1:
        raise ValueError(f"repeats: must be >= 1, got {repeats}")
    best = float("inf")
    for _ in range(repeats):
        if synchronize is not None:
            synchronize()
        start = time.perf_counter()
        function()
        if synchronize is not None:
            synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def timed(function: Callable[[], T]) -> tuple[T, float]:
    """(``function()``, its wall-clock seconds) for a call too slow to repeat."""
    start = time.perf_counter()
    value = function()
    return value, time.perf_counter() - start
