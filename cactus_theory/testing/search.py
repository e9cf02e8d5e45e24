"""What every check of the kit shares, whatever it checks (a chain rule, a tree rule):
results and reports, the hypothesis search for a counterexample, closeness of laws, and
the chi-square test of a sampler against an exact law.

A **check** returns a ``CheckResult``: ``passed``, ``failed`` (with what is wrong and, for
a searched property, the shrunk counterexample as plain lists) or ``skipped`` (saying why).
A **searched property** (``property_check``) draws ``examples`` inputs from a hypothesis
strategy with ``hypothesis.find`` (seeded, no database, no deadline), asks ``problem`` what
is wrong with each (None: nothing), and shrinks the first failure. An exception inside the
checked code is a problem (``raised TypeError: ...``), never a crash of the report, and so
is an exception anywhere in a check (``run_checks``).

Closeness is absolute on probabilities: ``max |actual − expected| <= ATOL`` (``close``).
The chi-square test (``chi_square_pvalue``) is Pearson's, with bins expecting fewer than 5
draws pooled; ``chi_square_check`` runs it on several cases at a family-wise ``level``
(Bonferroni: each case at level / cases).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Absolute tolerance on probabilities (laws, acceptances).
ATOL = 1e-9

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass
class CheckResult:
    """One check of one subject: its status, what it checked (or why it failed or was
    skipped), the shrunk counterexample of a failure (plain lists, so it can be pasted),
    and its time."""

    name: str
    status: str
    detail: str = ""
    counterexample: dict[str, Any] | None = None
    seconds: float = 0.0


class Report:
    """What a kit found: ``passed`` (no check failed), ``failures``, every result in
    ``results``, and a readable table (``str(report)``). A subclass is a dataclass holding
    its subject and ``results``, and names the subject in ``heading``."""

    results: list[CheckResult]

    @property
    def heading(self) -> str:
        """The table's first words, e.g. ``check_rule(cactus:delta=0.5)``."""
        raise NotImplementedError

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[CheckResult]:
        return [result for result in self.results if result.status == FAILED]

    def assert_passed(self) -> None:
        """Raise AssertionError with the report when a check failed (for pytest)."""
        if not self.passed:
            raise AssertionError(str(self))

    def __str__(self) -> str:
        width = max(len(result.name) for result in self.results) if self.results else 10
        verdict = "passed" if self.passed else "FAILED"
        total = sum(result.seconds for result in self.results)
        lines = [f"{self.heading}: {verdict} ({total:.1f} s)"]
        for result in self.results:
            lines.append(
                f"  {result.name:<{width}}  {result.status:<7} {result.seconds:5.1f} s  "
                f"{result.detail}"
            )
            if result.counterexample is not None:
                for key, value in result.counterexample.items():
                    lines.append(f"  {'':<{width}}    {key} = {value}")
        return "\n".join(lines)


def raised(error: BaseException) -> str:
    """How a check reports an exception of the checked code: ``raised Type: message``."""
    return f"raised {type(error).__name__}: {error}"


def run_checks(report: Report, names: Iterable[str], run_one: Callable[[str], CheckResult]):
    """Run ``run_one(name)`` for each name, timing it, into ``report.results``. A check
    that raises is a failed result saying what was raised (the report is never lost).
    Returns ``report``."""
    for name in names:
        started = time.perf_counter()
        try:
            result = run_one(name)
        except Exception as error:  # the checked code raised outside a searched property
            result = CheckResult(name, FAILED, raised(error))
        result.seconds = time.perf_counter() - started
        report.results.append(result)
    return report


def hypothesis_module():
    """``hypothesis``, or an ImportError saying how to install it."""
    try:
        import hypothesis
    except ImportError as error:  # pragma: no cover - exercised only without hypothesis
        raise ImportError(
            'cactus_theory.testing needs hypothesis: pip install "cactus-theory[testing]"'
        ) from error
    return hypothesis


