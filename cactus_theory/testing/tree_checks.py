"""``check_tree_rule``: the kit's checks for a tree (multi-draft) rule, on the same machinery
as the chain rules' (``search``: searched properties, reports, chi-square).

Each check draws nodes (``nodes``: a (q, p) pair from ``strategies.pairs``, V <= 8, a
scheme the rule declares, K <= 3 children) and holds the rule to:

============================  =============================================================
check                         what must hold
============================  =============================================================
node-law-is-a-distribution    the enumerated node law is finite, >= 0, sums to 1; every
                              a_i in [0, 1]; the final residual is a law where reached
closed-forms-equal-enumerated the rule's closed forms (``closed_form_law``, ``..._acceptance``)
                              and the batched deterministic rows equal the enumeration
support-only                  (declared) zeros inserted where p = q = 0 change nothing
lossless                      (declared: ``lossless`` or ``lossless_at``) the law is q
tunable-monotone              (declared) mean acceptance is monotone in the parameter
max-kl / max-tv               (asked) KL / TV of the node law within the budget
array-api-equals-numpy        (declared ``array_api``) torch float64 tensors give the same
                              acceptances and residual as numpy (1e-12)
sampler-law-chi-square        the numpy node sampler (children drafted, one uniform per
                              node, inverse CDF) against the exact law: 3 nodes x 12,000
                              draws, chi-square at level 1e-3 in all (Bonferroni)
============================  =============================================================

A rule not declaring a property is skipped for it, saying so. Tolerances: 1e-9 absolute on
probabilities (``search.ATOL``), as for chain rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cactus_theory.core import divergences, trees
from cactus_theory.core.trees import TreeRule
from cactus_theory.testing.search import (
    SKIPPED,
    CheckResult,
    Report,
    chi_square_check,
    close,
    property_check,
    run_checks,
)

#: Largest vocabulary, children and draws per node of the tree checks.
MAX_VOCAB, MAX_WIDTH = 8, 3
SAMPLES, CHI_SQUARE_NODES, LEVEL = 12_000, 3, 1e-3


def nodes(strategies, schemes: tuple[str, ...]):
    """A hypothesis strategy of ``trees.Node`` for the ``schemes`` given (module docstring)."""
    from hypothesis import strategies as st

    @st.composite
    def node(draw):
        target, draft = draw(strategies.pairs(2, MAX_VOCAB))
        scheme = draw(st.sampled_from(schemes))
        width = draw(st.integers(1, MAX_WIDTH))
        support = int(np.count_nonzero(draft))
        if scheme == trees.DETERMINISTIC:
            order = draw(st.permutations(range(target.size)))
            return trees.Node(target=target, draft=draft, children=list(order[:width]))
        if scheme == trees.HUB:
            if support < 2:
                draft = np.full(target.size, 1.0 / target.size)
            return trees.Node(target=target, draft=draft, k=2, scheme=trees.HUB)
        if scheme == trees.WITHOUT_REPLACEMENT:
            width = min(width, support)
        return trees.Node(target=target, draft=draft, k=width, scheme=scheme)

    return node()


def _law_problem(rule: TreeRule, node: trees.Node) -> str | None:
    exact = trees.enumerate_node(rule, node)
    if not np.all(np.isfinite(exact.law)) or exact.law.min() < -1e-9:
        return f"the node law is not finite and >= 0 (min {exact.law.min():.3g})"
    if abs(exact.law.sum() - 1.0) > 1e-9:
        return f"the node law sums to {exact.law.sum():.12g}"
    tuples, _ = trees.tuple_law(node)
    shape = (tuples.shape[0], node.vocab_size)
    rows = trees.proposals(np.broadcast_to(node.draft, shape), tuples, node.scheme)
    target = np.broadcast_to(node.target, shape)
    accepts = np.asarray(rule.sibling_accepts(target, rows, tuples))
    if accepts.shape != tuples.shape or np.any((accepts < -1e-12) | (accepts > 1 + 1e-12)):
        return f"sibling acceptances outside [0, 1] or of shape {accepts.shape}"
    reached = trees.end_probs(accepts)[:, -1] > 0
    residual = np.broadcast_to(np.asarray(rule.final_residual(target, rows, tuples)), shape)
    sums = residual[reached].sum(axis=-1)
    if reached.any() and (np.any(residual[reached] < -1e-12) or np.any(np.abs(sums - 1) > 1e-9)):
        return "a final residual that rejection reaches is not a law"
    return None


def node_law_is_a_distribution(rule, strategies, examples, seed) -> CheckResult:
    return property_check(
        "node-law-is-a-distribution",
        nodes(strategies, rule.schemes),
        lambda node: _law_problem(rule, node),
        ("node",),
        "finite, >= 0, sums to 1; a_i in [0, 1]; residuals are laws",
        examples,
        seed,
    )


def closed_forms_equal_enumerated(rule, strategies, examples, seed) -> CheckResult:
    def problem(node):
        exact = trees.enumerate_node(rule, node)
        if node.scheme == trees.DETERMINISTIC:
            rows_law, rows_accepted = trees.node_law_rows(
                rule, node.target[None], node.draft[None], np.asarray([node.children])
            )
            wrong = close(rows_law[0], exact.law, "batched rows and enumerated laws")
            wrong = wrong or close(rows_accepted[0], exact.acceptance, "acceptances")
            if wrong:
                return wrong
        law, acceptance = trees.closed_form(rule, node.target, node.draft, node.k, node.scheme)
        if law is not None and (wrong := close(law, exact.law, "closed-form and enumerated laws")):
            return wrong
        if acceptance is not None:
            return close(acceptance, exact.acceptance, "closed-form and enumerated acceptances")
        return None

    return property_check(
        "closed-forms-equal-enumerated",
        nodes(strategies, rule.schemes),
        problem,
        ("node",),
        "closed forms and batched rows = enumeration over drafted tuples",
        examples,
        seed,
    )


def support_only(rule, strategies, examples, seed) -> CheckResult:
    name = "support-only"
    if not getattr(rule, "support_only", False):
        return CheckResult(name, SKIPPED, "the rule does not declare support_only")
    from hypothesis import strategies as st

    @st.composite
    def padded(draw):
        node = draw(nodes(strategies, rule.schemes))
        extra = draw(st.integers(1, 3))
        where = np.sort(
            draw(st.lists(st.integers(0, node.vocab_size), min_size=extra, max_size=extra))
        )
        return node, where

    def problem(example):
        node, where = example
        target, draft = np.insert(node.target, where, 0.0), np.insert(node.draft, where, 0.0)
        keep = np.flatnonzero(np.insert(np.ones(node.vocab_size), where, 0.0) > 0)
        if node.scheme == trees.DETERMINISTIC:
            bigger = trees.Node(
                target=target, draft=draft, children=[int(keep[c]) for c in node.children]
            )
        else:
            bigger = trees.Node(target=target, draft=draft, k=node.k, scheme=node.scheme)
        exact = _unpacked(rule, bigger)
        return close(exact[keep], trees.enumerate_node(rule, node).law, "padded and plain laws")

    return property_check(
        name,
        padded(),
        problem,
        ("node", "zeros_at"),
        "zeros where p = q = 0 change nothing",
        examples,
        seed,
    )


def _unpacked(rule: TreeRule, node: trees.Node) -> np.ndarray:
    """The node law enumerated on the full rows (the engine packs support-only rules)."""
    plain = type(f"Unpacked{type(rule).__name__}", (type(rule),), {"support_only": False})
    twin = object.__new__(plain)
    twin.__dict__.update(rule.__dict__)
    return trees.enumerate_node(twin, node).law


def lossless(rule, strategies, examples, seed) -> CheckResult:
    name = "lossless"
    at = getattr(rule, "lossless_at", None)
    if not getattr(rule, "lossless", False) and at is None:
        return CheckResult(name, SKIPPED, "the rule declares neither lossless nor lossless_at")
    subject = rule if getattr(rule, "lossless", False) else rule.with_params(**at)
    return property_check(
        name,
        nodes(strategies, subject.schemes),
        lambda node: close(trees.node_law(subject, node), node.target, "node law and q"),
        ("node",),
        f"{trees.spec_of(subject)} emits q",
        examples,
        seed,
    )


def tunable_monotone(rule, strategies, examples, seed) -> CheckResult:
    name = "tunable-monotone"
    tunable = getattr(rule, "tunable", None)
    if tunable is None:
        return CheckResult(name, SKIPPED, "the rule does not declare tunable")
    low, high = tunable.low, min(tunable.high, 10.0)
    values = np.geomspace(max(low, 1e-3), high, 5) if tunable.log else np.linspace(low, high, 5)
    from hypothesis import strategies as st

    def problem(pool):
        means = [
            np.mean(
                [trees.node_acceptance(rule.with_params(**{tunable.parameter: v}), n) for n in pool]
            )
            for v in values
        ]
        steps = np.diff(means) if tunable.increasing else -np.diff(means)
        if np.any(steps < -1e-9):
            return f"mean acceptance not monotone in {tunable.parameter}: {np.round(means, 6)}"
        return None

    pools = st.lists(nodes(strategies, rule.schemes), min_size=2, max_size=4)
    return property_check(
        name,
        pools,
        problem,
        ("nodes",),
        f"monotone in {tunable.parameter}",
        max(1, examples // 6),
        seed,
    )


def budget(rule, strategies, examples, seed, divergence: str, bound: float) -> CheckResult:
    def problem(node):
        law = trees.node_law(rule, node)
        spent = float(divergences.rows(divergence, law / law.sum(), node.target))
        if not spent <= bound * (1 + 1e-12) + 1e-15:
            return f"{divergence} of the node law is {spent:.6g} > {bound:g}"
        return None

    return property_check(
        f"max-{divergence}",
        nodes(strategies, rule.schemes),
        problem,
        ("node",),
        f"{divergence} <= {bound:g}",
        examples,
        seed,
    )


def array_api_equals_numpy(rule, strategies, examples, seed) -> CheckResult:
    name = "array-api-equals-numpy"
    if not getattr(rule, "array_api", False):
        return CheckResult(name, SKIPPED, "the rule does not declare array_api")
    try:
        import torch
    except ImportError:
        return CheckResult(name, SKIPPED, "torch is not installed")

    def problem(node):
        tuples, _ = trees.tuple_law(node)
        shape = (tuples.shape[0], node.vocab_size)
        target = np.ascontiguousarray(np.broadcast_to(node.target, shape))
        rows = np.ascontiguousarray(
            trees.proposals(np.broadcast_to(node.draft, shape), tuples, node.scheme)
        )
        tensors = [torch.as_tensor(np.array(a)) for a in (target, rows, tuples)]
        for method in ("sibling_accepts", "final_residual"):
            ours = np.broadcast_to(
                np.asarray(getattr(rule, method)(target, rows, tuples)),
                shape if method == "final_residual" else tuples.shape,
            )
            theirs = getattr(rule, method)(*tensors).cpu().numpy()
            if wrong := close(
                np.broadcast_to(theirs, ours.shape), ours, f"torch and numpy {method}"
            ):
                return wrong
        return None

    return property_check(
        name,
        nodes(strategies, rule.schemes),
        problem,
        ("node",),
        "torch float64 = numpy",
        max(1, examples // 2),
        seed,
    )


def sampler_law(rule, strategies, examples, seed) -> CheckResult:
    """The numpy node sampler's emitted token against the exact node law."""
    generator = np.random.default_rng(seed)
    cases = []
    for index in range(CHI_SQUARE_NODES):
        scheme = rule.schemes[index % len(rule.schemes)]
        size = (4, 6, 8)[index % 3]
        target = generator.dirichlet(np.full(size, (0.3, 1.0, 0.5)[index % 3]))
        draft = generator.dirichlet(np.full(size, 0.7))
        if scheme == trees.DETERMINISTIC:
            node = trees.Node(
                target=target,
                draft=draft,
                children=[int(c) for c in generator.permutation(size)[:2]],
            )
        else:
            node = trees.Node(target=target, draft=draft, k=2, scheme=scheme)

        def sample(node=node, index=index):
            draws = trees.sample_node(rule, node, SAMPLES, seed=seed + index)
            return np.bincount(draws.token, minlength=node.vocab_size), trees.node_law(rule, node)

        cases.append(({"target": target, "draft": draft, "scheme": scheme}, sample))
    return chi_square_check(
        "sampler-law-chi-square",
        cases,
        LEVEL,
        f"{len(cases)} nodes x {SAMPLES:,} draws, chi-square level {LEVEL:g}",
    )


