"""The main job: run the sweeps and the claims check, draw the figures, write report.html.

``build(out, quick=..., seed=...)``:

1. ``sims.sweep.run`` with the quick or full preset (cached per cell under ``out/cells``,
   so a rerun resumes), which writes the CSVs under ``out``;
2. ``proofs_check.run(quick, seed, progress, cache_dir)``, saved as ``out/claims.json`` (and
   ``out/claims.md``). Both steps are single-threaded numpy, so the claims check runs as a
   child ``python -m proofs_check`` (``start_claims``) while the sweep runs in this
   process: on 2 cores the job takes about as long as the slower of the two, not their sum.
   After the sweep, a progress bar counts the checks the child has finished (each cached in
   ``out/claims-cache``, so an interrupted run resumes there too). A ``claims_runner``
   argument runs in this process instead (tests inject one);
3. the real-model section (``cactus_theory.real.real_model``: the pair's costs, the exact
   trade-off on pools of real contexts, the theory against the decoder, the decoding
   table), as a second child (``start_real_model``) that a thread starts as soon as the
   claims child has ended, on the core it freed while the sweep still runs (one torch
   thread), so on 2 cores the job takes about max(sweep, claims + real model); its pools,
   costs, decodes and table rows are cached under ``out/real-model``, so an interrupted
   run resumes there too;
4. the figures (``paper_figs.figures``, and ``paper_figs.figures_real`` for the
   real-model section) into ``out/figures`` as PNG and SVG;
5. ``out/report.html`` (``paper_figs.page``): the summary table, the real-model section,
   the claims table, every figure with its caption, and the Monte Carlo check against the
   block-statistics formula.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cactus_theory.util.files import atomic_write_json, atomic_write_text
from cactus_theory.util.process import child_environment, exclusive_lock, signals_raise_exit
from paper_figs import figures, figures_tradeoff
from paper_figs.data import Results
from paper_figs.figure_kit import Figure
from paper_figs.page import render, summary_rows


@dataclass
class Report:
    html: Path
    figures: list[Figure]
    claims: dict
    timings: dict[str, float] = field(default_factory=dict)
    summary: list[dict] = field(default_factory=list)
    #: the real-model section's figure (the exact trade-off on real contexts), if drawn
    real_figure: Figure | None = None


# -- steps ----------------------------------------------------------------------------------


def run_claims(out: Path, *, quick: bool, seed: int, progress: bool) -> dict:
    """Run ``proofs_check.run`` and save its JSON and markdown next to the report."""
    import proofs_check

    result = proofs_check.run(
        quick=quick, seed=seed, progress=progress, cache_dir=str(out / "claims-cache")
    )
    atomic_write_json(out / "claims.json", result)
    atomic_write_text(out / "claims.md", proofs_check.to_markdown(result))
    return result


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
    import proofs_check

    out = Path(out)
    command = [sys.executable, "-m", "proofs_check", "--seed", str(seed), "--no-progress"]
    command += ["--cache-dir", str(out / "claims-cache"), "--json", str(out / "claims.json")]
    command += ["--markdown", str(out / "claims.md")]
    if quick:
        command.append("--quick")
    if only:
        command += ["--only", *only]
    environment = child_environment()
    source = str(Path(proofs_check.__file__).resolve().parents[1])
    environment["PYTHONPATH"] = os.pathsep.join(
        part for part in (source, environment.get("PYTHONPATH", "")) if part
    )
    log = out / "claims.log"
    with open(log, "w", encoding="utf-8") as stream:
        process = subprocess.Popen(
            command,
            stdout=stream,
            stderr=subprocess.STDOUT,
            env=environment,
            pass_fds=() if lock is None else (lock,),
        )
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


@dataclass
class ChainedChild:
    """A child process that a thread starts once another process has ended
    (``chain_after``); ``stop`` before that start cancels it."""

    command: list[str]
    log: Path
    lock: int | None = None
    process: subprocess.Popen | None = None
    started: float | None = None  # wall-clock start (time.time())
    cancelled: bool = False
    guard: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None

    def launch(self) -> None:
        with self.guard:
            if self.cancelled:
                return
            environment = child_environment()
            source = str(Path(__file__).resolve().parents[1])
            environment["PYTHONPATH"] = os.pathsep.join(
                part for part in (source, environment.get("PYTHONPATH", "")) if part
            )
            with open(self.log, "w", encoding="utf-8") as stream:
                self.process = subprocess.Popen(
                    self.command,
                    stdout=stream,
                    stderr=subprocess.STDOUT,
                    env=environment,
                    pass_fds=() if self.lock is None else (self.lock,),
                )
            self.started = time.time()

    def wait(self) -> int | None:
        """The child's exit code once it ends (None: it was never started)."""
        if self.thread is not None:
            self.thread.join()
        return None if self.process is None else self.process.wait()

    def stop(self) -> None:
        """Cancel the start, or kill the child (its finished work stays cached)."""
        with self.guard:
            self.cancelled = True
            process = self.process
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.wait()


