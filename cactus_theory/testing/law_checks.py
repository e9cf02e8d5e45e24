"""The exact-law checks of a chain rule (numpy, float64): properties of
``law.output_law``, the acceptances and residuals, and what the rule declares.

Each is a searched property (``search.property_check``) over pairs (q = target, p = draft)
drawn from ``strategies``, with n the drafted token:

- ``law-is-a-distribution``: the emitted law is finite, >= 0, sums to 1 (within ATOL);
- ``acceptance-in-unit-interval``: 0 <= a_n <= 1, and a_n = 0 where p_n = 0;
- ``residuals-are-laws``: every r^n a rejection can reach is a law (finite, >= 0, sums
  to 1 within 1e-9: ``core.rules.contract``);
- ``fast-law-equals-enumerated``: the rule's closed form (or batched sum) equals
  Σ_n p_n [a_n e_n + (1 − a_n) r^n], on V <= 64 and on V up to 10^5;
- ``support-only`` / ``gamma-from-mass`` / ``lossless-at`` / ``greedy-consistent`` /
  ``tunable-monotone``: what the rule declares (skipped, saying so, when it does not);
- ``max-kl`` / ``max-tv``: D(emitted law, q) <= the budget asked for.

Every function takes (rule, strategies, examples, seed) and returns a ``CheckResult``.
"""

from __future__ import annotations

import numpy as np

from cactus_theory.core import divergences, law, rules
from cactus_theory.core.rules import contract
from cactus_theory.core.rules.base import Rule, exact_family
from cactus_theory.testing.search import (
    ATOL,
    FAILED,
    SKIPPED,
    CheckResult,
    close,
    property_check,
)

#: One draw in this many of ``examples`` goes to vocabularies up to 10^5.
LARGE_FRACTION = 12


def law_is_a_distribution(rule: Rule, strategies, examples: int, seed: int) -> CheckResult:
    def problem(pair):
        emitted = law.output_law(rule, *pair)
        if not np.all(np.isfinite(emitted)):
            return "the law has NaN or inf entries"
        if emitted.min() < -ATOL:
            return f"the law has a negative entry {emitted.min():.3g}"
        if abs(emitted.sum() - 1.0) > ATOL:
            return f"the law sums to {emitted.sum():.12g}"
        return None

    drawn = strategies.everyday_pairs()
    return property_check(
        "law-is-a-distribution",
        drawn,
        problem,
        ("target", "draft"),
        "finite, >= 0, sums to 1",
        examples,
        seed,
    )


def acceptance_in_unit_interval(rule: Rule, strategies, examples: int, seed: int):
    def problem(pair):
        target, draft = pair
        accept = np.asarray(rule.accept_probs(target, draft), dtype=np.float64)
        if accept.shape != target.shape:
            return f"accept_probs has shape {accept.shape}, expected {target.shape}"
        if not np.all(np.isfinite(accept)):
            return "accept_probs has NaN or inf"
        if accept.min() < -ATOL or accept.max() > 1 + ATOL:
            return f"accept_probs outside [0, 1]: [{accept.min():.6g}, {accept.max():.6g}]"
        if np.any(accept[draft == 0] > 0):
            return "a token with p = 0 has a positive acceptance"
        return None

    return property_check(
        "acceptance-in-unit-interval",
        strategies.pairs(1, 32),
        problem,
        ("target", "draft"),
        "0 <= a_n <= 1, a_n = 0 where p_n = 0",
        examples,
        seed,
    )


def residuals_are_laws(rule: Rule, strategies, examples: int, seed: int):
    """Every r^n a rejection can reach is a law; the contract (``core.rules.contract``)
    checks what ``residuals_for`` returns and raises, naming the rule, when it is not."""
    tolerance = contract.LAW_RTOL

    def problem(pair):
        target, draft = pair
        accept = rule.accept_probs(target, draft)
        for token in np.flatnonzero((draft > 0) & (accept < 1)):
            residual = np.asarray(rule.residual(target=target, draft=draft, token=int(token)))
            if residual.shape != target.shape:
                return f"residual of token {token} has shape {residual.shape}, not {target.shape}"
            contract.check_laws(rule, "residuals_for", residual)
        return None

    return property_check(
        "residuals-are-laws",
        strategies.pairs(1, 24),
        problem,
        ("target", "draft"),
        f"r^n finite, >= 0, sums to 1 within {tolerance:g} where rejection can happen",
        examples,
        seed,
    )


