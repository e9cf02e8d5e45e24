"""A property-test kit for acceptance rules, built-in or your own.

One line checks a rule::

    from cactus_theory.testing import check_rule

    def test_my_rule():
        check_rule(MyRule(delta=1.0)).assert_passed()

``check_rule(rule, *, max_kl=None, max_tv=None, examples=60, seed=0, device="cpu")``
returns a ``RuleReport`` (``.passed``, ``.failures`` with shrunk counterexamples, a readable
``str``); ``checks`` lists every property. To get one pytest item per check::

    from cactus_theory.testing import parametrize_with_rule_checks

    @parametrize_with_rule_checks([MyRule(delta=1.0)])
    def test_my_rule(rule, check):
        check(rule)

A tree (multi-draft) rule is checked the same way, ``check_rule(trees.make("walk"))`` or
``check_rule("cactus-tree:delta=1")``: its node law by enumeration over the drafted tuples
against its closed forms and batched rows, what it declares (``lossless``,
``support_only``, ``tunable``, ``array_api``), budgets, and the numpy node sampler by
chi-square (``tree_checks``; ``TREE_CHECKS`` lists them).

``strategies`` holds the hypothesis strategies the checks draw from (rows with zeros, ties,
one-hot and near-one-hot rows, masses near 1e-300, disjoint supports, processed rows,
vocabularies up to 10^5, budgets), for your own properties. The command line does the same:
``cactus check --rule SPEC [--rules-module MODULE]``.

**Engines.** ``conform(verify_fn, rule="sps", ...)`` checks an engine's verify step (any
function ``verify_fn(target_probs, draft_probs, draft_ids, generator, uniforms=None) ->
(token_ids, num_accepted)``, or an ``Adapter``) against the exact law of the rule it claims
and returns a ``ConformReport``; it lives in ``cactus_theory.testing.conformance``
(imported on first use: it needs torch) and on the command line in ``cactus conform``.

hypothesis is an optional dependency: ``pip install "cactus-theory[testing]"``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from cactus_theory.testing.checks import (
    CHECKS,
    FAILED,
    SKIPPED,
    CheckResult,
    RuleReport,
    check_rule,
    parse_any,
)
from cactus_theory.testing.tree_checks import TREE_CHECKS, TreeRuleReport


class RuleCheck:
    """One named check as a pytest item calls it: ``check(rule)`` fails the test with the
    counterexample, or skips it when the rule does not declare what it needs."""

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        self.name = name
        self.options = options

    def __call__(self, rule: object) -> CheckResult:
        report = check_rule(rule, only=[self.name], **self.options)  # type: ignore[arg-type]
        result = report.results[0]
        if result.status == SKIPPED:
            import pytest

            pytest.skip(result.detail)
        if result.status == FAILED:
            raise AssertionError(str(report))
        return result

    def __repr__(self) -> str:
        return self.name


def parametrize_with_rule_checks(
    rules: Sequence[object], checks: Iterable[str] = CHECKS, **options
):
    """``pytest.mark.parametrize("rule, check", ...)`` over every (rule, check): one item
    per check, named ``SPEC-CHECK`` (``pytest -k`` selects them). ``options`` are
    ``check_rule``'s keywords (``max_kl``, ``max_tv``, ``examples``, ``seed``, ``device``)."""
    import pytest

    from cactus_theory.core import rules as rule_registry
    from cactus_theory.core import trees

    chosen = list(checks)
    known = (*CHECKS, *TREE_CHECKS)
    unknown = [name for name in chosen if name not in known]
    if unknown:
        raise ValueError(f"checks: unknown check {unknown[0]!r}; choose from {known}")
    parsed = [parse_any(rule) if isinstance(rule, str) else rule for rule in rules]
    items = [
        (rule, RuleCheck(name, options))
        for rule in parsed
        for name in chosen
        if name in (TREE_CHECKS if isinstance(rule, trees.TreeRule) else CHECKS)
    ]
    spec = {True: trees.spec_of, False: rule_registry.spec_of}
    ids = [f"{spec[isinstance(rule, trees.TreeRule)](rule)}-{check.name}" for rule, check in items]
    return pytest.mark.parametrize("rule, check", items, ids=ids)


#: Names served lazily from ``cactus_theory.testing.conformance`` (it imports torch).
_CONFORMANCE = ("Adapter", "ConformReport", "conform")


def __getattr__(name: str) -> Any:
    if name in _CONFORMANCE:
        from cactus_theory.testing import conformance

        return getattr(conformance, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CHECKS",
    "TREE_CHECKS",
    "Adapter",
    "CheckResult",
    "ConformReport",
    "RuleCheck",
    "RuleReport",
    "TreeRuleReport",
    "check_rule",
    "conform",
    "parametrize_with_rule_checks",
    "parse_any",
]