def chain_after(first: subprocess.Popen, child: ChainedChild) -> ChainedChild:
    """Start ``child`` from a thread as soon as ``first`` has ended."""

    def run() -> None:
        first.wait()
        child.launch()

    child.thread = threading.Thread(target=run, name="start-after", daemon=True)
    child.thread.start()
    return child


def start_real_model(
    out: Path, *, quick: bool, after: subprocess.Popen, lock: int | None = None
) -> ChainedChild:
    """``python -m cactus_theory.real.real_model`` into ``out``, started once ``after``
    (the claims child) has ended: the sweep still runs on one core, and the real-model
    section takes the core the claims check freed. Its output goes to
    ``out/real-model.log``."""
    command = [sys.executable, "-m", "cactus_theory.real.real_model", "--out", str(out)]
    command += ["--no-progress"] + (["--quick"] if quick else [])
    return chain_after(after, ChainedChild(command, Path(out) / "real-model.log", lock))


def wait_real_model(child: ChainedChild, out: Path, *, progress: bool) -> tuple[dict, float]:
    """(``real_model.json``'s content, the child's own run time in seconds) once the child
    is done; a child that failed without writing it gives ``{"unavailable": reason}``
    (the log's last line), which the page shows."""
    import json

    from cactus_theory.real import real_model

    if progress and child.process is not None and child.process.poll() is None:
        print(f"waiting for the real-model section (log: {child.log})", file=sys.stderr)
    code = child.wait()
    path = Path(out) / real_model.OUTPUT
    if code in (0, 3) and path.is_file() and child.started is not None:
        seconds = max(path.stat().st_mtime - child.started, 0.0)
        return json.loads(path.read_text(encoding="utf-8")), seconds
    lines = child.log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    reason = f"the real-model process failed (exit {code}); {child.log.name}: " + (
        lines[-1] if lines else "empty"
    )
    found = {"unavailable": reason}
    atomic_write_json(path, found, indent=1)
    return found, 0.0


def build(
    out: Path | str,
    *,
    quick: bool = False,
    seed: int = 0,
    progress: bool = True,
    config=None,
    claims_runner: Callable[..., dict] | None = None,
    real_model: bool | Callable[..., dict] = True,
) -> Report:
    """Run everything and write ``out/report.html`` (see the module docstring).

    ``real_model``: run the real-model section (``cactus_theory.real.real_model``: costs,
    pools, the exact trade-off, the theory check, the decoding table) in a child process
    once the claims child ends (module docstring; in this process after the claims when a
    ``claims_runner`` is given); False skips it, a callable replaces it, in this process
    (tests). Its stage timings are recorded as ``real_model_<stage>``.

    The output folder is locked for the whole run (a second run into it is a ValueError),
    and SIGTERM or SIGHUP stop the run like Ctrl-C: the claims and real-model children are
    stopped, finished sweep cells, checks and pool shards stay cached, and a rerun resumes
    from them.
    """
    from sims import sweep

    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: must be an integer >= 0, got {seed!r}")
    folder = sweep.prepare_output(out)
    preset = config or (sweep.QUICK if quick else sweep.FULL)
    preset = preset.with_seed(seed)
    with exclusive_lock(folder) as lock, signals_raise_exit():
        return _build(folder, preset, quick, seed, progress, claims_runner, lock, real_model)


def _build(folder, preset, quick, seed, progress, claims_runner, lock, real_model) -> Report:
    timings: dict[str, float] = {}
    start = time.perf_counter()
    pending, real_child = None, None
    if claims_runner is None:
        pending = start_claims(folder, quick=quick, seed=seed, lock=lock)
        if real_model is True:
            real_child = start_real_model(folder, quick=quick, after=pending.process, lock=lock)
    try:
        result, claims = _steps(
            folder, preset, quick, seed, progress, claims_runner, pending, real_child,
            real_model, timings, start,
        )  # fmt: skip
    except BaseException:
        for child in (real_child, pending):
            if child is not None:
                child.stop()
        raise
    return _finish(folder, preset, quick, seed, result, claims, timings, start)


