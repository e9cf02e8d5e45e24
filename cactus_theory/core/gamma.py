"""γ*: the mass a Cactus branch raises the drafted token to.

For the drafted token n the per-branch problem is

    maximise h_n  subject to  D_f(h‖q) <= δ,  h in the simplex.

For a fixed h_n = γ, spreading the other 1 − γ in proportion to q minimises every
f-divergence (Jensen), so D_f(h‖q) = D_f((γ, 1−γ) ‖ (q_n, 1−q_n)) and the problem is the
scalar "largest γ in [q_n, 1] whose binary divergence is within δ". Its solution:

================  =========================================================================
divergence        γ*(q_n, δ)
================  =========================================================================
paper (Cor. 5)    min(1, q_n + sqrt(2 δ q_n (1−q_n)))   second-order KL; not exact
``kl``            root of  γ log(γ/q_n) + (1−γ) log((1−γ)/(1−q_n)) = δ;  1 if −log q_n <= δ
``reverse-kl``    root of  q_n log(q_n/γ) + (1−q_n) log((1−q_n)/(1−γ)) = δ;  < 1 unless q_n = 1
``chi2``          min(1, q_n + sqrt(δ q_n (1−q_n)))       exact: χ² = (γ−q_n)²/(q_n(1−q_n))
``hellinger``     sin²(min(π/2, asin √q_n + acos(1−δ)))   exact: H² = 1 − cos(θ−φ)
``tv``            min(1, q_n + δ)                          exact: TV = γ − q_n
``js``            root of the binary JS divergence = δ
================  =========================================================================

(For χ² the substitution γ = sin²θ, q_n = sin²φ turns √(γ q_n) + √((1−γ)(1−q_n)) into
cos(θ − φ), which gives the Hellinger line.) Roots use vectorised safeguarded Newton from
the right, started at an explicit upper bound (``start_bound``): the three root
divergences are convex and increasing in γ on [q_n, 1], so it converges monotonically. They
finish on the *feasible* side: D(γ*) <= δ holds as computed, not only up to tolerance.
``roots.feasible_root`` (scipy's Chandrupatla) takes any element Newton leaves unsettled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cactus_theory.core import divergences, roots, validate

Array = np.ndarray

#: Divergences whose γ* is a closed form (exact, no root finding).
CLOSED_FORM = ("chi2", "hellinger", "tv")
#: Divergences whose γ* needs a scalar root.
ROOT = ("kl", "reverse-kl", "js")


def _as_target_mass(target_mass: object) -> Array:
    values = np.asarray(target_mass, dtype=np.float64)
    if not np.all(np.isfinite(values)) or np.any((values < 0) | (values > 1)):
        raise ValueError("target_mass: values must be finite probabilities in [0, 1]")
    return values


def closed_form_raised_mass(target_mass: object, delta: float) -> Array:
    """Paper, Corollary 5: γ = min(1, q_n + sqrt(2 δ q_n (1 − q_n))).

    This is the root of the second-order expansion KL ≈ (γ − q_n)² / (2 q_n (1 − q_n)),
    i.e. the exact χ² solution at budget 2δ. It can overshoot the KL budget.
    """
    q_n = _as_target_mass(target_mass)
    budget = validate.nonnegative("delta", delta)
    return np.minimum(1.0, q_n + np.sqrt(2.0 * budget * q_n * (1.0 - q_n)))


def exact_raised_mass(
    target_mass: object, delta: float, divergence: str = "kl", cap: object = None
) -> Array:
    """γ*(q_n, δ): the largest γ in [q_n, 1] with D((γ,1−γ)‖(q_n,1−q_n)) <= δ, elementwise.

    With ``cap`` (an array like ``target_mass``), returns min(γ*, cap) and solves roots only
    where γ* < cap; the acceptance min(1, γ*/p_n) needs no more than min(γ*, p_n).
    """
    q_n = _as_target_mass(target_mass)
    budget = validate.nonnegative("delta", delta)
    name = divergences.check_name(divergence)
    bound = None if cap is None else np.broadcast_to(np.asarray(cap, dtype=np.float64), q_n.shape)
    if name in CLOSED_FORM or budget == 0.0:
        raised = np.asarray(_closed_form(q_n, budget, name))
        if bound is None or name == "tv":  # TV's check is one subtraction: run it on all
            checked = _feasible_side(raised, q_n, budget, name)
            return checked if bound is None else np.minimum(checked, bound)
        # _feasible_side moves γ down by at most 8 ulps: where the closed form is further
        # above the cap, min(γ, cap) = cap without the (costlier) check.
        result = np.asarray(np.minimum(raised, bound))
        near = raised - 16.0 * np.spacing(raised) <= bound
        if np.any(near):
            checked = _feasible_side(raised[near], q_n[near], budget, name)
            result[near] = np.minimum(checked, bound[near])
        return result
    return _root_raised_mass(q_n, budget, name, bound)


def _feasible_side(raised: Array, q_n: Array, budget: float, name: str) -> Array:
    """Step a closed-form γ down by ulps while rounding puts it over budget (rarely > 1).

    Closed forms are exact in real arithmetic, but e.g. q_n + δ rounds; this makes
    D(γ) <= δ hold as computed, as the roots guarantee.
    """
    result = np.array(raised, dtype=np.float64, copy=True)
    for _ in range(8):
        with np.errstate(divide="ignore", invalid="ignore"):
            over = (divergences.binary(name, result, q_n) > budget) & (result > q_n)
        if not np.any(over):
            break
        result[over] = np.maximum(np.nextafter(result[over], -np.inf), q_n[over])
    return result


def _closed_form(q_n: Array, budget: float, name: str) -> Array:
    if budget == 0.0:
        return q_n.copy()
    if name == "chi2":
        return np.minimum(1.0, q_n + np.sqrt(budget * q_n * (1.0 - q_n)))
    if name == "tv":
        return np.minimum(1.0, q_n + budget)
    if budget >= 1.0:  # hellinger: H² <= 1 always
        return np.ones_like(q_n)
    # acos(1 − δ) = 2 asin(√(δ/2)), the second form keeps full precision for small δ.
    angle = np.minimum(np.pi / 2, np.arcsin(np.sqrt(q_n)) + 2.0 * np.arcsin(np.sqrt(budget / 2)))
    # sin² can round a hair below q_n when the added angle is tiny; γ* >= q_n always.
    return np.clip(np.sin(angle) ** 2, q_n, 1.0)


def _upper_bracket(q_n: Array, delta: float, name: str) -> Array:
    """A γ in [q_n, 1] with D(γ) >= δ, or 1 when the whole interval is feasible.

    For reverse KL D(1) = +inf, so use the bound q log(q/γ) >= q log q, which gives
    γ_up = 1 − (1 − q) exp(−(δ − q log q)/(1 − q)) with D(γ_up) >= δ.
    """
    if name == "reverse-kl":
        with np.errstate(divide="ignore", invalid="ignore"):
            q_log_q = np.where(q_n > 0, q_n * np.log(np.where(q_n > 0, q_n, 1.0)), 0.0)
            exponent = -(delta - q_log_q) / (1.0 - q_n)
            # 1 − (1 − q) e^t = −expm1(t) + q e^t: no cancellation when t is tiny.
            upper = -np.expm1(exponent) + q_n * np.exp(exponent)
        return np.where(q_n < 1.0, upper, 1.0)
    return np.ones_like(q_n)


def _root_raised_mass(q_n: Array, delta: float, name: str, cap: Array | None) -> Array:
    """γ* (or min(γ*, cap)) by ``_newton_root`` wherever the answer is not already known.

    A cap at or below q_n is the answer (min(γ*, cap) = cap since γ* >= q_n); q_n = 1
    gives 1; KL at q_n = 0 gives 0 (any γ > 0 has D = +inf; reverse KL and JS stay finite).
    """
    gamma = q_n.copy() if cap is None else np.asarray(np.minimum(q_n, cap))
    solve = q_n < 1.0
    if cap is not None:
        solve &= cap > q_n
    if name == "kl":
        solve &= q_n > 0.0
    index = np.flatnonzero(solve)
    if index.size:
        target = np.ravel(q_n)[index]
        upper = _upper_bracket(target, delta, name)
        if cap is not None:
            upper = np.minimum(upper, np.ravel(cap)[index])
        np.ravel(gamma)[index] = _newton_root(name, target, delta, upper)
    return gamma


def start_bound(name: str, q_n: Array, delta: float) -> Array:
    """A γ >= γ*(q_n, δ) (D(γ) >= δ): where Newton from the right starts.

    KL and reverse KL are ∫_q^γ of (γ − t) resp. (t − q) over t(1 − t), so
    D >= (γ − q)² / (2 max_{[q, γ]} t(1 − t)). For q >= 1/2 the max is q(1 − q):
    γ* <= q + sqrt(2 δ q (1 − q)). For γ <= 1/2 it is γ(1 − γ), whose bound is the root
    γ_A = [(q + δ) + sqrt(δ (2 q (1 − q) + δ))] / (1 + 2 δ) of (γ − q)² = 2 δ γ (1 − γ)
    (used when γ_A <= 1/2). Otherwise Pinsker: γ* <= q + sqrt(δ/2). For JS, Pinsker on
    each half (TV((γ, ·), m) = |γ − q|/2) gives JS >= (γ − q)²/2: γ* <= q + sqrt(2 δ).
    """
    if name == "js":
        return q_n + np.sqrt(2.0 * delta)
    spread = q_n * (1.0 - q_n)
    pinsker = q_n + np.sqrt(0.5 * delta)
    small = ((q_n + delta) + np.sqrt(delta * (2.0 * spread + delta))) / (1.0 + 2.0 * delta)
    below_half = np.where(small <= 0.5, small, pinsker)
    return np.where(q_n >= 0.5, q_n + np.sqrt(2.0 * delta * spread), below_half)


#: Most safeguarded Newton steps per element (a handful are taken).
NEWTON_STEPS = 100


def newton_terms(name: str, x: Array, q: Array) -> tuple[Array, Array]:
    """(D(x), dD/dx) for q < x <= 1, q < 1, in the log1p form Newton iterates on.

    With d = x − q, u = log1p(d/q) = log(x/q) and w = log1p(−d/(1−q)) = log((1−x)/(1−q)):
    KL = x u + (1−x) w, slope u − w; reverse KL = −q u − (1−q) w, slope d/(x(1−x)).
    JS with m = (x+q)/2, h = d/2: ½ [x log1p(h/m) + (1−x) log1p(−h/(1−m))
    + q log(q/m) + (1−q) log1p(h/(1−m))], slope ½ [log1p(h/m) − log1p(−h/(1−m))].
    The logs of ratios come from the exact differences, so the error is O(ε) relative as
    in ``divergences.binary`` (which still decides feasibility); 0 · log 0 terms are 0.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        diff = x - q
        if name == "js":
            middle, half = 0.5 * (x + q), 0.5 * diff
            up, down = np.log1p(half / middle), np.log1p(-half / (1.0 - middle))
            # log(q/m) = log1p(−h/m), or log q − log m once q << m (1 − h/m would round).
            back = np.where(half < 0.5 * middle, np.log1p(-half / middle), np.log(q / middle))
            rest = np.log1p(half / (1.0 - middle))
            value = x * up + np.where(x < 1.0, (1.0 - x) * down, 0.0)
            value += np.where(q > 0.0, q * back, 0.0) + (1.0 - q) * rest
            return 0.5 * value, 0.5 * (up - down)
        up, down = np.log1p(diff / q), np.log1p(-diff / (1.0 - q))
        if name == "reverse-kl":
            value = -np.where(q > 0.0, q * up, 0.0) - (1.0 - q) * down
            return value, diff / (x * (1.0 - x))
        return x * up + np.where(x < 1.0, (1.0 - x) * down, 0.0), up - down


