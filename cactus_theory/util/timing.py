"""Wall-clock timing: best-of-N (the one timer every ``cactus bench`` command uses) and
``Clock``, the seconds per named span of a decoding loop.

The minimum over repeats is the least noisy estimate of a cost on a shared machine (noise
only adds time). ``synchronize`` is called before starting and after stopping the clock,
so asynchronous devices (CUDA) are timed to completion.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


class Clock:
    """Seconds per named span (``with clock("verify"): ...``, summed over every entry), plus
    the total since the clock was made. ``synchronize`` (e.g. ``torch.cuda.synchronize``)
    runs at both ends of every span, so asynchronous work is counted in its own span."""

    def __init__(self, synchronize: Callable[[], object] | None = None) -> None:
        self.synchronize = synchronize
        self.seconds: dict[str, float] = {}
        self.started = time.perf_counter()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.synchronize is not None:
            self.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.synchronize is not None:
                self.synchronize()
            elapsed = time.perf_counter() - start
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed

    def finish(self, **counts: int) -> dict:
        """Every span's seconds, ``total`` (seconds since the clock was made) and ``counts``."""
        return {**self.seconds, "total": time.perf_counter() - self.started, **counts}
