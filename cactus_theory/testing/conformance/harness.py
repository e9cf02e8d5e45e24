"""``conform``: run the whole conformance suite on one engine's verify step.

The suite is every exact-decision property (``exact``), every law property (``laws``), the
engine's own extra properties (``Adapter.extra``) and ``output-layout``: every call of the
run returned [B, k+1] ids with the accepted drafts, one emitted token in [0, V), then -1
(``adapter.layout_problem``).

The statistical tests of the whole run share one family-wise ``level`` (default 1e-3):
each of the m tests runs at level / m (Bonferroni), so a conforming engine fails the run
with probability at most ``level``. Everything is seeded from ``seed``, so a run is
reproducible (an engine that ignores its generator, e.g. a CUDA kernel with its own
Philox state, is reproducible only as far as it is).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from cactus_theory.core import rules
from cactus_theory.core.rules.base import Rule
from cactus_theory.testing.conformance import cases, exact, laws
from cactus_theory.testing.conformance.adapter import Adapter, LayoutLog
from cactus_theory.testing.conformance.report import ConformReport, PropertyResult
from cactus_theory.testing.search import FAILED, PASSED, raised

#: Family-wise level of all the statistical tests of one run.
LEVEL = 1e-3
#: Every property, in the order a report lists them (extras go before output-layout).
PROPERTIES = (*exact.EXACT_PROPERTIES, *laws.LAW_PROPERTIES, "output-layout")


def _checked(
    rule: object,
    draws: object,
    examples: object,
    level: object,
    seed: object,
    only: object,
    known: tuple[str, ...],
) -> tuple[Rule, list[str] | None]:
    if isinstance(rule, str):
        parsed = rules.parse(rule)
    elif isinstance(rule, Rule):
        parsed = rule
    else:
        raise ValueError(f"rule: expected a spec string or a rules.Rule, got {rule!r}")
    for key, value, low in (("draws", draws, 1), ("examples", examples, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{key}: must be an integer >= {low}, got {value!r}")
    if isinstance(level, bool) or not isinstance(level, int | float) or not 0 < level < 1:
        raise ValueError(f"level: must lie in (0, 1), got {level!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: must be an integer, got {seed!r}")
    chosen = None if only is None else list(only)  # type: ignore[arg-type]
    if chosen is not None:
        unknown = [name for name in chosen if name not in known]
        if unknown:
            raise ValueError(f"only: unknown property {unknown[0]!r}; choose from {known}")
    return parsed, chosen


def conform(
    verify_fn: Adapter | Callable[..., Any],
    rule: str | Rule | None = None,
    *,
    draws: int = 100_000,
    examples: int = 100,
    level: float = LEVEL,
    seed: int = 0,
    only: Iterable[str] | None = None,
    name: str | None = None,
    **declared: Any,
) -> ConformReport:
    """Check an engine's verify step against the rule it claims.

    Parameters
    ----------
    verify_fn : an ``Adapter``, or a verify function (``adapter`` module docstring:
        ``verify_fn(target_probs [B, k+1, V], draft_probs [B, k, V], draft_ids [B, k],
        generator, uniforms=None) -> (token_ids [B, k+1], num_accepted [B])``), then
        described by ``declared`` (``Adapter``'s fields: ``recovery``, ``injects``,
        ``ragged``, ``row_generators``, ``dtypes``, ``logits``, ...).
    rule : the spec the engine claims ("sps", "sglang:threshold_single=0.9,threshold_acc=0.5",
        any registered rule) or a rule; default the adapter's, else "sps".
    draws : rows per law case (the law tests' sample size; an adapter's ``max_draws``
        caps it).
    examples : hypothesis draws per exact-decision property.
    level : family-wise level of every statistical test of the run (Bonferroni).
    seed : fixes every draw of the run.
    only : a subset of ``PROPERTIES``.
    name : the engine's name in the report (a plain function: its ``__name__``).

    Returns
    -------
    ``ConformReport``: ``.passed``, ``.failures`` (counterexamples, p-values), every
    property's result (passed, failed, n/a), the measured against the exact acceptance.
    A failing property never raises; bad arguments are a ValueError naming them.
    """
    if isinstance(verify_fn, Adapter):
        adapter = verify_fn
        if declared:
            raise ValueError(f"{sorted(declared)[0]}: give it to the Adapter, not to conform")
    else:
        if not callable(verify_fn):
            raise ValueError(f"verify_fn: expected a callable, got {type(verify_fn).__name__}")
        label = name or getattr(verify_fn, "__name__", "engine")
        adapter = Adapter(label, verify_fn, **declared)
    spec = rule if rule is not None else adapter.rule
    known = (*PROPERTIES, *(check.name for check in adapter.extra))
    parsed, chosen = _checked(spec, draws, examples, level, seed, only, known)
    selected = set(PROPERTIES if chosen is None else chosen)
    if adapter.max_draws is not None:
        draws = min(draws, adapter.max_draws)

    law_cases = [
        case
        for case in cases.law_cases(seed)
        if (case.property in selected)
        or (
            case.property == "law" and selected & {"law-emitted", "law-bonus", "law-accepted-count"}
        )
    ]
    extras = [check for check in adapter.extra if chosen is None or check.name in selected]
    tests = laws.planned_tests(law_cases, adapter) + sum(check.tests for check in extras)
    each = level / max(1, tests)

    report = ConformReport(
        adapter.name, rules.spec_of(parsed), adapter.version, level, notes=adapter.notes
    )
    if adapter.max_draws is not None and adapter.max_draws_reason:
        report.notes = (
            *report.notes,
            f"law cases capped at {draws:,} draws: {adapter.max_draws_reason}",
        )
    log = LayoutLog()
    for index, property_name in enumerate(exact.EXACT_PROPERTIES):
        if property_name in selected:
            report.results.append(
                _timed(
                    property_name,
                    lambda n=property_name, i=index: exact.exact_property(
                        n, adapter, parsed, examples, seed + i, log
                    ),
                )
            )
    started = time.perf_counter()
    found, reasons, report.acceptance = laws.run_law_cases(
        adapter, parsed, law_cases, draws, each, seed, log
    )
    spent = time.perf_counter() - started
    law_names = [n for n in laws.LAW_PROPERTIES if n in selected]
    for property_name in law_names:
        result = laws.law_result(
            property_name, found[property_name], reasons.get(property_name), each
        )
        result.seconds = spent / max(1, len(law_names))
        report.results.append(result)
    for check in extras:
        report.results.append(_timed(check.name, lambda c=check: c.run(each, draws, seed)))
    if "output-layout" in selected:
        report.results.append(_layout_result(log))
    return report


def _timed(name: str, run: Callable[[], PropertyResult]) -> PropertyResult:
    started = time.perf_counter()
    try:
        result = run()
    except Exception as error:  # the engine raised outside a searched property
        result = PropertyResult(name, FAILED, raised(error))
    result.seconds = time.perf_counter() - started
    return result


def _layout_result(log: LayoutLog) -> PropertyResult:
    if log.problems:
        first = log.problems[0]
        return PropertyResult(
            "output-layout",
            FAILED,
            f"{first['where']}: {first['problem']}",
            {"problems": log.problems},
            kind="output",
        )
    return PropertyResult(
        "output-layout",
        PASSED,
        f"[B, k+1] ids: drafts, one emitted id in [0, V), then -1 ({log.calls} calls, "
        f"{log.rows:,} rows)",
        kind="output",
    )