@dataclass(frozen=True)
class _BinaryTerms:
    """``newton_terms`` of one divergence at fixed targets (``roots.NewtonTerms``)."""

    name: str
    target: Array

    def value_and_slope(self, point: Array) -> tuple[Array, Array]:
        return newton_terms(self.name, point, self.target)

    def take(self, keep: Array) -> _BinaryTerms:
        return _BinaryTerms(self.name, self.target[keep])


def _newton_root(name: str, q_n: Array, delta: float, high: Array) -> Array:
    """The largest γ in [q_n, high] with D(γ) <= δ (D(q_n) = 0 < δ), elementwise.

    D is convex and increasing on [q_n, 1], so a Newton step from any point lands at or
    right of the root, and Newton from the right converges monotonically. It starts from
    the smaller of ``high`` and ``start_bound`` (where D >= δ already); when that is
    ``high`` and D(high) <= δ, high is the answer (saturated: γ = 1 for KL when
    −log q_n <= δ, or the cap). A Newton iterate that rounding puts on the feasible side
    is the root to rounding. Safeguards keep a bracket [low, high] with D(low) <= δ <
    D(high): an infinite slope (at γ = 1) or a step out of it becomes a bisection.
    Iterates use ``newton_terms``; then ``divergences.binary`` checks every result and γ
    moves down by ulps until D(γ) <= δ as computed. Any element Newton leaves unsettled
    goes to ``roots.feasible_root`` on its bracket.
    """
    point = np.minimum(high, start_bound(name, q_n, delta))
    # A feasible upper end is the answer, as if reached by a Newton step.
    gamma, low, high, settled = roots.newton_from_right(
        _BinaryTerms(name, q_n),
        delta,
        point,
        q_n,
        high,
        steps=NEWTON_STEPS,
        from_newton=point >= high,
    )
    if not settled.all():
        rest = ~settled
        gamma[rest] = _bracketed_root(name, q_n[rest], delta, low[rest], high[rest])
    # γ moves down by ulps until D(γ) <= δ as computed by ``divergences.binary``.
    return roots.step_down_to_budget(
        lambda rows, points: divergences.binary(name, points, q_n[rows]), gamma, q_n, delta
    )


def _bracketed_root(name: str, q_n: Array, delta: float, low: Array, high: Array) -> Array:
    """``roots.feasible_root`` on [low, high] (the fallback; low itself where D(low) = δ)."""

    def excess(x: Array, q: Array) -> Array:
        return divergences.binary(name, x, q) - delta

    result = low.copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        proper = (excess(low, q_n) < 0) & (excess(high, q_n) > 0)
    if proper.any():
        result[proper] = roots.feasible_root(excess, low[proper], high[proper], args=(q_n[proper],))
    return result
