"""Law properties: what the engine emits, by chi-square against the claimed rule's exact law.

Each law case (``cases.law_cases``) is one block (q_0..q_k, p_0..p_{k−1}) repeated over
``draws`` rows; the harness draws each row's drafts n_i ~ p_i itself (numpy, seeded) and
the engine verifies with its own randomness (a seeded ``torch.Generator``, or per-row
generators for the ``seeded`` case). With N the number of accepted drafts of a row:

- position i < k, over the rows that reach it (N >= i): the emitted token (the accepted
  draft or the residual's token) has the law ``law.output_law(rule, q_i, p_i)``, whatever
  happened before (the drafts are independent across positions);
- the bonus, over the rows with N = k: q_k;
- N: P(N = j) = (Π_{i<j} α_i)(1 − α_j), P(N = k) = Π α_i with α_i =
  ``law.acceptance(rule, q_i, p_i)`` (``core.block.accepted_length_distribution``).

Every count is tested with Pearson's chi-square (``stats.law_test``) at the suite's level
divided by the number of tests in the suite (Bonferroni), and states its detectable TV.

==================  ===========================================================
property            tests
==================  ===========================================================
law-emitted         each position of the ``dense`` and ``truncated`` cases
law-bonus           the bonus of both (not applicable when the bonus is supplied
                    by the adapter: vLLM's rejection_sample takes it as input)
law-accepted-count  N of both; the report also lists the measured α_i
law-low-precision   positions, bonus and N of the ``bfloat16`` case
law-seeded-rows     positions, bonus and N of the rows with their own generator
law-logits          positions, bonus and N of each settings group of the
                    ``logits`` case, through the engine's metadata
==================  ===========================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cactus_theory.core import block as block_stats
from cactus_theory.core import law
from cactus_theory.core.rules.base import Rule
from cactus_theory.testing.conformance import stats
from cactus_theory.testing.conformance.adapter import (
    BONUS_ENGINE,
    DTYPES,
    Adapter,
    LayoutLog,
    call,
    generators_for,
)
from cactus_theory.testing.conformance.cases import LawCase
from cactus_theory.testing.conformance.report import (
    NOT_APPLICABLE,
    AcceptanceRow,
    PropertyResult,
)
from cactus_theory.testing.search import FAILED, PASSED, raised

LAW_PROPERTIES = (
    "law-emitted",
    "law-bonus",
    "law-accepted-count",
    "law-low-precision",
    "law-seeded-rows",
    "law-logits",
)
#: Rows per engine call.
CHUNK = 1 << 16


def case_applies(case: LawCase, adapter: Adapter) -> str | None:
    """Why ``case`` cannot run on ``adapter``, or None."""
    if case.dtype != "float32" and case.dtype not in adapter.dtypes:
        return f"the engine takes no {case.dtype} inputs"
    if case.seeded and not adapter.row_generators:
        return "the engine takes no per-row generators"
    if case.logits is not None and adapter.logits is None:
        return "the engine takes probabilities, not logits with sampling metadata"
    return None


def _with_bonus(case: LawCase, adapter: Adapter) -> bool:
    bonus = adapter.logits_bonus if case.logits is not None else adapter.bonus
    return bonus == BONUS_ENGINE


def planned_tests(cases: list[LawCase], adapter: Adapter) -> int:
    """How many chi-square tests the law cases run on ``adapter`` (for Bonferroni)."""
    total = 0
    for case in cases:
        if case_applies(case, adapter) is None:
            groups = max(1, len(case.settings))
            total += groups * (case.steps + 1 + int(_with_bonus(case, adapter)))
    return total


@dataclass
class CaseCounts:
    """Counts of one law case, per settings group g: ``positions[g][i]`` [V],
    ``bonus[g]`` [V], ``accepted[g]`` [k+1]."""

    positions: list[list[np.ndarray]]
    bonus: list[np.ndarray]
    accepted: list[np.ndarray]


def _normalised(rows: np.ndarray) -> np.ndarray:
    return rows / rows.sum(axis=-1, keepdims=True)


def sample_case(
    adapter: Adapter, case: LawCase, draws: int, seed: int, log: LayoutLog
) -> CaseCounts:
    """Run ``draws`` rows of ``case`` through the engine and count what it emits."""
    steps, vocab = case.draft.shape
    groups = max(1, len(case.settings))
    counts = CaseCounts(
        [[np.zeros(vocab) for _ in range(steps)] for _ in range(groups)],
        [np.zeros(vocab) for _ in range(groups)],
        [np.zeros(steps + 1) for _ in range(groups)],
    )
    generator = np.random.default_rng(seed)
    dtype = DTYPES[case.dtype]
    draft_rows = torch.as_tensor(case.draft).to(dtype)  # [k, V]
    draft_law = _normalised(case.draft)
    draws = max(1, round(draws * case.share)) * groups  # each settings group its share
    for start in range(0, draws, CHUNK):
        size = min(CHUNK, draws - start)
        ids = _draw_ids(draft_law, generator.random((size, steps)))
        ids_tensor = torch.as_tensor(ids, dtype=torch.int64)
        draft = draft_rows[None].expand(size, steps, vocab)
        engine_generator: object = torch.Generator().manual_seed(seed * 1_000_003 + start)
        group = np.arange(start, start + size) % groups
        counted = np.ones(size, dtype=bool)
        if case.seeded:
            seeds = [seed * 7_919 + start + row if row % 2 == 0 else None for row in range(size)]
            engine_generator = generators_for(seeds)
            counted = np.arange(size) % 2 == 0
        if case.logits is not None:
            logits = torch.as_tensor(case.logits, dtype=torch.float32)[None]
            settings = [case.settings[g] for g in group]
            tokens, accepted = call(
                adapter.logits, log, case.name, logits.expand(size, steps + 1, vocab), draft,
                ids_tensor, settings, engine_generator,
            )  # fmt: skip
        else:
            target = torch.as_tensor(case.target).to(dtype)[None].expand(size, steps + 1, vocab)
            tokens, accepted = call(
                adapter.verify, log, case.name, target, draft, ids_tensor, engine_generator
            )
        _accumulate(counts, tokens, accepted, group, counted, steps, vocab)
    return counts


def _draw_ids(draft_law: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """[n, k] ids drawn from the rows ``draft_law`` [k, V] with ``uniforms`` [n, k]:
    ``core.verify.inverse_cdf``'s convention (first index whose cumulative probability
    exceeds u · total; a zero-probability token is never drawn), one searchsorted per
    position instead of a cumulative sum per row."""
    ids = np.empty(uniforms.shape, dtype=np.int64)
    for position, row in enumerate(draft_law):
        cumulative = np.cumsum(row)
        index = np.searchsorted(cumulative, uniforms[:, position] * cumulative[-1], "right")
        ids[:, position] = np.minimum(index, np.flatnonzero(row > 0)[-1])
    return ids


def _accumulate(
    counts: CaseCounts,
    tokens: np.ndarray,
    accepted: np.ndarray,
    group: np.ndarray,
    counted: np.ndarray,
    steps: int,
    vocab: int,
) -> None:
    valid = (accepted >= 0) & (accepted <= steps)
    for g in range(len(counts.bonus)):
        rows = (group == g) & counted & valid
        number = accepted[rows]
        counts.accepted[g] += np.bincount(number, minlength=steps + 1)[: steps + 1]
        chosen = tokens[rows]
        for position in range(steps + 1):
            reach = number >= position if position < steps else number == steps
            emitted = chosen[reach, position]
            emitted = emitted[(emitted >= 0) & (emitted < vocab)]
            histogram = np.bincount(emitted, minlength=vocab)[:vocab]
            if position < steps:
                counts.positions[g][position] += histogram
            else:
                counts.bonus[g] += histogram


def exact_laws(rule: Rule, case: LawCase) -> list[tuple[list[np.ndarray], np.ndarray, np.ndarray]]:
    """Per settings group: (position laws [k] x [V], bonus law [V], P(N = j) [k+1])."""
    draft = _normalised(case.draft)
    result = []
    for target in case.targets():
        target = _normalised(target)
        steps = case.steps
        positions = [law.output_law(rule, target[i], draft[i]) for i in range(steps)]
        alphas = [float(law.acceptance(rule, target[i], draft[i])) for i in range(steps)]
        accepted = block_stats.accepted_length_distribution(np.clip(alphas, 0.0, 1.0))
        result.append((positions, target[steps], accepted))
    return result


def measured_acceptance(case: LawCase, counts: CaseCounts, rule: Rule) -> list[AcceptanceRow]:
    """Per settings group: α̂_i = #(N > i) / #(N >= i) against the exact α_i."""
    rows = []
    draft = _normalised(case.draft)
    for g, target in enumerate(case.targets()):
        target = _normalised(target)
        number = counts.accepted[g]
        at_least = np.cumsum(number[::-1])[::-1]  # #(N >= i), i = 0..k
        measured = [
            float(at_least[i + 1] / at_least[i]) if at_least[i] else float("nan")
            for i in range(case.steps)
        ]
        exact = [float(law.acceptance(rule, target[i], draft[i])) for i in range(case.steps)]
        label = case.name if not case.settings else f"{case.name} [{case.settings[g].label}]"
        rows.append(AcceptanceRow(label, measured, exact, [int(v) for v in at_least[:-1]]))
    return rows


