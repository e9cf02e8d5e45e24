"""Process lifetime for long jobs: one writer per output folder, no orphaned children.

- ``exclusive_lock(folder)``: an advisory ``flock`` on ``folder/.lock`` held for the whole
  job (and by any child that inherits its descriptor), so a second run into the same folder
  is a clear error instead of a second writer of the same files;
- ``signals_raise_exit()``: SIGTERM and SIGHUP raise ``SystemExit`` in the main thread, so
  the job's cleanup (stopping its children) runs; Python's default is to die at once;
- ``exit_with_parent(pid)``: called at the start of a child, it ends the child when the
  parent ``pid`` dies, however it died (SIGKILL included): at once on Linux
  (``PR_SET_PDEATHSIG``), within ``WATCH_SECONDS`` elsewhere (a watchdog thread).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

#: Environment variable through which a parent asks its child to exit with it.
PARENT_ENV = "CACTUS_EXIT_WITH_PARENT"
#: How often the watchdog checks that the parent is alive.
WATCH_SECONDS = 0.5
#: Exit status of a child that outlived its parent (128 + SIGTERM, as if terminated).
ORPHAN_EXIT = 143


@contextlib.contextmanager
def exclusive_lock(folder: Path | str, name: str = "out") -> Iterator[int | None]:
    """Hold an exclusive lock on ``folder/.lock``; yields its file descriptor (None where
    ``fcntl`` does not exist). ValueError naming ``name`` if another process holds it."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no locking
        yield None
        return
    path = Path(folder) / ".lock"
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = path.read_text(encoding="utf-8", errors="replace").strip() or "?"
            raise ValueError(
                f"{name}: another run is writing to {folder} (process {holder}); wait for it "
                f"to finish or choose another folder"
            ) from None
        os.ftruncate(descriptor, 0)
        os.write(descriptor, str(os.getpid()).encode())
        yield descriptor
    finally:
        os.close(descriptor)


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def signals_raise_exit() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise ``SystemExit(128 + signum)`` (main
    thread only; elsewhere the block runs with the handlers unchanged)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    names = [name for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
    previous = {name: signal.signal(getattr(signal, name), _raise_exit) for name in names}
    try:
        yield
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)


def child_environment(environment: dict[str, str] | None = None) -> dict[str, str]:
    """``environment`` (default: this process's) plus the variable that makes a child
    started with it call ``exit_with_parent`` on this process."""
    return {**(os.environ if environment is None else environment), PARENT_ENV: str(os.getpid())}


def exit_with_parent(parent: int | None = None) -> None:
    """End this process when ``parent`` (default: ``$CACTUS_EXIT_WITH_PARENT``, else do
    nothing) is no longer its parent."""
    if parent is None:
        value = os.environ.get(PARENT_ENV)
        if not value:
            return
        parent = int(value)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: SIGTERM when the parent dies
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before we got here
        os._exit(ORPHAN_EXIT)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_SECONDS)
        os._exit(ORPHAN_EXIT)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
