"""Exact acceptance and emitted-law divergence of a rule over a pool (no sampling).

For every row (context) c of a pool, with q = target and p = draft:

- acceptance A_c = Σ_n p_n a_n (``law.acceptance_rows``);
- the emitted law μ_c (``law.output_law_rows``), its KL(μ_c‖q) and TV(μ_c, q);
- the per-branch divergence: max over drafted n with p_n > 0 of KL(h^n‖q) (branch rules:
  the binary KL of (γ_n, q_n) with γ from the whole row; target rules: KL(h‖q); decision
  rules and the general family have none);
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

from cactus_theory import law, rules
from cactus_theory.core import validate
from cactus_theory.core.rules.base import Rule
from cactus_theory.core.stats import exact_stats
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


def row_stats(rule: Rule, pool: PairPool) -> RowStats:
    """Exact per-row acceptance, emitted KL/TV and worst per-branch KL (module docstring)."""
    target, draft = pool.target_probs, pool.draft_probs
    found = exact_stats(rule, target, draft)
    reachable = np.where(target > 0, draft, 0.0).sum(axis=-1)
    return RowStats(found.acceptance, found.kl, found.tv, found.branch_kl, reachable)


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


def match_acceptance(rule: Rule | str, pool: PairPool, goal: float) -> tuple[Rule, float]:
    """The rule (or the rule ``name`` at its defaults) with its declared tunable parameter
    (``rule.tunable``) set so that its mean acceptance over ``pool`` equals ``goal``
    (bracketed root); returns (rule, parameter).

    Mean acceptance is monotone in the declared parameter, so the root is unique up to flat
    stretches; a parameter declared ``log`` is searched on a log1p scale. ValueError when
    the rule declares no tunable parameter, or when ``goal`` is out of its reach on this
    pool.
    """
    chosen = _rule_at_defaults(rule)
    tunable = chosen.tunable
    if tunable is None:
        raise ValueError(f"name: rule {chosen.name!r} declares no tunable parameter (Rule.tunable)")
    target = validate.unit_interval("goal", goal)
    kind = type(chosen.params().get(tunable.parameter, 0.0))

    def with_value(value: float) -> Rule:
        return chosen.with_params(**{tunable.parameter: kind(value)})

    def gap(value: float) -> float:
        rule_here = with_value(value)
        mean = law.acceptance_rows(rule_here, pool.target_probs, pool.draft_probs).mean()
        return (float(mean) - target) * (1.0 if tunable.increasing else -1.0)

    at_low, at_high = gap(tunable.low), gap(tunable.high)
    if at_low > 0 or at_high < 0:
        sign = 1.0 if tunable.increasing else -1.0
        reach = sorted((sign * at_low + target, sign * at_high + target))
        raise ValueError(
            f"goal: acceptance {target:.4f} is outside what {chosen.name} reaches on "
            f"{pool.name} ([{reach[0]:.4f}, {reach[1]:.4f}])"
        )
    if tunable.log:
        # The interesting range is small; search the parameter on a log1p scale.
        low, high = np.log1p(tunable.low), np.log1p(tunable.high)
        value = optimize.brentq(lambda t: gap(np.expm1(t)), low, high, xtol=1e-12, rtol=1e-10)
        value = float(np.expm1(value))
    else:
        value = float(optimize.brentq(gap, tunable.low, tunable.high, xtol=1e-12, rtol=1e-10))
    return with_value(value), value


def _rule_at_defaults(rule: Rule | str) -> Rule:
    if isinstance(rule, Rule):
        return rule
    cls = rules.rule_class(rule)
    try:
        return cls()
    except TypeError:
        # A parameter without a default: the tunable one gets its low end for a start.
        tunable = cls.tunable
        if tunable is None:
            raise ValueError(
                f"name: rule {rule!r} declares no tunable parameter (Rule.tunable)"
            ) from None
        return rules.make(rule, **{tunable.parameter: tunable.low})