def plain(value: Any) -> Any:
    """A counterexample part as plain Python (lists of floats with full precision)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, tuple | list):
        return [plain(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def search(
    strategy, problem: Callable[[Any], str | None], examples: int, seed: int
) -> tuple[str, Any] | None:
    """(message, shrunk example) of a drawn example where ``problem`` says what is wrong,
    or None when ``examples`` draws find none. An exception inside the checked code is a
    problem."""
    hypothesis = hypothesis_module()

    def guarded(example: Any) -> str | None:
        try:
            return problem(example)
        except Exception as error:  # the checked code raised: report it
            return raised(error)

    settings = hypothesis.settings(
        max_examples=examples,
        database=None,
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
        phases=[hypothesis.Phase.generate, hypothesis.Phase.shrink],
    )
    try:
        found = hypothesis.find(
            strategy,
            lambda example: guarded(example) is not None,
            settings=settings,
            random=random.Random(seed),
        )
    except hypothesis.errors.NoSuchExample:
        return None
    return guarded(found), found


def property_check(
    name: str,
    strategy,
    problem: Callable[[Any], str | None],
    keys: tuple[str, ...],
    detail: str,
    examples: int,
    seed: int,
) -> CheckResult:
    """The result of searching ``strategy`` for an example where ``problem`` finds
    something wrong: passed (``detail`` and the draws), or failed with the message and the
    shrunk example, its parts named by ``keys`` (a tuple example gives one key per part)."""
    found = search(strategy, problem, examples, seed)
    if found is None:
        return CheckResult(name, PASSED, f"{detail} ({examples} draws)")
    message, example = found
    parts = example if isinstance(example, tuple) else (example,)
    return CheckResult(name, FAILED, message, dict(zip(keys, map(plain, parts), strict=False)))


def close(actual: np.ndarray, expected: np.ndarray, what: str) -> str | None:
    """None when ``max |actual − expected| <= ATOL``, else what differs and by how much."""
    gap = float(np.max(np.abs(np.asarray(actual) - np.asarray(expected)), initial=0.0))
    if not math.isfinite(gap) or gap > ATOL:
        return f"{what} differ by {gap:.3g} (tolerance {ATOL:g})"
    return None


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Pearson's chi-square p-value of ``counts`` [V] against the law ``probs`` [V].

    Bins expecting fewer than ``min_expected`` draws are pooled into one bin (so the
    chi-square approximation holds); a count where the law is 0 is impossible, so the
    p-value is 0; fewer than two bins give 1.
    """
    from scipy import stats

    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    if np.any(counts[probs <= 0] > 0):
        return 0.0
    expected = probs * counts.sum()
    big = expected >= min_expected
    observed, wanted = list(counts[big]), list(expected[big])
    if (~big).any() and expected[~big].sum() > 0:
        observed.append(counts[~big].sum())
        wanted.append(expected[~big].sum())
    if len(observed) < 2:
        return 1.0
    wanted_array = np.asarray(wanted) * (np.sum(observed) / np.sum(wanted))
    return float(stats.chisquare(observed, wanted_array).pvalue)


def chi_square_check(
    name: str,
    cases: Iterable[tuple[dict[str, Any], Callable[[], tuple[np.ndarray, np.ndarray]]]],
    level: float,
    detail: str,
) -> CheckResult:
    """Chi-square test of sampled counts against exact laws on several cases.

    ``cases``: (counterexample, sample) pairs; ``sample()`` returns (counts [V], exact law
    [V]). Each case is tested at ``level / len(cases)`` (family-wise ``level``); the first
    that fails is a failed result with its counterexample and counts. Passed: ``detail``.
    """
    cases = list(cases)
    each = level / max(1, len(cases))
    for example, sample in cases:
        counts, expected = sample()
        pvalue = chi_square_pvalue(counts, expected)
        if pvalue < each:
            return CheckResult(
                name,
                FAILED,
                f"sampled tokens do not follow the exact law (p = {pvalue:.3g} < {each:.3g})",
                {**{key: plain(value) for key, value in example.items()}, "counts": plain(counts)},
            )
    return CheckResult(name, PASSED, detail)