def _steps(folder, preset, quick, seed, progress, claims_runner, pending, real_child,
           real_model, timings, start):  # fmt: skip
    """The sweep, the claims check and the real-model section: (sweep result, claims)."""
    from sims import sweep

    result = sweep.run(preset, folder, progress=progress)
    timings["sweep"] = time.perf_counter() - start
    mark = time.perf_counter()
    if pending is None:
        claims = claims_runner(folder, quick=quick, seed=seed, progress=progress)
        timings["claims"] = time.perf_counter() - mark
    else:
        claims, timings["claims"] = wait_claims(
            pending, folder, quick=quick, seed=seed, progress=progress
        )
        timings["claims_wait"] = time.perf_counter() - mark
    found = None
    if real_child is not None:
        mark = time.perf_counter()
        found, timings["real_model"] = wait_real_model(real_child, folder, progress=progress)
        timings["real_model_wait"] = time.perf_counter() - mark
    elif real_model:
        mark = time.perf_counter()
        run_real = real_model if callable(real_model) else _real_model
        found = run_real(folder, quick=quick, progress=progress)
        timings["real_model"] = time.perf_counter() - mark
    for key, value in ((found or {}).get("timings") or {}).items():
        timings[f"real_model_{key}"] = float(value)
    return result, claims


def _finish(folder, preset, quick, seed, result, claims, timings, start) -> Report:
    """Figures, the page and the run record."""
    mark = time.perf_counter()
    main = preset.text[0].name if preset.text else ""
    results = Results.load(folder, main_source=main)
    drawn = draw_figures(results, claims, folder / "figures")
    real_figure = draw_real_figure(results, folder / "figures")
    timings["figures"] = time.perf_counter() - mark
    timings["total"] = time.perf_counter() - start
    summary = summary_rows(results)
    page = render(
        results,
        drawn,
        claims,
        summary,
        preset=preset,
        timings=timings,
        cells=(len(result.cells), result.computed),
        quick=quick,
        real_figure=real_figure,
    )
    path = atomic_write_text(folder / "report.html", page)
    run_record = {
        "mode": preset.label,
        "seed": seed,
        "timings_s": timings,
        "cells": len(result.cells),
        "computed": result.computed,
    }
    atomic_write_json(folder / "run.json", run_record)
    return Report(path, drawn, claims, timings, summary, real_figure)


def dataset_tables(real_model: dict | None) -> dict:
    from cactus_theory.real.real_model import dataset_tables as tables

    return tables(real_model)


def _real_model(folder: Path, *, quick: bool, progress: bool) -> dict:
    from cactus_theory.real import real_model

    return real_model.run(folder, quick=quick, progress=progress)


def draw_real_figure(results: Results, folder: Path) -> Figure | None:
    """The real-model section's figure: the exact trade-off, one panel per evaluation set
    (``figures_real.figure_real_tradeoff``), or None without trade-off results."""
    from cactus_theory.real.real_model import tradeoff_documents
    from paper_figs import figures_real
    from paper_figs.page_real import DATASET_TITLES

    documents = tradeoff_documents(results.real_model)
    if not documents:
        return None
    titled = {DATASET_TITLES.get(name, name): data for name, data in documents.items()}
    return figures_real.figure_real_tradeoff(titled, folder, "real_tradeoff")


def draw_figures(results: Results, claims: dict, folder: Path) -> list[Figure]:
    """Every figure the available results allow, in report order (figure 2 second)."""
    drawn = []
    for index, make in enumerate(figures.SWEEP_FIGURES):
        if index == 1:
            drawn.append(figures.figure_overshoot(claims, results, folder))
        if _has_data(make, results):
            drawn.append(make(results, folder))
    return drawn


def _has_data(make, results: Results) -> bool:
    needs = {
        figures_tradeoff.figure_tradeoff: results.tradeoff,
        figures.figure_al_vs_delta: [
            r for r in results.decoding if r["source"] == results.main_source
        ],
        figures.figure_speedup: results.speedup,
        figures.figure_gamma: results.gamma,
        figures.figure_example: results.example,
        figures.figure_sequence_kl: [r for r in results.sequence_kl if r["group"] == "matched"],
        figures.figure_real_model: any(
            table.get("rows") for table in dataset_tables(results.real_model).values()
        ),
    }
    return bool(needs.get(make, True))
