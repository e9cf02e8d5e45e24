"""What a long job says while it works, and how many cores it may use.

``StageLog`` prints one line per unit of progress of each stage, with what it is doing,
how far it is and an estimate of the time left::

    [real-model 02:41] pools mt-bench: shard 2/3, 1,696 of 2,000 positions, ETA 0:38

so a console is never silent for long: a unit of a stage should take well under a minute
(a pool shard, one decode batch, one round of a timing run), and ``heartbeat`` prints
"still working" on the current stage whenever the log has been silent for 30 seconds
(a download, a conversion, a slow shard on a busy machine). Lines are flushed at once, so
a parent process that reads its child's log (``paper_figs.report``) can relay them as
they come.

``CoreShare`` is how a parent tells a child how many cores it may use now, and whether
the machine is quiet (nothing else of the job is running): a small JSON file the parent
rewrites (``grant``) and the child reads between units of work (``threads``, ``quiet``,
``wait_quiet``). With no file the child is alone: all of this machine's cores, quiet.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cactus_theory.util.files import atomic_write_json


def clock_text(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour)."""
    seconds = max(int(round(seconds)), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class StageLog:
    """Progress lines of one job (module docstring), prefixed ``[name mm:ss]`` with the
    time since the log was made; ``say`` prints one line (default: print, flushed)."""

    def __init__(
        self,
        name: str,
        say: Callable[[str], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.say = say or (lambda line: print(line, flush=True))
        self.clock = clock
        self.started = clock()
        self.last = self.started  # when the last line was printed
        self.current: Stage | None = None
        self.guard = threading.Lock()

    def line(self, text: str) -> None:
        """Print ``text`` with the job's prefix."""
        with self.guard:
            self.last = self.clock()
            self.say(f"[{self.name} {clock_text(self.last - self.started)}] {text}")

    def heartbeat(self, every: float = 30.0, poll: float = 1.0):
        """Start a thread that prints "still working" on the current stage whenever the
        log has been silent for ``every`` seconds; returns a function that stops it."""
        stopped = threading.Event()

        def beat() -> None:
            while not stopped.wait(poll):
                silent = self.clock() - self.last
                if silent >= every:
                    what = self.current.what if self.current is not None else "working"
                    since = (
                        ""
                        if self.current is None
                        else (f", {clock_text(self.current.elapsed())} into the stage")
                    )
                    self.line(
                        f"{what}: still working ({clock_text(silent)} since the last line{since})"
                    )

        thread = threading.Thread(target=beat, name=f"{self.name}-heartbeat", daemon=True)
        thread.start()

        def stop() -> None:
            stopped.set()
            thread.join(timeout=5)

        return stop

    def stage(self, what: str, total: float | None = None, unit: str = "") -> Stage:
        """A stage of ``total`` units (None: unknown); prints that it starts."""
        stage = Stage(self, what, total, unit)
        self.current = stage
        extent = "" if total is None else f" ({_amount(total, unit)})"
        self.line(f"{what}: started{extent}")
        return stage


class Stage:
    """One stage of a ``StageLog``: ``update(done)`` after each unit prints the progress
    and the time left at the rate so far; ``finish()`` prints the stage's time."""

    def __init__(self, log: StageLog, what: str, total: float | None, unit: str) -> None:
        self.log, self.what, self.total, self.unit = log, what, total, unit
        self.started = log.clock()

    def elapsed(self) -> float:
        return self.log.clock() - self.started

    def update(self, done: float, note: str = "") -> None:
        """Print ``done`` of ``total`` units, ``note`` and an ETA (when it can be told)."""
        parts = [note] if note else []
        if self.total is None:
            parts.append(_amount(done, self.unit))
        else:
            parts.append(f"{_amount(done, '')} of {_amount(self.total, self.unit)}")
            if 0 < done < self.total:
                left = self.elapsed() / done * (self.total - done)
                parts.append(f"ETA {clock_text(left)}")
        self.log.line(f"{self.what}: {', '.join(parts)}")

    def finish(self, note: str = "") -> float:
        """Print that the stage is done (with ``note``) and return its seconds."""
        seconds = self.elapsed()
        extra = f", {note}" if note else ""
        self.log.line(f"{self.what}: done in {clock_text(seconds)}{extra}")
        return seconds


def _amount(value: float, unit: str) -> str:
    text = f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"
    return f"{text} {unit}".strip()


class CoreShare:
    """The cores a child may use and whether the machine is quiet (module docstring).

    The parent calls ``grant(threads, quiet)``; the child calls ``threads()``,
    ``quiet()`` and ``wait_quiet``. ``path`` None: no parent, so every core, quiet.
    """

    def __init__(self, path: Path | str | None) -> None:
        self.path = None if path is None else Path(path)

    def grant(self, threads: int, quiet: bool) -> None:
        """(parent) Let the child use ``threads`` cores; ``quiet``: nothing else runs."""
        if threads < 1:
            raise ValueError(f"threads: must be >= 1, got {threads}")
        if self.path is not None:
            atomic_write_json(self.path, {"threads": int(threads), "quiet": bool(quiet)})

    def _read(self) -> dict:
        if self.path is None:
            return {"threads": os.cpu_count() or 1, "quiet": True}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return {"threads": max(int(data["threads"]), 1), "quiet": bool(data["quiet"])}
        except (OSError, ValueError, KeyError, TypeError):
            return {"threads": 1, "quiet": False}  # not granted yet: one core, not quiet

    def threads(self) -> int:
        return self._read()["threads"]

    def quiet(self) -> bool:
        return self._read()["quiet"]

    def wait_quiet(
        self,
        log: StageLog | None = None,
        what: str = "",
        poll: float = 1.0,
        every: float = 60.0,
        sleep: Callable[[float], object] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> float:
        """Block until ``quiet()``; a line on ``log`` at the start and every ``every``
        seconds; returns the seconds waited."""
        started = clock()
        said = None
        while not self.quiet():
            now = clock()
            if log is not None and (said is None or now - said >= every):
                log.line(f"{what}: waiting for a quiet machine ({clock_text(now - started)})")
                said = now
            sleep(poll)
        return clock() - started
