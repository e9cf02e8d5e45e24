"""The pool-level frontier: the most acceptance any rule reaches at a given mean KL per token.

A pool is N positions c with verifier rows q_c (target) and draft rows p_c. A rule gives
each position an emitted law μ_c and an acceptance A_c; over the pool a reader compares the
means (E_c[KL(μ_c‖q_c)], E_c[A_c]). Whatever the rule (its h may depend on the drafted
token, it may be deterministic), the drafted token is accepted only if it is the emitted
one, so A_c <= P(drafted = emitted) <= Σ_x min(p_c,x, μ_c,x) (coupling inequality). The best
any rule can do at mean KL K is therefore

    A*(K) = max E_c[Σ_x min(p_c,x, h_c,x)]  over laws h_c with  E_c[KL(h_c‖q_c)] <= K,

which generalised speculative sampling with target h_c attains (its emitted law is h_c).
Lagrange with multiplier λ = 1/κ splits this into one problem per position, whose KKT
conditions give the source-level frontier rule ``pareto`` (``core/rules/pareto.py``):

    h_c = clip(p_c, s_c q_c, s_c e^κ q_c),   s_c in (0, 1] set by Σ_x h_c,x = 1.

As κ runs over [0, ∞) the point (E[KL(h‖q)], E[Σ min(p, h)]) traces the upper concave
envelope of everything reachable: κ = 0 is SpS (h = q), κ → ∞ tends to h = p on the support
of q. Both coordinates are non-decreasing in κ, so ``frontier_acceptance`` finds the κ of a
given mean KL by a bracketed monotone root (Newton on κ with the exact slope dK/dκ, kept
inside the bracket by bisection) and returns A* there.

``pareto_law`` solves for s_c exactly (no iteration): Σ_x clip(p_x, s q_x, s r q_x), with
r = e^κ, is continuous, non-decreasing and piecewise linear in s, with kinks at
a_x = p_x/(r q_x) and b_x = p_x/q_x; sorting the kinks of each row and summing the slopes
gives the segment where it crosses 1, then s in closed form. ``pareto_rule_law`` (the
iterative solver of the rule itself) gives the same h to rounding, which a test checks.

Rows may be packed to their support (tokens where both q and p are 0 removed, padded with
zeros): a zero column adds nothing to any sum here, so the results are the same.
Everything is float64 numpy; rows are processed in chunks of ``CHUNK_ROWS``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cactus_theory.core import divergences, validate

Array = np.ndarray

#: The largest spread κ tried: e^700 is close to float64's largest value.
MAX_SPREAD = 700.0
#: A*(∞): at an infinite mean KL the law h = p is allowed, and it accepts every draft.
UNBOUNDED_ACCEPTANCE = 1.0
#: Rows per chunk (bounds the [rows, 2V] sort of ``pareto_law``).
CHUNK_ROWS = 2048


def _rows(target_probs: object, draft_probs: object) -> tuple[Array, Array]:
    """Validated float64 [N, V] rows (a single row [V] becomes [1, V])."""
    target, draft = validate.pair(target_probs, draft_probs)
    if target.ndim == 1:
        target, draft = target[None], draft[None]
    if target.ndim != 2:
        raise ValueError(f"target_probs: expected rows [N, V], got shape {target.shape}")
    return target, draft


def _chunks(count: int):
    for start in range(0, count, CHUNK_ROWS):
        yield slice(start, min(count, start + CHUNK_ROWS))


def pareto_scale(target_probs: Array, draft_probs: Array, spread: float) -> Array:
    """[N]: the s of ``h = clip(p, s q, s e^κ q)`` with Σ h = 1, per row, exactly.

    g(s) = Σ_x clip(p_x, s q_x, s r q_x) (r = e^κ) starts at g(0) = 0 with every token of
    q > 0 in its upper branch s r q_x (or, where p_x = 0, its lower branch s q_x); passing
    a_x = p_x/(r q_x) moves token x to the flat branch p_x, passing b_x = p_x/q_x to the
    lower branch s q_x. After the kinks below s, g(s) = s (r S_hi + S_lo) + S_mid with
    S_hi, S_lo the q-mass in the upper and lower branches and S_mid the p-mass in the flat
    one; g(1) >= Σ q = 1, so the crossing lies in (0, 1].
    """
    ratio = math.exp(min(float(spread), MAX_SPREAD))
    rows = target_probs.shape[0]
    support = target_probs > 0
    safe_target = np.where(support, target_probs, 1.0)
    mass = np.where(support, target_probs, 0.0)
    drafted = np.where(support, draft_probs, 0.0)  # p_x where q_x = 0 never enters h
    upper_kink = np.where(support, draft_probs / (ratio * safe_target), np.inf)  # a_x
    lower_kink = np.where(support, draft_probs / safe_target, np.inf)  # b_x
    sentinel = np.full((rows, 1), np.inf)  # past every kink g(s) = s Σq reaches 1 at s = 1
    kinks = np.concatenate([upper_kink, lower_kink, sentinel], axis=1)  # [N, 2V+1]
    order = np.argsort(kinks, axis=1, kind="stable")  # a_x <= b_x, so a_x passes first
    kinks = np.take_along_axis(kinks, order, axis=1)
    size = mass.shape[1]
    token = order % size  # x of each kink (the sentinel's x is irrelevant: it adds nothing)
    upper = order < size  # an a-kink; else a b-kink (or the sentinel)
    real = order < 2 * size
    mass_at = np.where(real, np.take_along_axis(mass, token, axis=1), 0.0)
    drafted_at = np.where(real, np.take_along_axis(drafted, token, axis=1), 0.0)
    # Passing a_x: S_hi −= q_x, S_mid += p_x.  Passing b_x: S_mid −= p_x, S_lo += q_x.
    # S_hi after kink j is the q-mass of the a-kinks after j: a suffix sum of non-negative
    # terms (never a rounding below 0, which r up to e^700 would blow up).
    high_mass = np.where(upper, mass_at, 0.0)
    suffix = np.cumsum(high_mass[:, ::-1], axis=1)[:, ::-1]
    high = np.concatenate([suffix[:, 1:], np.zeros((rows, 1))], axis=1)
    flat = np.cumsum(np.where(upper, drafted_at, -drafted_at), axis=1)
    low = np.cumsum(np.where(upper, 0.0, mass_at), axis=1)
    finite = np.isfinite(kinks)
    with np.errstate(invalid="ignore", over="ignore"):
        value = np.where(finite, kinks, 0.0) * (ratio * high + low) + flat  # g at each kink
    value = np.where(finite, value, np.inf)
    crossing = np.argmax(value >= 1.0, axis=1)  # [N] the first kink with g >= 1
    before = crossing - 1  # the state on the segment below it (−1: no kink passed yet)
    every = np.arange(rows)
    index = before.clip(0)
    high_before = np.where(before >= 0, high[every, index], mass.sum(axis=1))
    flat_before = np.where(before >= 0, flat[every, index], 0.0)
    low_before = np.where(before >= 0, low[every, index], 0.0)
    slope = ratio * high_before + low_before
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = (1.0 - flat_before) / slope
    # g is continuous, so a zero slope below a kink where g >= 1 is a rounding case: the
    # crossing is that kink.
    scale = np.where(slope > 0, scale, np.minimum(kinks[every, crossing], 1.0))
    return np.clip(scale, 0.0, 1.0)


def pareto_law(target_probs: object, draft_probs: object, spread: float) -> Array:
    """[N, V]: h = clip(p, s q, s e^κ q) / Σ per row (module docstring), κ = ``spread``."""
    target, draft = _rows(target_probs, draft_probs)
    spread = validate.nonnegative("spread", spread)
    return _pareto_rows(target, draft, spread)


def _pareto_rows(target: Array, draft: Array, spread: float) -> Array:
    if spread == 0:
        return target.copy()
    ratio = math.exp(min(spread, MAX_SPREAD))
    out = np.empty_like(target)
    for part in _chunks(target.shape[0]):
        scale = pareto_scale(target[part], draft[part], spread)[:, None]
        low = scale * target[part]
        adjusted = np.clip(draft[part], low, ratio * low)
        out[part] = adjusted / adjusted.sum(axis=1, keepdims=True)
    return out


def _point(target: Array, draft: Array, spread: float) -> tuple[float, float]:
    """(mean KL(h‖q), mean Σ min(p, h)) of the pareto rule with ``spread`` over the rows."""
    kl, acceptance, _ = _point_and_slope(target, draft, spread)
    return kl, acceptance


def _point_and_slope(target: Array, draft: Array, spread: float) -> tuple[float, float, float]:
    """(mean KL, mean acceptance, d(mean KL)/dκ) at κ = ``spread``.

    With U, L the tokens clipped to s r q and to s q (r = e^κ), Q_U, Q_L their q-mass and
    P_M the p-mass in between, s = (1 − P_M)/(r Q_U + Q_L), so dA/dκ = s r Q_U Q_L /
    (r Q_U + Q_L) per row, and dK/dκ = κ dA/dκ (the frontier's slope dA/dK is 1/κ).
    """
    ratio = math.exp(min(spread, MAX_SPREAD))
    kl_sum, accept_sum, slope_sum = 0.0, 0.0, 0.0
    for part in _chunks(target.shape[0]):
        rows_target, rows_draft = target[part], draft[part]
        if spread == 0:
            adjusted, slope = rows_target, 0.0
        else:
            scale = pareto_scale(rows_target, rows_draft, spread)[:, None]
            low = scale * rows_target
            adjusted = np.clip(rows_draft, low, ratio * low)
            upper = np.where(rows_draft > ratio * low, rows_target, 0.0).sum(axis=1)
            lower = np.where(rows_draft < low, rows_target, 0.0).sum(axis=1)
            with np.errstate(divide="ignore", invalid="ignore"):
                rate = scale[:, 0] * ratio * upper * lower / (ratio * upper + lower)
            slope = spread * float(np.where(upper * lower > 0, rate, 0.0).sum())
            adjusted = adjusted / adjusted.sum(axis=1, keepdims=True)
        kl_sum += float(divergences.kl_rows(adjusted, rows_target).sum())
        accept_sum += float(np.minimum(rows_draft, adjusted).sum())
        slope_sum += slope
    count = target.shape[0]
    return kl_sum / count, accept_sum / count, slope_sum / count


def frontier_point(target_probs: object, draft_probs: object, spread: float) -> tuple[float, float]:
    """(mean KL per token, mean acceptance) of the frontier rule with spread κ on the pool."""
    target, draft = _rows(target_probs, draft_probs)
    return _point(target, draft, validate.nonnegative("spread", spread))


def frontier_curve(
    target_probs: object, draft_probs: object, spreads: Sequence[float]
) -> list[tuple[float, float]]:
    """[(mean KL, mean acceptance)] at each spread κ: points on the pool's upper concave
    acceptance–KL envelope (κ = 0: SpS; larger κ: more KL, more acceptance)."""
    target, draft = _rows(target_probs, draft_probs)
    values = [validate.nonnegative("spreads", value) for value in spreads]
    return [_point(target, draft, value) for value in values]


def default_spreads(count: int = 24) -> list[float]:
    """0, then ``count − 3`` spreads κ log-spaced over [0.005, 60] (where real pools spend
    their KL), then 200 and ``MAX_SPREAD``."""
    if count < 4:
        raise ValueError(f"count: must be >= 4, got {count}")
    middle = np.geomspace(0.005, 60.0, count - 3)
    return [0.0, *(float(value) for value in middle), 200.0, MAX_SPREAD]


def frontier_spread(target_probs: object, draft_probs: object, mean_kl: float) -> float:
    """The κ at which the frontier's mean KL per token equals ``mean_kl`` (the largest κ
    tried, ``MAX_SPREAD``, when ``mean_kl`` is at or beyond what the pool allows)."""
    target, draft = _rows(target_probs, draft_probs)
    return _spread(target, draft, _budget(mean_kl))


def _budget(mean_kl: float) -> float:
    if isinstance(mean_kl, float) and math.isinf(mean_kl) and mean_kl > 0:
        return math.inf
    return validate.nonnegative("mean_kl", mean_kl)


def _spread(
    target: Array,
    draft: Array,
    budget: float,
    bracket: tuple[float, float] | None = None,
    known: tuple[float, float] | None = None,
) -> float:
    """The κ with mean KL ``budget``: Newton on κ with the exact slope (``_point_and_slope``),
    kept inside a bracket (bisection when a step leaves it); ``bracket`` = (κ_lo, κ_hi) with
    KL(κ_lo) <= budget <= KL(κ_hi) when known (and ``known`` those two KL values), else
    [0, MAX_SPREAD] is checked."""
    if budget <= 0:
        return 0.0
    if bracket is None:
        top_kl, _ = _point(target, draft, MAX_SPREAD)
        if budget >= top_kl:
            return MAX_SPREAD
        bracket = (0.0, MAX_SPREAD)
    low, high = bracket
    spread = min(high, 1.0) if low == 0 else low
    if known is not None:  # regula falsi from the bracket's two KL values
        low_kl, high_kl = known
        if high_kl > low_kl:
            spread = low + (high - low) * (budget - low_kl) / (high_kl - low_kl)
    for _ in range(200):
        kl, _, slope = _point_and_slope(target, draft, spread)
        gap = kl - budget
        if abs(gap) <= 1e-11 * max(1.0, budget):
            return spread
        if gap < 0:
            low = spread
        else:
            high = spread
        step = spread - gap / slope if slope > 0 else math.nan
        inside = low < step < high
        spread = step if inside else (low + high) / 2 if high < 50 else math.sqrt(low * high + 1)
        if high - low <= 1e-14 * max(1.0, high):
            return spread
    return spread


def frontier_acceptances(
    target_probs: object,
    draft_probs: object,
    mean_kls: Sequence[float],
    spreads: Sequence[float] | None = None,
) -> tuple[list[float], list[tuple[float, float]]]:
    """(A* at each of ``mean_kls``, the curve at ``spreads``): ``frontier_acceptance`` for
    many levels at once. The curve (default ``default_spreads()``) brackets each level, so
    each root needs a few evaluations instead of a search over [0, MAX_SPREAD]."""
    target, draft = _rows(target_probs, draft_probs)
    grid = sorted({0.0, MAX_SPREAD, *(spreads if spreads is not None else default_spreads())})
    grid = [validate.nonnegative("spreads", value) for value in grid]
    curve = [_point(target, draft, value) for value in grid]
    kls = [point[0] for point in curve]
    found = []
    for level in mean_kls:
        budget = _budget(level)
        if math.isinf(budget):  # h = p: every draft accepted, at an infinite KL
            found.append(UNBOUNDED_ACCEPTANCE)
            continue
        if budget <= 0:
            found.append(curve[0][1])
            continue
        if budget >= kls[-1]:
            found.append(curve[-1][1])
            continue
        above = next(i for i, kl in enumerate(kls) if kl >= budget)
        spread = _spread(
            target, draft, budget, (grid[above - 1], grid[above]), (kls[above - 1], kls[above])
        )
        found.append(_point(target, draft, spread)[1])
    return found, curve


def frontier_acceptance(target_probs: object, draft_probs: object, mean_kl: float) -> float:
    """The most mean acceptance any rule reaches on the pool at mean KL per token
    ``mean_kl`` (module docstring): the pareto rule's, at the κ whose mean KL equals it.

    ``mean_kl`` = 0 gives SpS's acceptance E[Σ min(p, q)]; a finite ``mean_kl`` at or
    beyond the pool's largest gives the acceptance as κ → ∞, E[Σ_{q>0} p]: with a finite
    KL no rule emits, so none accepts, a token q excludes. ``mean_kl`` = inf gives 1
    (``UNBOUNDED_ACCEPTANCE``): h = p accepts every draft, and a rule whose KL is infinite
    (the engines' relaxed rules after top-k) is bounded by nothing less.
    """
    target, draft = _rows(target_probs, draft_probs)
    budget = _budget(mean_kl)
    if math.isinf(budget):
        return UNBOUNDED_ACCEPTANCE
    return _point(target, draft, _spread(target, draft, budget))[1]