def fast_law_equals_enumerated(rule: Rule, strategies, examples: int, seed: int):
    def problem(pair):
        return close(
            law.output_law(rule, *pair),
            law.output_law_enumerated(rule, *pair),
            f"the {exact_family(rule)} law and the enumerated law",
        )

    family = exact_family(rule)
    small = strategies.st.one_of(strategies.pairs(1, 24), strategies.processed_pairs(2, 48))
    result = property_check(
        "fast-law-equals-enumerated",
        small,
        problem,
        ("target", "draft"),
        f"{family} law = Σ_n p_n [a_n e_n + (1 − a_n) r^n]",
        examples,
        seed,
    )
    if result.status == FAILED:
        return result
    # Large vocabularies (up to 10^5) with a draft on 16 tokens: the enumeration is 16
    # residuals of size V, so a few draws suffice.
    draws = max(2, examples // LARGE_FRACTION)
    large = property_check(
        "fast-law-equals-enumerated",
        strategies.large_pairs(draft_support=16),
        problem,
        ("target", "draft"),
        "",
        draws,
        seed,
    )
    if large.status == FAILED:
        return large
    result.detail = (
        f"{family} law = Σ_n p_n [a_n e_n + (1 − a_n) r^n] "
        f"({examples} draws V <= 64, {draws} draws V <= 10^5)"
    )
    return result


def support_only(rule: Rule, strategies, examples: int, seed: int) -> CheckResult:
    name = "support-only"
    if not getattr(rule, "support_only", False):
        return CheckResult(name, SKIPPED, "not declared: rows are never packed to their support")
    st = strategies.st

    @st.composite
    def padded(draw):
        target, draft = draw(strategies.pairs(1, 24))
        extra = draw(st.integers(1, 40))
        places = draw(st.lists(st.integers(0, target.size), min_size=extra, max_size=extra))
        return target, draft, sorted(places)

    def problem(example):
        target, draft, places = example
        wide_target = np.insert(target, places, 0.0)
        wide_draft = np.insert(draft, places, 0.0)
        kept = np.ones(wide_target.size, dtype=bool)
        kept[np.array(places) + np.arange(len(places))] = False
        wide = law.output_law(rule, wide_target, wide_draft)
        if np.any(wide[~kept] > ATOL):
            return "the padded law puts mass on a token with p = q = 0"
        narrow = law.output_law(rule, target, draft)
        return close(wide[kept], narrow, "laws with and without padding")

    return property_check(
        name,
        padded(),
        problem,
        ("target", "draft", "zeros_inserted_at"),
        "zeros where p = q = 0 change no law",
        examples,
        seed,
    )


def gamma_from_mass(rule: Rule, strategies, examples: int, seed: int) -> CheckResult:
    name = "gamma-from-mass"
    if exact_family(rule) != "branch" or not getattr(rule, "gamma_from_mass", False):
        return CheckResult(name, SKIPPED, "not declared (or not a branch rule)")

    def problem(pair):
        target, draft = pair
        whole = rule.raised_masses(target, draft)
        each = np.array([rule.raised_mass(np.array([mass]))[0] for mass in target])
        return close(whole, each, "γ of the whole row and γ of each q_n")

    return property_check(
        name,
        strategies.pairs(1, 24),
        problem,
        ("target", "draft"),
        "γ_n depends on q_n alone",
        examples,
        seed,
    )


def lossless_at(rule: Rule, strategies, examples: int, seed: int) -> CheckResult:
    name = "lossless-at"
    lossless = getattr(rule, "lossless_at", None)
    if lossless is None:
        return CheckResult(name, SKIPPED, "not declared: no parameters make this rule lossless")
    lossless_rule = rule.with_params(**lossless) if lossless else rule

    def problem(pair):
        target, _ = pair
        return close(law.output_law(lossless_rule, *pair), target, "the emitted law and q")

    return property_check(
        name,
        strategies.pairs(1, 32),
        problem,
        ("target", "draft"),
        f"{rules.spec_of(lossless_rule)} emits q exactly",
        examples,
        seed,
    )


def greedy_consistent(rule: Rule, strategies, examples: int, seed: int) -> CheckResult:
    name = "greedy-consistent"
    if not getattr(rule, "greedy_consistent", False):
        return CheckResult(name, SKIPPED, "not declared: at temperature 0 it may emit a non-argmax")
    st = strategies.st

    @st.composite
    def one_hot_targets(draw):
        size = draw(st.integers(1, 32))
        target = np.eye(size)[draw(st.integers(0, size - 1))]
        return target, draw(strategies.rows(size))

    def problem(pair):
        return close(law.output_law(rule, *pair), pair[0], "the emitted law and the one-hot q")

    return property_check(
        name,
        one_hot_targets(),
        problem,
        ("target", "draft"),
        "one-hot q (temperature 0): emits argmax q whatever the draft",
        examples,
        seed,
    )


def _tunable_values(tunable) -> list[float]:
    if tunable.log:
        low = max(tunable.low, 0.0)
        grid = [low] + [value for value in (1e-4, 1e-3, 1e-2, 0.1, 0.5, 1.0, 4.0, 30.0)]
        return [value for value in grid if tunable.low <= value <= tunable.high]
    return list(np.linspace(tunable.low, tunable.high, 7))


def tunable_monotone(rule: Rule, strategies, examples: int, seed: int) -> CheckResult:
    name = "tunable-monotone"
    tunable = getattr(rule, "tunable", None)
    if tunable is None:
        return CheckResult(name, SKIPPED, "not declared: no tunable parameter")
    kind = type(rule.params().get(tunable.parameter, 0.0))
    values = _tunable_values(tunable)
    st = strategies.st

    def problem(pool):
        target = np.stack([pair[0] for pair in pool])
        draft = np.stack([pair[1] for pair in pool])
        means = []
        for value in values:
            changed = rule.with_params(**{tunable.parameter: kind(value)})
            means.append(float(law.acceptance_rows(changed, target, draft).mean()))
        steps = np.diff(means) * (1.0 if tunable.increasing else -1.0)
        if np.any(steps < -ATOL):
            where = int(np.argmin(steps))
            return (
                f"mean acceptance moves the wrong way between {tunable.parameter}="
                f"{values[where]:g} ({means[where]:.9g}) and {values[where + 1]:g} "
                f"({means[where + 1]:.9g})"
            )
        return None

    @st.composite
    def pools(draw):
        size = draw(st.integers(1, 16))
        return [(draw(strategies.rows(size)), draw(strategies.rows(size))) for _ in range(4)]

    direction = "non-decreasing" if tunable.increasing else "non-increasing"
    return property_check(
        name,
        pools(),
        problem,
        ("pool",),
        f"mean acceptance {direction} in {tunable.parameter} over {len(values)} values",
        max(4, examples // 4),
        seed,
    )


def budget(rule, strategies, examples, seed, divergence: str, bound: float) -> CheckResult:
    name = f"max-{divergence}"

    def problem(pair):
        target, draft = pair
        emitted = law.output_law(rule, target, draft)
        value = float(divergences.rows(divergence, emitted / emitted.sum(), target))
        if not value <= bound * (1 + 1e-9) + 1e-15:
            return f"{divergence.upper()}(emitted law, q) = {value:.9g} > {bound:g}"
        return None

    drawn = strategies.everyday_pairs()
    return property_check(
        name,
        drawn,
        problem,
        ("target", "draft"),
        f"{divergence.upper()}(emitted law, q) <= {bound:g}",
        examples,
        seed,
    )


#: The checks that take (rule, strategies, examples, seed), by name, in their order.
BY_NAME = {
    "law-is-a-distribution": law_is_a_distribution,
    "acceptance-in-unit-interval": acceptance_in_unit_interval,
    "residuals-are-laws": residuals_are_laws,
    "fast-law-equals-enumerated": fast_law_equals_enumerated,
    "support-only": support_only,
    "gamma-from-mass": gamma_from_mass,
    "lossless-at": lossless_at,
    "greedy-consistent": greedy_consistent,
    "tunable-monotone": tunable_monotone,
}
