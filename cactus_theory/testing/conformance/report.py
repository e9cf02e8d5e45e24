"""What a conformance run found: one result per property, and the report of one engine.

A **property** is one claim about an engine's verify step (``PROPERTIES`` in
``harness``). Its result is ``passed``, ``failed`` (with a counterexample: the inputs, the
randomness, what the engine emitted and what the claimed rule emits) or ``not
applicable`` (saying why: the engine takes no uniforms, no per-row generators, no logits).

A **statistical** property (the law tests) is a family of chi-square tests; its result
holds, besides the kit's fields, the smallest p-value, the level each test ran at (the
suite's family-wise level divided by the number of tests in the suite: Bonferroni), the
draws, and ``detectable_tv``: the smallest total variation between the true law and the
claimed one that the test detects with probability ``POWER`` at its draws and level
(``stats.detectable_tv``). ``tests`` lists every test of the family (case, position,
draws, p-value, counts and the exact law), so a failure can be pasted as a reproduction.

``ConformReport`` extends the kit's ``Report`` (``passed``, ``failures``, ``str``) with
the engine, its version, the claimed rule, the measured acceptance per law case against the
rule's exact acceptance, and ``to_dict`` for ``--json``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from cactus_theory.testing.search import FAILED, PASSED, SKIPPED, CheckResult, Report, plain

#: The status of a property the engine cannot be asked about (no uniforms, no logits, ...).
NOT_APPLICABLE = "n/a"

__all__ = ["FAILED", "NOT_APPLICABLE", "PASSED", "SKIPPED"]


@dataclass
class PropertyResult(CheckResult):
    """One property of one engine (see the module docstring).

    kind : "exact" (decisions from injected randomness), "law" (chi-square against the
        exact law) or "output" (layout and range checks that hold in every run).
    pvalue : the smallest p-value of the family (law properties).
    level : the level each test of the family ran at.
    draws : the fewest draws any test of the family saw.
    detectable_tv : the largest, over the family, of each test's detectable TV.
    decisions, excused : rows compared and rows excused as near-ties (exact properties).
    tests : every test of the family, as plain data.
    """

    kind: str = "exact"
    pvalue: float | None = None
    level: float | None = None
    draws: int | None = None
    detectable_tv: float | None = None
    decisions: int | None = None
    excused: int | None = None
    tests: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON (non-finite floats as strings)."""
        data = {
            "name": self.name,
            "status": self.status,
            "kind": self.kind,
            "detail": self.detail,
            "seconds": round(self.seconds, 3),
        }
        for key in ("pvalue", "level", "draws", "detectable_tv", "decisions", "excused"):
            value = getattr(self, key)
            if value is not None:
                data[key] = _finite(value)
        if self.counterexample is not None:
            data["counterexample"] = {k: _finite(plain(v)) for k, v in self.counterexample.items()}
        if self.tests:
            data["tests"] = [{k: _finite(plain(v)) for k, v in t.items()} for t in self.tests]
        return data


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities (anywhere in lists) written as strings, for JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


@dataclass
class AcceptanceRow:
    """One law case: the engine's measured acceptance per position against the rule's
    exact one (``law.acceptance``), and the draws that reached each position."""

    case: str
    measured: list[float]
    exact: list[float]
    reached: list[int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "measured": [_finite(round(v, 6)) for v in self.measured],
            "exact": [round(v, 6) for v in self.exact],
            "reached": self.reached,
        }


@dataclass
class ConformReport(Report):
    """The conformance of one engine's verify step with the rule it claims."""

    engine: str
    rule: str
    version: str = ""
    level: float = 0.0
    results: list[PropertyResult] = field(default_factory=list)
    acceptance: list[AcceptanceRow] = field(default_factory=list)
    notes: tuple[str, ...] = ()

    @property
    def heading(self) -> str:
        version = f" {self.version}" if self.version else ""
        return f"conform({self.engine}{version}, rule={self.rule})"

    def status(self, name: str) -> str | None:
        """The status of property ``name``, or None when it was not run."""
        for result in self.results:
            if result.name == name:
                return result.status
        return None

    def __str__(self) -> str:
        lines = [super().__str__()]
        for row in self.acceptance:
            pairs = ", ".join(
                f"{m:.4f} vs {e:.4f}" for m, e in zip(row.measured, row.exact, strict=True)
            )
            lines.append(f"  acceptance [{row.case}] measured vs exact per position: {pairs}")
        for note in self.notes:
            lines.append(f"  note: {note}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {
            "engine": self.engine,
            "version": self.version,
            "rule": self.rule,
            "passed": self.passed,
            "level": self.level,
            "seconds": round(sum(result.seconds for result in self.results), 3),
            "properties": [result.to_dict() for result in self.results],
            "acceptance": [row.to_dict() for row in self.acceptance],
            "notes": list(self.notes),
        }


def report_from_dict(data: dict[str, Any]) -> ConformReport:
    """A report back from ``ConformReport.to_dict`` (results with their status, detail,
    counterexample and statistics; for tables and docs)."""
    results = []
    for item in data["properties"]:
        result = PropertyResult(item["name"], item["status"], item.get("detail", ""))
        result.kind = item.get("kind", "exact")
        result.counterexample = item.get("counterexample")
        result.seconds = item.get("seconds", 0.0)
        for key in ("pvalue", "level", "draws", "detectable_tv", "decisions", "excused"):
            value = item.get(key)
            setattr(result, key, float(value) if isinstance(value, str) else value)
        result.tests = item.get("tests", [])
        results.append(result)
    acceptance = [
        AcceptanceRow(
            row["case"],
            [float(v) for v in row["measured"]],
            [float(v) for v in row["exact"]],
            list(row["reached"]),
        )
        for row in data.get("acceptance", [])
    ]
    return ConformReport(
        data["engine"],
        data["rule"],
        data.get("version", ""),
        data.get("level", 0.0),
        results,
        acceptance,
        tuple(data.get("notes", ())),
    )
