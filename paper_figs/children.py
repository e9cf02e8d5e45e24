"""The report's child processes, started at once beside the sweep (``paper_figs.report``).

- the claims check: ``python -m proofs_check`` (``start_claims``; ``wait_claims`` shows a
  bar over the checks it has cached so far);
- the conformance section: ``python -m cactus_theory.testing.conformance.section``
  (``start_conformance``), the engines' verify steps checked against the rules they
  claim, started once the sweep has freed its core;
- the real-model section: ``python -m cactus_theory.real.real_model`` (``start_real_model``)
  with a grant of cores (``util.stages.CoreShare``, the file
  ``out/real-model/cores.json``): one core while the sweep and the claims check run,
  two and "quiet" once both are done (``RealModelChild.grant``); its timing stage waits
  for quiet. Its progress lines (``[real-model mm:ss] ...``) are relayed to this
  process's console as they come (``relay``), so a reader always sees what it does.

On 2 cores the three share the machine until the sweep and the claims check end; then
the real-model section has it to itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from cactus_theory.util.files import atomic_write_json
from cactus_theory.util.process import child_environment
from cactus_theory.util.stages import CoreShare

#: The prefix of the real-model section's progress lines (``util.stages.StageLog``).
REAL_MODEL_PREFIX = "[real-model"


@dataclass
class PendingClaims:
    """``python -m proofs_check`` running in a child process (``start_claims``)."""

    process: subprocess.Popen
    log: Path
    output: Path
    started: float  # wall-clock start (time.time()), compared with the result's mtime

    def get(self, timeout: float) -> tuple[dict, float]:
        """(result, seconds) once the child is done; ``subprocess.TimeoutExpired`` before.

        Exit 0 or 1 (1: one of our own guarantees failed, which the table shows) gives the
        result the child saved; any other exit raises with the tail of its log."""
        from proofs_check import report as claims_report

        code = self.process.wait(timeout)
        if code not in (0, 1):
            tail = self.log.read_text(encoding="utf-8", errors="replace")[-2000:]
            raise RuntimeError(f"claims check failed (exit {code}); log {self.log}:\n{tail}")
        # The child's own run time: until it wrote its result (it may have finished long
        # before this call, while the sweep was still running).
        seconds = max(self.output.stat().st_mtime - self.started, 0.0)
        return claims_report.read_json(self.output), seconds

    def stop(self) -> None:
        """Kill the child (its finished checks stay cached)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def start_claims(
    out: Path,
    *,
    quick: bool,
    seed: int,
    only: tuple[str, ...] | None = None,
    lock: int | None = None,
) -> PendingClaims:
    """Start ``python -m proofs_check`` in a child process, so it runs beside the sweep.

    A fresh interpreter (not multiprocessing), so nothing of the caller's ``__main__`` is
    re-run; it imports proofs_check from where this process found it. It writes
    ``out/claims.json``, ``out/claims.md`` and its output to ``out/claims.log``, and
    caches each finished check under ``out/claims-cache``. The child exits when this
    process dies, however it dies (``util.process.exit_with_parent``), and inherits the
    output folder's ``lock`` descriptor, so no rerun starts while it still writes.
    """

    out = Path(out)
    command = [sys.executable, "-m", "proofs_check", "--seed", str(seed), "--no-progress"]
    command += ["--cache-dir", str(out / "claims-cache"), "--json", str(out / "claims.json")]
    command += ["--markdown", str(out / "claims.md")]
    if quick:
        command.append("--quick")
    if only:
        command += ["--only", *only]
    log = out / "claims.log"
    process = _launch(command, log, lock)
    return PendingClaims(process, log, out / "claims.json", time.time())


def wait_claims(
    pending: PendingClaims,
    out: Path,
    *,
    quick: bool,
    seed: int,
    progress: bool,
    only: tuple[str, ...] | None = None,
) -> tuple[dict, float]:
    """Wait for ``start_claims``'s child, with a bar over the checks it has cached so far."""
    from tqdm.auto import tqdm

    from proofs_check import claims, runner

    names = [name for name, _ in claims.checks() if only is None or name in only]
    folder = runner.cache_folder(out / "claims-cache", quick=quick, seed=seed)
    try:
        with tqdm(total=len(names), desc="claims check", disable=not progress, unit="check") as bar:
            while True:
                try:
                    value = pending.get(timeout=0.5)
                    bar.update(len(names) - bar.n)
                    return value
                except subprocess.TimeoutExpired:
                    done = sum((folder / f"{name}.json").exists() for name in names)
                    bar.update(done - bar.n)
    except BaseException:
        pending.stop()
        raise


def _environment() -> dict[str, str]:
    """The child's environment: this process's, with this checkout first on PYTHONPATH."""
    environment = child_environment()
    source = str(Path(__file__).resolve().parents[1])
    environment["PYTHONPATH"] = os.pathsep.join(
        part for part in (source, environment.get("PYTHONPATH", "")) if part
    )
    return environment


def _launch(command: list[str], log: Path, lock: int | None) -> subprocess.Popen:
    """Start ``command`` with its output (stdout and stderr) in ``log``, in
    ``_environment()``, passing the report's lock file descriptor ``lock`` on."""
    with open(log, "w", encoding="utf-8") as stream:
        return subprocess.Popen(
            command,
            stdout=stream,
            stderr=subprocess.STDOUT,
            env=_environment(),
            pass_fds=() if lock is None else (lock,),
        )


