"""Exact acceptance and emitted-law divergence of a rule over a pool (no sampling).

For every row (context) c of a pool, with q = target and p = draft:

- acceptance A_c = Σ_n p_n a_n (``law.acceptance_rows``);
- the emitted law μ_c (``law.output_law_rows``), its KL(μ_c‖q) and TV(μ_c, q);
- the per-branch divergence: max over drafted n with p_n > 0 of KL(h^n‖q) (branch rules:
  the binary KL of (γ_n, q_n); target rules: KL(h‖q); decision rules have none);
- the draft mass on the verifier's support, Σ_{q_x > 0} p_x: no rule with a finite emitted
  KL can accept more (a token with q_x = 0 emitted at all makes KL infinite).

A pool's statistics are the means over its rows (the pool is the source's empirical law).
KL is +inf in a row where the rule can emit a token the verifier gives probability 0 (after
top-k/top-p truncation this happens to interp and top-k); ``kl_infinite`` counts such rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize

from cactus_theory import divergences, law, rules
from cactus_theory.core import validate
from cactus_theory.core.rules.base import BranchRule, Rule, TargetRule, gsps_accept
from sims.pools import PairPool

Array = np.ndarray


@dataclass(frozen=True)
class RowStats:
    """Per-row exact statistics of one rule on one pool."""

    acceptance: Array
    emitted_kl: Array
    emitted_tv: Array
    branch_kl: Array  # NaN for decision rules
    reachable: Array  # Σ_{x: q_x > 0} p_x: the most any finite-KL rule can accept


def position_stats(rule: Rule, target: Array, draft: Array) -> tuple[Array, Array, Array, Array]:
    """(a [R, V], acceptance [R], KL(μ‖q) [R], TV(μ, q) [R]) with one solve per row.

    The same formulas as ``law.acceptance_rows`` (Σ_n p_n a_n) and ``law.output_law_rows``
    (μ), sharing the rule's adjusted target h (target rules) or raised masses γ (branch
    rules) between them instead of solving for them once per quantity.
    """
    if isinstance(rule, TargetRule):
        adjusted = rule.target_law(target, draft)
        accept = gsps_accept(adjusted, draft)
        emitted = law.target_rule_law(adjusted, draft)
    elif isinstance(rule, BranchRule):
        raised = rule.raised_mass(target, cap=draft)
        accept = gsps_accept(raised, draft)
        emitted = law.branch_rule_law(raised, target, draft)
    else:
        accept = rule.accept_probs(target, draft)
        emitted = law.output_law_rows(rule, target, draft)
    emitted = emitted / emitted.sum(axis=-1, keepdims=True)
    return (
        accept,
        (draft * accept).sum(axis=-1),
        divergences.kl_rows(emitted, target),
        divergences.tv_rows(emitted, target),
    )


def row_stats(rule: Rule, pool: PairPool) -> RowStats:
    """Exact per-row acceptance, emitted KL/TV and worst per-branch KL (module docstring)."""
    target, draft = pool.target_probs, pool.draft_probs
    _, acceptance, emitted_kl, emitted_tv = position_stats(rule, target, draft)
    reachable = np.where(target > 0, draft, 0.0).sum(axis=-1)
    return RowStats(acceptance, emitted_kl, emitted_tv, branch_kl(rule, target, draft), reachable)


def branch_kl(rule: Rule, target: Array, draft: Array) -> Array:
    """max over drafted n (p_n > 0) of KL(h^n‖q), per row; NaN for decision rules."""
    if isinstance(rule, BranchRule):
        drafted = draft > 0
        raised = np.zeros_like(target)
        raised[drafted] = rule.raised_mass(target[drafted])
        per_branch = divergences.binary("kl", raised, target)
        return np.max(np.where(drafted, per_branch, -np.inf), axis=-1)
    if isinstance(rule, TargetRule):
        return divergences.kl_rows(rule.target_law(target, draft), target)
    return np.full(target.shape[0], np.nan)


def summary(stats: RowStats) -> dict[str, float]:
    """Pool means (and worst cases) of ``row_stats``."""
    finite = np.isfinite(stats.emitted_kl)
    return {
        "acceptance": float(stats.acceptance.mean()),
        "emitted_kl": float(stats.emitted_kl.mean()),
        "emitted_kl_finite_mean": float(stats.emitted_kl[finite].mean())
        if finite.any()
        else np.nan,
        "emitted_kl_max": float(stats.emitted_kl.max()),
        "kl_infinite": float((~finite).mean()),
        "emitted_tv": float(stats.emitted_tv.mean()),
        "branch_kl_mean": float(np.mean(stats.branch_kl)),
        "branch_kl_max": float(np.max(stats.branch_kl)),
        "draft_in_support": float(stats.reachable.mean()),
    }


#: The parameter each tunable rule is calibrated by, and its search interval.
TUNABLE = {
    "cactus": ("delta", 0.0, 1e4),
    "cactus-exact": ("delta", 0.0, 1e4),
    "frontier": ("delta", 0.0, 1e4),
    "interp": ("alpha", 0.0, 1.0),
    "pareto": ("spread", 0.0, 700.0),
}


def rule_with(name: str, value: float) -> Rule:
    """The rule ``name`` with its tunable parameter set to ``value``."""
    key = TUNABLE[name][0]
    return rules.parse(f"{name}:{key}={float(value)!r}")


def match_acceptance(name: str, pool: PairPool, goal: float) -> tuple[Rule, float]:
    """The rule ``name`` whose mean acceptance over ``pool`` equals ``goal`` (bracketed root).

    Mean acceptance is non-decreasing in each rule's parameter, so the root is unique up to
    flat stretches; returns (rule, parameter). Raises ValueError when ``goal`` is out of the
    rule's reach on this pool.
    """
    if name not in TUNABLE:
        raise ValueError(f"name: {name!r} has no tunable parameter; choose one of {list(TUNABLE)}")
    target = validate.unit_interval("goal", goal)
    _, low, high = TUNABLE[name]

    def gap(value: float) -> float:
        rule = rule_with(name, value)
        return float(law.acceptance_rows(rule, pool.target_probs, pool.draft_probs).mean()) - target

    at_low, at_high = gap(low), gap(high)
    if at_low > 0 or at_high < 0:
        raise ValueError(
            f"goal: acceptance {target:.4f} is outside what {name} reaches on {pool.name} "
            f"([{at_low + target:.4f}, {at_high + target:.4f}])"
        )
    if name in ("cactus", "cactus-exact", "frontier", "pareto"):
        # The interesting range is small; search the parameter on a log scale above 1e-9.
        value = optimize.brentq(
            lambda t: gap(np.expm1(t)), 0.0, float(np.log1p(high)), xtol=1e-12, rtol=1e-10
        )
        value = float(np.expm1(value))
    else:
        value = float(optimize.brentq(gap, low, high, xtol=1e-12, rtol=1e-10))
    return rule_with(name, value), value
