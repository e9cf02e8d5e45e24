"""Claims, their verdicts, and the registry of checks that produce them.

A *row* of the claims table is a dict with keys ``id``, ``statement``, ``owner`` ("ours" or
"paper"), ``verdict`` ("holds" or "fails"), ``instances`` (how many instances were
evaluated), ``worst_case`` (a number or a short dict) and ``counterexample`` (the smallest
violating instance found, or None). A *check* is a function ``check(context) -> dict`` with
``rows`` (a list of rows) and optionally ``curves``; one check may give several rows when
they share work (one cvxpy solve serves Thm 2 and our γ* solver, for example).

Checks live in ``checks_exact`` and ``checks_prop4`` (against cvxpy), ``checks_laws``
(exact emitted laws: Thm 1, Thm 3, Γ(δ)), ``checks_budgets`` (our budget guarantees on
those laws), ``checks_closed_form`` (Cor. 5, Cor. 6, the overshoot) and, for multi-draft
(tree) verification, ``checks_trees`` (exact node laws, α*, the frontier) and
``checks_trees_findings`` (the literature's claims, tested). ``checks()`` lists them in the
order the table shows them.

Tolerances (``budget_tolerance``, ``SOLVER_TOLERANCE``...) are stated where used; a "holds"
verdict means no instance exceeded them.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

Array = np.ndarray

OWNERS = ("ours", "paper")

#: |ours − cvxpy| allowed when comparing with interior-point / LP solutions.
SOLVER_TOLERANCE = 1e-6
#: Rounding allowed for identities evaluated in float64 (relative).
ROUNDING = 1e-12


def budget_tolerance(delta: Array | float) -> Array:
    """Float64 slack for "D <= δ" checks on full rows: 1e−12·δ + 1e−15 (rounding only)."""
    return ROUNDING * np.asarray(delta, dtype=np.float64) + 1e-15


@dataclass
class Context:
    """What a check needs: mode, seed, and whether to show progress bars."""

    quick: bool = True
    seed: int = 0
    progress: bool = False

    def rng(self, name: str) -> np.random.Generator:
        """A generator that depends only on (seed, name): checks are order-independent."""
        return np.random.default_rng([self.seed, zlib.crc32(name.encode())])

    def count(self, quick: int, full: int) -> int:
        """How many instances to use in this mode."""
        return quick if self.quick else full

    def bar(self, total: int, desc: str):
        """A tqdm progress bar (disabled unless ``progress``)."""
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, leave=False, disable=not self.progress, unit="inst")


def row(
    claim_id: str,
    statement: str,
    owner: str,
    holds: bool,
    instances: int,
    worst_case: Any,
    counterexample: dict | None = None,
) -> dict:
    """One claims-table row (see the module docstring)."""
    if owner not in OWNERS:
        raise ValueError(f"owner: must be one of {OWNERS}, got {owner!r}")
    return {
        "id": claim_id,
        "statement": statement,
        "owner": owner,
        "verdict": "holds" if holds else "fails",
        "instances": int(instances),
        "worst_case": worst_case,
        "counterexample": None if holds else counterexample,
    }


def instance_dict(target: Array, draft: Array | None = None, **numbers: Any) -> dict:
    """A counterexample as a short dict: the rows as lists plus the numbers that matter."""
    found: dict[str, Any] = {"target": [float(x) for x in np.asarray(target)]}
    if draft is not None:
        found["draft"] = [float(x) for x in np.asarray(draft)]
    found.update({key: _plain(value) for key, value in numbers.items()})
    return found


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [_plain(x) for x in value.tolist()]
    if isinstance(value, (np.floating, float)):
        return float(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    return value


class Worst:
    """Tracks the largest value of a violation measure and the smallest violating instance.

    ``update(values, violated, vocab_size, describe)``: ``values [N]`` (larger is worse),
    ``violated [N]`` bool, ``describe(i) -> dict`` builds the counterexample for row i. The
    kept counterexample has the smallest vocabulary seen so far (then the first found).
    """

    def __init__(self) -> None:
        self.value = -np.inf
        self.count = 0
        self.violations = 0
        self.counterexample: dict | None = None
        self._vocab = np.inf

    def update(
        self,
        values: Array,
        violated: Array,
        vocab_size: int,
        describe: Callable[[int], dict],
    ) -> None:
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        violated = np.asarray(violated, dtype=bool).reshape(-1)
        self.count += values.size
        finite = values[~np.isnan(values)]
        if finite.size:
            self.value = max(self.value, float(finite.max()))
        if np.any(violated):
            self.violations += int(violated.sum())
            if vocab_size < self._vocab:
                self._vocab = vocab_size
                self.counterexample = describe(int(np.flatnonzero(violated)[0]))

    @property
    def holds(self) -> bool:
        return self.violations == 0


def _registry() -> list[tuple[str, Callable[[Context], dict]]]:
    from proofs_check import (
        checks_budgets,
        checks_closed_form,
        checks_exact,
        checks_laws,
        checks_prop4,
        checks_trees,
        checks_trees_findings,
    )

    return [
        ("thm1-law", checks_laws.check_thm1_law),
        ("thm1-coupling", checks_exact.check_thm1_coupling),
        *[
            (f"branch-{name}", checks_exact.branch_check(name))
            for name in checks_exact.BRANCH_DIVERGENCES
        ],
        ("thm3", checks_laws.check_thm3),
        ("gamma", checks_laws.check_gamma),
        ("prop4", checks_prop4.check_prop4),
        ("cor5", checks_closed_form.check_cor5),
        ("cor6", checks_closed_form.check_cor6),
        ("overshoot", checks_closed_form.check_overshoot),
        ("cactus-exact-budget", checks_budgets.check_cactus_exact_budget),
        ("frontier-budget", checks_budgets.check_frontier_budget),
        ("frontier-optimal", checks_exact.check_frontier_optimal),
        ("delta-zero", checks_budgets.check_delta_zero),
        ("trees-lossless", checks_trees.check_lossless),
        ("trees-alpha", checks_trees.check_alpha),
        ("trees-frontier", checks_trees.check_frontier),
        ("trees-kseq", checks_trees_findings.check_kseq_bound),
        ("trees-replacement", checks_trees_findings.check_without_replacement),
        ("trees-sglang-kl", checks_trees_findings.check_sglang_kl),
        ("trees-figure2", checks_trees_findings.check_figure2),
    ]


def checks() -> list[tuple[str, Callable[[Context], dict]]]:
    """(name, check) pairs in table order."""
    return _registry()
