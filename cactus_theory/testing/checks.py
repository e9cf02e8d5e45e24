"""``check_rule``: every property a rule must have, searched by hypothesis, with shrunk
counterexamples.

Each check is a property of the rule searched over drawn inputs with ``hypothesis.find``
(``examples`` draws, seeded, shrunk on failure), or a statistical test at a stated level.
Which checks run follows what the rule declares (``rules.base``): a property the rule does
not declare is skipped, and says so.

============================  =============================================================
check                         what must hold (q = target, p = draft, n = drafted token)
============================  =============================================================
law-is-a-distribution         ``law.output_law`` is finite, >= 0 and sums to 1
acceptance-in-unit-interval   0 <= a_n <= 1 for every n, and a_n = 0 where p_n = 0
residuals-are-laws            every r^n a rejection can reach is a law: finite, >= 0,
                              sums to 1 within 1e-9 (``core.rules.contract``)
fast-law-equals-enumerated    the closed form (or batched sum) equals the per-token sum
                              Σ_n p_n [a_n e_n + (1 − a_n) r^n], small and large V
support-only                  (declared) zeros inserted where p = q = 0 change no law
gamma-from-mass               (declared, branch rules) γ of a whole row = γ of each q_n
lossless-at                   (declared) at those parameters the emitted law is q
greedy-consistent             (declared) with a one-hot q the emitted law is q
tunable-monotone              (declared) mean acceptance is monotone in the parameter
max-kl / max-tv               (asked) KL / TV of the emitted law within the budget
torch-decisions-equal-numpy   ``sampler.verify`` = ``core.verify.verify_block`` token for
                              token on float64 rows and shared uniforms (near-ties within
                              1e-9 of a_n excused)
torch-law-equals-numpy        the torch law and the meter's KL equal numpy's (1e-9)
sampler-law-chi-square        the sampler's emitted token, 12,000 draws per pair on 3
                              pairs, against the exact law: chi-square, level 1e-3 in all
============================  =============================================================

A tree (multi-draft) rule, or a spec naming one, gets the tree checks instead
(``tree_checks``: its node law by enumeration over drafted tuples against its closed
forms, its declarations, and the numpy node sampler by chi-square).

The torch checks run when torch is installed (else they are skipped, saying why), on
``device``. Tolerances are absolute on probabilities (1e-9) and relative on divergences.
A check that raises is a failed result saying what was raised; the report is never lost.

Where things live: ``search`` (results, reports, the hypothesis search, closeness, the
chi-square test: what any kit of checks shares), ``law_checks`` (the numpy checks),
``torch_checks`` (the torch checks); this module holds the table and ``check_rule``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cactus_theory.core import rules, trees
from cactus_theory.core.rules.base import Rule
from cactus_theory.core.trees import TreeRule
from cactus_theory.testing import law_checks, torch_checks, tree_checks
from cactus_theory.testing.law_checks import LARGE_FRACTION
from cactus_theory.testing.search import (
    ATOL,
    FAILED,
    PASSED,
    SKIPPED,
    CheckResult,
    Report,
    chi_square_pvalue,
    run_checks,
)
from cactus_theory.testing.torch_checks import (
    CHI_SQUARE_PAIRS,
    LEVEL,
    NEAR_TIE,
    SAMPLES,
    sampled_first_tokens,
)

#: Every check, in the order ``check_rule`` runs them.
CHECKS = (
    *law_checks.BY_NAME,
    "max-kl",
    "max-tv",
    "torch-decisions-equal-numpy",
    "torch-law-equals-numpy",
    "sampler-law-chi-square",
)


@dataclass
class RuleReport(Report):
    """What ``check_rule`` found: ``passed`` (no check failed), ``failures``, every result,
    and a readable table (``str(report)``)."""

    rule: Rule
    results: list[CheckResult] = field(default_factory=list)

    @property
    def heading(self) -> str:
        return f"check_rule({rules.spec_of(self.rule)})"


def _one(name: str, rule: Rule, strategies, options: dict[str, Any]) -> CheckResult:
    examples, seed, device = options["examples"], options["seed"], options["device"]
    if name in law_checks.BY_NAME:
        return law_checks.BY_NAME[name](rule, strategies, examples, seed)
    if name in ("max-kl", "max-tv"):
        bound = options["max_kl" if name == "max-kl" else "max_tv"]
        if bound is None:
            return CheckResult(name, SKIPPED, "no budget asked for")
        return law_checks.budget(rule, strategies, examples, seed, name[4:], bound)
    if name == "torch-decisions-equal-numpy":
        return torch_checks.torch_decisions_equal_numpy(rule, strategies, examples, seed, device)
    if name == "torch-law-equals-numpy":
        return torch_checks.torch_law_equals_numpy(rule, strategies, examples, seed, device)
    return torch_checks.sampler_law(rule, strategies, seed, device)


def _checked_options(
    rule: object,
    max_kl: float | None,
    max_tv: float | None,
    examples: int,
    seed: int,
    device: str,
    only: Iterable[str] | None,
) -> tuple[Rule | TreeRule, list[str]]:
    if isinstance(rule, str):
        rule = parse_any(rule)
    if not isinstance(rule, Rule | TreeRule):
        raise ValueError(
            f"rule: expected a rules.Rule, a trees.TreeRule or a spec string, "
            f"got {type(rule).__name__}"
        )
    for key, bound in (("max_kl", max_kl), ("max_tv", max_tv)):
        if bound is not None and (
            isinstance(bound, bool) or not isinstance(bound, int | float) or not bound >= 0
        ):
            raise ValueError(f"{key}: must be a number >= 0, got {bound!r}")
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
        raise ValueError(f"examples: must be an integer >= 1, got {examples!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: must be an integer, got {seed!r}")
    if not isinstance(device, str) or device.split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device: expected 'cpu' or 'cuda[:N]', got {device!r}")
    known = tree_checks.TREE_CHECKS if isinstance(rule, TreeRule) else CHECKS
    chosen = list(known if only is None else only)
    unknown = [name for name in chosen if name not in known]
    if unknown:
        raise ValueError(f"only: unknown check {unknown[0]!r}; choose from {known}")
    return rule, chosen


def parse_any(spec: str) -> Rule | TreeRule:
    """The chain rule or the tree rule a spec names (the two kinds' names never clash)."""
    name = spec.partition(":")[0].strip() if isinstance(spec, str) else spec
    if isinstance(name, str) and name not in rules.names() and name in trees.names():
        return trees.parse(spec)
    return rules.parse(spec)


def check_rule(
    rule: Rule | TreeRule | str,
    *,
    max_kl: float | None = None,
    max_tv: float | None = None,
    examples: int = 60,
    seed: int = 0,
    device: str = "cpu",
    only: Iterable[str] | None = None,
) -> RuleReport | tree_checks.TreeRuleReport:
    """Check every property of ``rule`` (a ``rules.Rule``, a ``trees.TreeRule`` or a spec;
    module docstring).

    ``max_kl`` / ``max_tv``: budgets the emitted law must keep (nats / total variation),
    checked when given. ``examples``: hypothesis draws per property. ``seed``: fixes every
    draw. ``device``: where the torch checks run. ``only``: a subset of ``CHECKS``.
    Returns a ``RuleReport``; a failing property is a failed result with its shrunk
    counterexample, never an exception. Bad arguments are a ValueError naming them.
    """
    rule, chosen = _checked_options(rule, max_kl, max_tv, examples, seed, device, only)
    if isinstance(rule, TreeRule):
        return tree_checks.check_tree_rule(
            rule, max_kl=max_kl, max_tv=max_tv, examples=examples, seed=seed, only=chosen
        )
    from cactus_theory.testing import strategies

    options = {"max_kl": max_kl, "max_tv": max_tv, "examples": examples, "seed": seed}
    options["device"] = device
    return run_checks(RuleReport(rule), chosen, lambda name: _one(name, rule, strategies, options))


__all__ = [
    "ATOL",
    "CHECKS",
    "CHI_SQUARE_PAIRS",
    "FAILED",
    "LARGE_FRACTION",
    "LEVEL",
    "NEAR_TIE",
    "PASSED",
    "SAMPLES",
    "SKIPPED",
    "CheckResult",
    "RuleReport",
    "check_rule",
    "chi_square_pvalue",
    "parse_any",
    "sampled_first_tokens",
]