BY_NAME = {
    "node-law-is-a-distribution": node_law_is_a_distribution,
    "closed-forms-equal-enumerated": closed_forms_equal_enumerated,
    "support-only": support_only,
    "lossless": lossless,
    "tunable-monotone": tunable_monotone,
    "array-api-equals-numpy": array_api_equals_numpy,
    "sampler-law-chi-square": sampler_law,
}
#: Every tree check, in the order ``check_tree_rule`` runs them.
TREE_CHECKS = (*BY_NAME, "max-kl", "max-tv")


@dataclass
class TreeRuleReport(Report):
    """What ``check_tree_rule`` found (``passed``, ``failures``, a readable table)."""

    rule: TreeRule
    results: list[CheckResult] = field(default_factory=list)

    @property
    def heading(self) -> str:
        return f"check_rule({trees.spec_of(self.rule)})"


def check_tree_rule(
    rule: TreeRule,
    *,
    max_kl: float | None,
    max_tv: float | None,
    examples: int,
    seed: int,
    only: Iterable[str] | None,
) -> TreeRuleReport:
    """Every tree check of ``rule`` (module docstring); arguments as ``check_rule``'s,
    validated there."""
    from cactus_theory.testing import strategies

    chosen = list(TREE_CHECKS if only is None else only)
    unknown = [name for name in chosen if name not in TREE_CHECKS]
    if unknown:
        raise ValueError(f"only: unknown tree check {unknown[0]!r}; choose from {TREE_CHECKS}")

    def one(name: str) -> CheckResult:
        if name in BY_NAME:
            return BY_NAME[name](rule, strategies, examples, seed)
        bound: Any = max_kl if name == "max-kl" else max_tv
        if bound is None:
            return CheckResult(name, SKIPPED, "no budget asked for")
        return budget(rule, strategies, examples, seed, name[4:], bound)

    return run_checks(TreeRuleReport(rule), chosen, one)