def run_law_cases(
    adapter: Adapter,
    rule: Rule,
    cases: list[LawCase],
    draws: int,
    level: float,
    seed: int,
    log: LayoutLog,
) -> tuple[dict[str, list[dict]], dict[str, str], list[AcceptanceRow]]:
    """Run every applicable case: (tests by property, why a property cannot run or what
    the engine raised, acceptance rows)."""
    tests: dict[str, list[dict]] = {name: [] for name in LAW_PROPERTIES}
    reasons: dict[str, str] = {}
    acceptance: list[AcceptanceRow] = []
    for index, case in enumerate(cases):
        reason = case_applies(case, adapter)
        if reason is not None:
            reasons.setdefault(case.property, reason)
            continue
        try:
            counts = sample_case(adapter, case, draws, seed + 101 * index, log)
        except Exception as error:  # the engine raised: the properties this case feeds fail
            targets = (
                ("law-emitted", "law-bonus", "law-accepted-count")
                if case.property == "law"
                else (case.property,)
            )
            for name in targets:
                reasons[name] = f"{case.name}: {raised(error)}"
            continue
        with_bonus = _with_bonus(case, adapter)
        laws = exact_laws(rule, case)
        for g, (positions, bonus, accepted) in enumerate(laws):
            group = "" if not case.settings else f" [{case.settings[g].label}]"
            found = []
            for position in range(case.steps):
                found.append(
                    (
                        "law-emitted",
                        f"position {position}",
                        counts.positions[g][position],
                        positions[position],
                    )
                )
            if with_bonus:
                found.append(("law-bonus", "bonus", counts.bonus[g], bonus))
            found.append(("law-accepted-count", "accepted count", counts.accepted[g], accepted))
            for name, what, observed, expected in found:
                result = stats.law_test(observed, expected, level)
                result = {"case": case.name + group, "test": what, **result}
                tests[name if case.property == "law" else case.property].append(result)
        acceptance.extend(measured_acceptance(case, counts, rule))
    if adapter.bonus != BONUS_ENGINE:
        reasons.setdefault(
            "law-bonus", "the bonus is an input of the engine's verify step (supplied here)"
        )
    return tests, reasons, acceptance


