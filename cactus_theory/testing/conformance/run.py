"""Run the suite on whole engines (every variant, in parallel processes) and tabulate.

``run_engines`` builds each engine's variants (``adapters.variants``), runs ``conform`` on
each in a pool of ``jobs`` worker processes (one torch thread each, so small tensors do not
fight over cores), and returns the reports with each engine's wall time. ``summary_table``
is the engine × property table (pass, FAIL, n/a) as Markdown; ``acceptance_table`` the
measured against the exact acceptance of every law case.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from cactus_theory.testing.conformance.adapters import Variant, build, variants
from cactus_theory.testing.conformance.harness import PROPERTIES, conform
from cactus_theory.testing.conformance.report import NOT_APPLICABLE, ConformReport
from cactus_theory.testing.search import FAILED, PASSED


@dataclass(frozen=True)
class Budget:
    """Draws of one run: law-case draws for the main variants and for the others (the
    non-SpS rules of our own engines), hypothesis examples per exact property."""

    draws: int = 1_000_000
    rule_draws: int = 100_000
    examples: int = 100
    seed: int = 0

    @property
    def rule_examples(self) -> int:
        """Examples per exact property for the other rules: half the main variants'."""
        return max(1, self.examples // 2)


@dataclass
class EngineRun:
    """One engine's reports, the wall time of all its variants (from the run's start to
    its last variant's end) and the CPU time its variants used (their processes' own
    user + system time: on a shared machine the wall time says more about the others)."""

    engine: str
    reports: list[ConformReport] = field(default_factory=list)
    seconds: float = 0.0
    cpu_seconds: float = 0.0


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), with the count of cores this process may use."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name} ({cores} cores)"


def _run_variant(
    variant: Variant, budget: Budget, threads: int, device: str = "cpu"
) -> tuple[ConformReport, float, float]:
    """(report, wall seconds, CPU seconds of this process) of one variant."""
    import torch

    torch.set_num_threads(threads)
    started, cpu = time.perf_counter(), time.process_time()
    draws = budget.draws if variant.main else budget.rule_draws
    examples = budget.examples if variant.main else budget.rule_examples
    adapter = build(variant, device)
    report = conform(adapter, draws=draws, examples=examples, seed=budget.seed)
    return report, time.perf_counter() - started, time.process_time() - cpu


def run_engines(
    engines: Sequence[str],
    budget: Budget,
    jobs: int = 2,
    threads: int = 1,
    rule_specs: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
    device: str = "cpu",
) -> list[EngineRun]:
    """Run every variant of ``engines`` (``jobs`` processes; 1: in this process);
    ``device``: where cactus-torch's sampler runs."""
    say = progress or (lambda message: None)
    runs = {engine: EngineRun(engine) for engine in engines}
    work = [variant for engine in engines for variant in variants(engine, rule_specs)]
    started = {engine: time.perf_counter() for engine in engines}
    finished: dict[str, int] = {engine: 0 for engine in engines}
    totals = {engine: sum(v.engine == engine for v in work) for engine in engines}

    by_variant: dict[Variant, ConformReport] = {}

    def done(variant: Variant, report: ConformReport, seconds: float, cpu: float) -> None:
        by_variant[variant] = report
        finished[variant.engine] += 1
        runs[variant.engine].cpu_seconds += cpu
        verdict = "passed" if report.passed else f"FAILED ({len(report.failures)})"
        say(f"{variant.engine} [{variant.key}]: {verdict} in {seconds:.0f} s ({cpu:.0f} s CPU)")
        if finished[variant.engine] == totals[variant.engine]:
            runs[variant.engine].seconds = time.perf_counter() - started[variant.engine]

    for variant in work:
        say(f"{variant.engine} [{variant.key}]: queued")
    if jobs <= 1:
        for variant in work:
            done(variant, *_run_variant(variant, budget, threads, device))
    else:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = [(v, pool.submit(_run_variant, v, budget, threads, device)) for v in work]
            for variant, future in futures:
                done(variant, *future.result())
    for run in runs.values():
        run.reports = [by_variant[v] for v in work if v.engine == run.engine]
    return [runs[engine] for engine in engines]


_MARK = {PASSED: "pass", FAILED: "FAIL", NOT_APPLICABLE: "n/a"}


def column_label(report: ConformReport) -> str:
    """A report's column: the engine, and its rule when it claims more than SpS."""
    return report.engine if report.rule == "sps" else f"{report.engine} ({report.rule})"


def property_matrix(reports: Sequence[ConformReport]) -> dict:
    """The engine × property table as plain data: ``properties`` (rows, every property of
    the suite and the engines' own), ``columns`` (one per report) and ``cells``
    [property][report]: "pass", "FAIL", "n/a", or "-" when not run."""
    names = list(PROPERTIES)
    for report in reports:
        for result in report.results:
            if result.name not in names:
                names.insert(len(names) - 1, result.name)
    cells = [[_MARK.get(report.status(name) or "", "-") for report in reports] for name in names]
    return {"properties": names, "columns": [column_label(r) for r in reports], "cells": cells}


def acceptance_rows(reports: Sequence[ConformReport]) -> list[dict]:
    """Every law case's measured acceptance per position against the claimed rule's exact
    one, as plain rows."""
    return [
        {"engine": report.engine, "rule": report.rule, **row.to_dict()}
        for report in reports
        for row in report.acceptance
    ]


def summary_table(reports: Sequence[ConformReport]) -> str:
    """Markdown: one row per property, one column per report (``property_matrix``)."""
    matrix = property_matrix(reports)
    lines = [
        "| property | " + " | ".join(matrix["columns"]) + " |",
        "|" + "---|" * (len(reports) + 1),
    ]
    for name, row in zip(matrix["properties"], matrix["cells"], strict=True):
        marks = [f"**{cell}**" if cell == "FAIL" else cell for cell in row]
        lines.append(f"| {name} | " + " | ".join(marks) + " |")
    return "\n".join(lines)


def acceptance_table(reports: Sequence[ConformReport]) -> str:
    """Markdown: ``acceptance_rows``."""
    lines = [
        "| engine | rule | case | measured α per position | exact α | draws reaching |",
        "|---|---|---|---|---|---|",
    ]
    for row in acceptance_rows(reports):
        measured = ", ".join(f"{float(value):.4f}" for value in row["measured"])
        exact = ", ".join(f"{value:.4f}" for value in row["exact"])
        reached = ", ".join(f"{value:,}" for value in row["reached"])
        lines.append(
            f"| {row['engine']} | {row['rule']} | {row['case']} | {measured} | {exact} | "
            f"{reached} |"
        )
    return "\n".join(lines)
