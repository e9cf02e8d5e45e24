"""The main job: run the sweeps and the claims check, draw the figures, write report.html.

``build(out, quick=..., seed=...)``:

1. ``sims.sweep.run`` with the quick or full preset (cached per cell under ``out/cells``,
   so a rerun resumes), which writes the CSVs under ``out``;
2. ``proofs_check.run(quick, seed, progress, cache_dir)``, saved as ``out/claims.json`` (and
   ``out/claims.md``), as a child ``python -m proofs_check`` started at once
   (``paper_figs.children.start_claims``) while the sweep runs in this process (both are
   single-threaded numpy). After the sweep, a progress bar counts the checks the child has
   finished (each cached in ``out/claims-cache``, so an interrupted run resumes there
   too). A ``claims_runner`` argument runs in this process instead (tests inject one);
3. the real-model section (``cactus_theory.real.real_model``: pools of real contexts and
   their exact trade-off, the theory against the decoder, the predicted against the
   measured speed-up), as a second child started at once
   (``paper_figs.children.start_real_model``) with one core granted; once the sweep and
   the claims check are done it is granted both cores and told the machine is quiet (its
   timing stage waits for that). Its progress lines are relayed to the console as they
   come. Its pools, decodes and timing runs are cached under ``out/real-model``, so an
   interrupted run resumes there too;
4. the figures (``paper_figs.figures``, and ``paper_figs.figures_real`` for the
   real-model section) into ``out/figures`` as PNG and SVG;
5. ``out/report.html`` (``paper_figs.page``): the summary table, the real-model section,
   the claims table, every figure with its caption, and the Monte Carlo check against the
   block-statistics formula.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cactus_theory.util.files import atomic_write_json, atomic_write_text
from cactus_theory.util.process import exclusive_lock, signals_raise_exit
from paper_figs import figures, figures_real, figures_tradeoff
from paper_figs.children import (
    start_claims,
    start_conformance,
    start_real_model,
    wait_claims,
    wait_conformance,
    wait_real_model,
)
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
    #: the real-model section's tree figure (tree rules on the first set's pool), if drawn
    tree_figure: Figure | None = None


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


def build(
    out: Path | str,
    *,
    quick: bool = False,
    seed: int = 0,
    progress: bool = True,
    config=None,
    claims_runner: Callable[..., dict] | None = None,
    real_model: bool | Callable[..., dict] = True,
    conformance: bool | Callable[..., dict | None] = True,
) -> Report:
    """Run everything and write ``out/report.html`` (see the module docstring).

    ``conformance``: run the conformance section (``cactus_theory.testing.conformance.
    section``: the engines' samplers against the rules they claim) in a child process
    started when the sweep ends; False skips it, a callable ``(folder, quick) -> data``
    replaces it, in this process (tests).

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
        return _build(
            folder, preset, quick, seed, progress, claims_runner, lock, real_model, conformance
        )


def _build(
    folder, preset, quick, seed, progress, claims_runner, lock, real_model, conformance
) -> Report:
    timings: dict[str, float] = {}
    start = time.perf_counter()
    pending, real_child = None, None
    if claims_runner is None:
        pending = start_claims(folder, quick=quick, seed=seed, lock=lock)
        if real_model is True:
            real_child = start_real_model(folder, quick=quick, lock=lock, progress=progress)
    try:
        result, claims = _steps(
            folder, preset, quick, seed, progress, claims_runner, pending, real_child,
            real_model, conformance, timings, start, lock,
        )  # fmt: skip
    except BaseException:
        for child in (real_child, pending):
            if child is not None:
                child.stop()
        raise
    return _finish(folder, preset, quick, seed, result, claims, timings, start)


def _steps(folder, preset, quick, seed, progress, claims_runner, pending, real_child,
           real_model, conformance, timings, start, lock):  # fmt: skip
    """The sweep, the claims check, the conformance section and the real-model section:
    (sweep result, claims)."""
    from sims import sweep

    result = sweep.run(preset, folder, progress=progress)
    timings["sweep"] = time.perf_counter() - start
    conform_child = None
    if conformance is True:  # on the core the sweep frees
        conform_child = start_conformance(folder, quick=quick, lock=lock)
    mark = time.perf_counter()
    if pending is None:
        claims = claims_runner(folder, quick=quick, seed=seed, progress=progress)
        timings["claims"] = time.perf_counter() - mark
    else:
        claims, timings["claims"] = wait_claims(
            pending, folder, quick=quick, seed=seed, progress=progress
        )
        timings["claims_wait"] = time.perf_counter() - mark
    mark = time.perf_counter()
    try:
        if conform_child is not None:
            if progress:
                print("waiting for the conformance section", file=sys.stderr, flush=True)
            _write_conformance(folder, wait_conformance(conform_child))
        elif callable(conformance):
            _write_conformance(folder, conformance(folder, quick=quick))
    finally:
        if conform_child is not None:
            conform_child.stop()
    timings["conformance_wait"] = time.perf_counter() - mark
    if real_child is not None:  # the sweep and the claims are done: the machine is its
        real_child.grant(os.cpu_count() or 1, quiet=True)
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
    tree_figure = draw_tree_figure(results, folder / "figures")
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
        tree_figure=tree_figure,
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
    return Report(path, drawn, claims, timings, summary, real_figure, tree_figure)


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


def draw_tree_figure(results: Results, folder: Path) -> Figure | None:
    """The real-model section's tree figure: tree rules against the tree frontier on the
    first set's pool (``figures_trees.tree_tradeoff_figure``), or None without it."""
    from paper_figs import figures_trees
    from paper_figs.page_real import DATASET_TITLES

    entry = (results.real_model or {}).get("trees")
    if not entry or not entry.get("document", {}).get("configurations"):
        return None
    document = dict(entry["document"])
    document["dataset"] = DATASET_TITLES.get(entry["dataset"], entry["dataset"])
    return figures_trees.tree_tradeoff_figure(document, folder, "real_tree_tradeoff")


def draw_figures(results: Results, claims: dict, folder: Path) -> list[Figure]:
    """Every figure the available results allow, in report order (figure 2 second, figure
    9, the multi-draft optimum in Khisti et al.'s setting, from the claims check last)."""
    from paper_figs import figures_trees

    drawn = []
    for index, make in enumerate(figures.SWEEP_FIGURES):
        if index == 1:
            drawn.append(figures.figure_overshoot(claims, results, folder))
        if _has_data(make, results):
            drawn.append(make(results, folder))
    khisti = (claims.get("curves") or {}).get("khisti_figure2")
    if khisti:
        drawn.append(figures_trees.figure_khisti(khisti, folder, "fig9_khisti"))
    return drawn


def _write_conformance(folder: Path, data: dict | None) -> None:
    """The conformance section's data where the page reads it (``conformance.json``); a
    failed section leaves none (the page says it did not run)."""
    if data is None:
        (folder / "conformance.json").unlink(missing_ok=True)
    else:
        atomic_write_json(folder / "conformance.json", data)


def _speed_rows(real_model: dict | None) -> list:
    from cactus_theory.real.real_model import speed_result

    return speed_result(real_model).get("rows") or []


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
        figures_real.figure_real_model: bool(_speed_rows(results.real_model)),
    }
    return bool(needs.get(make, True))
