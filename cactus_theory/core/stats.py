"""Exact per-position statistics of a rule on rows of (q, p): acceptance, the emitted law's
KL and TV to the verifier, and the worst per-branch KL.

For each row (context) c, with q = target and p = draft:

- acceptance A_c = Σ_n p_n a_n (``law.acceptance_rows``);
- the emitted law μ_c (``law.output_law_rows``), KL(μ_c‖q_c) and TV(μ_c, q_c);
- the per-branch divergence max over drafted n (p_n > 0) of KL(h^n‖q): branch rules give
  the binary KL of (γ_n, q_n), γ from the whole row; target rules KL(h‖q); decision rules
  and the general family have no per-branch target h (NaN).

Rows must be whole (over the vocabulary) for a rule that does not declare
``support_only``; callers holding rows packed to their support widen them first
(``real.pools.RealPool.rows(full=True)``). The toy simulations (``sims.tradeoff``) and the
real pools (``real.tradeoff``) both compute their statistics here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cactus_theory.core import divergences, law
from cactus_theory.core.rules.base import Rule, exact_family, gsps_accept

Array = np.ndarray


@dataclass(frozen=True)
class PositionStats:
    """Per-row exact statistics of one rule (module docstring): ``accept`` [R, V] the
    acceptance probabilities a_n, ``acceptance`` [R], ``kl`` and ``tv`` [R] of the emitted
    law to q, ``branch_kl`` [R] the worst per-branch KL (NaN without a per-branch target)."""

    accept: Array
    acceptance: Array
    kl: Array
    tv: Array
    branch_kl: Array


def exact_stats(rule: Rule, target: Array, draft: Array) -> PositionStats:
    """Every per-row statistic with one solve per row.

    The same formulas as ``law.acceptance_rows`` (Σ_n p_n a_n) and ``law.output_law_rows``
    (μ), sharing the rule's adjusted target h (target rules) or raised masses γ (branch
    rules) between them and the branch KL instead of solving for them once per quantity:
    a branch rule's γ is solved uncapped once, and the capped min(γ_n, p_n) its
    acceptance and law read is taken from it (``BranchRule.raised_masses``' contract).
    Any other rule (``rules.exact_family``) goes through those two functions as they are.
    """
    family = exact_family(rule)
    no_branch = np.full(target.shape[0], np.nan)
    if family == "target":
        adjusted = rule.target_law(target, draft)
        accept = gsps_accept(adjusted, draft)
        emitted = law.target_rule_law(adjusted, draft)
        worst_branch = divergences.kl_rows(adjusted, target)  # KL(h‖q), one h per row
    elif family == "branch":
        raised = rule.raised_masses(target, draft)  # γ_n, uncapped
        capped = np.minimum(raised, draft)  # min(γ_n, p_n)
        accept = gsps_accept(capped, draft)
        emitted = law.branch_rule_law(capped, target, draft)
        per_branch = divergences.binary("kl", raised, target)  # KL(h^n‖q) = kl(γ_n, q_n)
        worst_branch = np.max(np.where(draft > 0, per_branch, -np.inf), axis=-1)
    else:
        accept = rule.accept_probs(target, draft)
        emitted = law.output_law_rows(rule, target, draft)
        worst_branch = no_branch
    emitted = emitted / emitted.sum(axis=-1, keepdims=True)
    return PositionStats(
        accept=accept,
        acceptance=(draft * accept).sum(axis=-1),
        kl=divergences.kl_rows(emitted, target),
        tv=divergences.tv_rows(emitted, target),
        branch_kl=worst_branch,
    )


def position_stats(rule: Rule, target: Array, draft: Array) -> tuple[Array, Array, Array, Array]:
    """(a [R, V], acceptance [R], KL(μ‖q) [R], TV(μ, q) [R]): ``exact_stats`` without the
    branch KL."""
    found = exact_stats(rule, target, draft)
    return found.accept, found.acceptance, found.kl, found.tv


def branch_kl(rule: Rule, target: Array, draft: Array) -> Array:
    """max over drafted n (p_n > 0) of KL(h^n‖q), per row; NaN for decision rules and the
    general family (no per-branch target h)."""
    family = exact_family(rule)
    if family == "branch":
        drafted = draft > 0
        per_branch = divergences.binary("kl", rule.raised_masses(target, draft), target)
        return np.max(np.where(drafted, per_branch, -np.inf), axis=-1)
    if family == "target":
        return divergences.kl_rows(rule.target_law(target, draft), target)
    return np.full(target.shape[0], np.nan)