@dataclass
class RealModelChild:
    """The real-model section in its child process (``start_real_model``), the grant of
    cores it reads, and the thread that relays its progress lines."""

    process: subprocess.Popen
    log: Path
    cores: CoreShare
    started: float  # wall-clock start (time.time())
    relay_thread: threading.Thread | None = None
    stopping: threading.Event = field(default_factory=threading.Event)

    def grant(self, threads: int, quiet: bool) -> None:
        """Let the child use ``threads`` cores; ``quiet``: nothing else of the job runs."""
        self.cores.grant(threads, quiet)

    def wait(self) -> int:
        code = self.process.wait()
        self.stopping.set()
        if self.relay_thread is not None:
            self.relay_thread.join(timeout=5)
        return code

    def stop(self) -> None:
        """Kill the child (its finished work stays cached)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.stopping.set()


def start_real_model(
    out: Path,
    *,
    quick: bool,
    lock: int | None = None,
    progress: bool = True,
    command: list[str] | None = None,
) -> RealModelChild:
    """Start the real-model section now, with one core granted and its log
    ``out/real-model.log`` relayed to the console when ``progress`` (module docstring).
    ``command`` replaces the child's command (tests)."""
    out = Path(out)
    cores = CoreShare(out / "real-model" / "cores.json")
    cores.grant(1, quiet=False)
    if command is None:
        command = [sys.executable, "-m", "cactus_theory.real.real_model", "--out", str(out)]
        command += ["--no-progress", "--cores-file", str(cores.path)]
        command += ["--quick"] if quick else []
    log = out / "real-model.log"
    process = _launch(command, log, lock)
    child = RealModelChild(process, log, cores, time.time())
    if progress:
        child.relay_thread = threading.Thread(
            target=relay, args=(log, child.stopping), name="real-model-relay", daemon=True
        )
        child.relay_thread.start()
    return child


def relay(log: Path, stopping: threading.Event, poll: float = 0.5, write=None) -> None:
    """Print each new line of ``log`` that starts with ``REAL_MODEL_PREFIX`` (through
    ``tqdm.write`` on stderr, so progress bars stay intact) until ``stopping`` is set and
    the log is read to its end."""
    if write is None:
        from tqdm.auto import tqdm

        def write(line: str) -> None:
            tqdm.write(line, file=sys.stderr)

    position, pending = 0, ""
    while True:
        done = stopping.is_set()
        try:
            with open(log, encoding="utf-8", errors="replace") as stream:
                stream.seek(position)
                chunk = stream.read()
                position = stream.tell()
        except OSError:
            chunk = ""
        pending += chunk
        *lines, pending = pending.split("\n")
        for line in lines:
            shown = line.rsplit("\r", 1)[-1]  # a progress bar's last state
            if shown.startswith(REAL_MODEL_PREFIX):
                write(shown)
        if done:
            return
        stopping.wait(poll)


def wait_real_model(child: RealModelChild, out: Path, *, progress: bool) -> tuple[dict, float]:
    """(``real_model.json``'s content, the child's own run time in seconds) once the child
    is done; a child that failed without writing it gives ``{"unavailable": reason}``
    (the log's last line), which the page shows."""
    import json

    from cactus_theory.real import real_model

    code = child.wait()
    path = Path(out) / real_model.OUTPUT
    if code in (0, 3) and path.is_file():
        seconds = max(path.stat().st_mtime - child.started, 0.0)
        return json.loads(path.read_text(encoding="utf-8")), seconds
    lines = child.log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    reason = f"the real-model process failed (exit {code}); {child.log.name}: " + (
        lines[-1] if lines else "empty"
    )
    found = {"unavailable": reason}
    atomic_write_json(path, found, indent=1)
    return found, 0.0


@dataclass
class ConformanceChild:
    """The conformance section in its child process (``start_conformance``)."""

    process: subprocess.Popen
    log: Path
    output: Path

    def stop(self) -> None:
        """Kill the child."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def start_conformance(
    out: Path, *, quick: bool, lock: int | None = None, command: list[str] | None = None
) -> ConformanceChild:
    """Start the conformance section (``cactus_theory.testing.conformance.section``) now,
    one torch thread, writing ``out/conformance.json`` and its output to
    ``out/conformance.log``; ``--quick`` draws less (its power is stated on the page).
    ``command`` replaces the child's command (tests)."""
    out = Path(out)
    if command is None:
        command = [sys.executable, "-m", "cactus_theory.testing.conformance.section"]
        command += ["--out", str(out)] + (QUICK_CONFORMANCE if quick else [])
    log = out / "conformance.log"
    process = _launch(command, log, lock)
    return ConformanceChild(process, log, out / "conformance.json")


#: The quick report's conformance budget (draws per law case, blocks per exact property).
QUICK_CONFORMANCE = ["--draws", "5000", "--examples", "8"]


def wait_conformance(child: ConformanceChild) -> dict | None:
    """``conformance.json``'s content once the child is done, or None when it failed (the
    page then says the section did not run; the log keeps why)."""
    import json

    code = child.process.wait()
    if code != 0 or not child.output.is_file():
        return None
    try:
        return json.loads(child.output.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