def law_result(name: str, tests: list[dict], reason: str | None, level: float) -> PropertyResult:
    """The result of one law property from its tests (or why it did not run)."""
    if not tests:
        if reason is not None and reason.split(": ", 1)[-1].startswith("raised"):
            return PropertyResult(name, FAILED, reason, kind="law")
        return PropertyResult(name, NOT_APPLICABLE, reason or "no case applies", kind="law")
    worst = min(tests, key=lambda test: test["pvalue"])
    draws = min(test["draws"] for test in tests)
    detectable = max(test["detectable_tv"] for test in tests)
    summary = (
        f"{len(tests)} chi-square tests at level {level:.2g} each; smallest p = "
        f"{worst['pvalue']:.3g} ({worst['case']}, {worst['test']}); >= {draws:,} draws per "
        f"test; detects TV >= {detectable:.4f} with probability {stats.POWER:g}"
    )
    failed = [test for test in tests if not test["passed"]]
    if reason is not None and reason.split(": ", 1)[-1].startswith("raised"):
        failed = failed or [{"case": reason, "test": "", "pvalue": 0.0}]
    status = FAILED if failed else PASSED
    counterexample = None
    if failed:
        first = failed[0]
        summary = (
            f"{first['case']}, {first['test']}: p = {first['pvalue']:.3g} < {level:.2g} "
            f"(observed TV {first.get('observed_tv', float('nan')):.4f}); " + summary
        )
        counterexample = {
            key: first[key] for key in ("case", "test", "draws", "counts", "law") if key in first
        }
    return PropertyResult(
        name,
        status,
        summary,
        counterexample,
        kind="law",
        pvalue=worst["pvalue"],
        level=level,
        draws=draws,
        detectable_tv=detectable,
        tests=tests,
    )
