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
cos(θ − φ), which gives the Hellinger line.) A closed form that rounds above the budget is
stepped down by single ulps until D(γ*) <= δ as computed. Roots use
``cactus_theory.roots.feasible_root`` (scipy's vectorised Chandrupatla) and return the
*feasible* end of the final bracket, so D(γ*) <= δ holds as computed, not only up to
tolerance.
"""

from __future__ import annotations

import numpy as np

from cactus_theory import divergences, roots, validate

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
        raised = _feasible_side(_closed_form(q_n, budget, name), q_n, budget, name)
        return raised if bound is None else np.minimum(raised, bound)
    return _root_raised_mass(q_n, budget, name, bound)


def _closed_form(q_n: Array, budget: float, name: str) -> Array:
    if budget == 0.0:
        return q_n.copy()
    if name == "chi2":
        return np.minimum(1.0, q_n + np.sqrt(budget * q_n * (1.0 - q_n)))
    if name == "tv":
        return np.minimum(1.0, q_n + budget)
    if budget >= 1.0:  # hellinger: H² <= 1 always
        return np.ones_like(q_n)
    # acos(1 − δ) = 2 asin(√(δ/2)), which keeps full precision for small δ.
    angle = np.minimum(np.pi / 2, np.arcsin(np.sqrt(q_n)) + 2.0 * np.arcsin(np.sqrt(budget / 2)))
    # sin² can round a hair below q_n when the added angle is tiny; γ* >= q_n always.
    return np.clip(np.sin(angle) ** 2, q_n, 1.0)


def _feasible_side(raised: Array, q_n: Array, budget: float, name: str) -> Array:
    """Step a rounded closed form down ulp by ulp (towards q_n) until D(γ) <= δ as computed.

    The closed forms are exact in real arithmetic, but γ near 1 rounded up by one ulp can
    exceed a tiny δ (TV: γ − q_n = δ(1 + 1e−9) at δ = 7e−8). D(q_n) = 0, so this stops.
    """
    for _ in range(_ULP_STEPS):
        with np.errstate(divide="ignore", invalid="ignore"):
            over = divergences.binary(name, raised, q_n) > budget
        if not np.any(over):
            return raised
        raised = np.where(over, np.maximum(np.nextafter(raised, q_n), q_n), raised)
    with np.errstate(divide="ignore", invalid="ignore"):
        over = divergences.binary(name, raised, q_n) > budget
    if np.any(over):  # farther than a few ulps: solve those on the feasible side

        def excess(x: Array, q: Array) -> Array:
            return divergences.binary(name, x, q) - budget

        raised = raised.copy()
        raised[over] = roots.feasible_root(excess, q_n[over], raised[over], args=(q_n[over],))
    return raised


_ULP_STEPS = 8


def _upper_bracket(q_n: Array, delta: float, name: str) -> Array:
    """A γ in [q_n, 1] with D(γ) >= δ, or 1 when the whole interval is feasible.

    For reverse KL D(1) = +inf, so use the bound q log(q/γ) >= q log q, which gives
    γ_up = 1 − (1 − q) exp(−(δ − q log q)/(1 − q)) with D(γ_up) >= δ.
    """
    if name == "reverse-kl":
        with np.errstate(divide="ignore", invalid="ignore"):
            q_log_q = np.where(q_n > 0, q_n * np.log(np.where(q_n > 0, q_n, 1.0)), 0.0)
            upper = 1.0 - (1.0 - q_n) * np.exp(-(delta - q_log_q) / (1.0 - q_n))
        return np.where(q_n < 1.0, upper, 1.0)
    return np.ones_like(q_n)


def _root_raised_mass(q_n: Array, delta: float, name: str, cap: Array | None) -> Array:
    gamma = q_n.copy()
    upper = _upper_bracket(q_n, delta, name)
    if cap is not None:
        upper = np.minimum(upper, cap)
        # A cap at or below q_n is the answer: min(γ*, cap) = cap since γ* >= q_n.
        capped = cap <= q_n
        gamma[capped] = cap[capped]
    else:
        capped = np.zeros(q_n.shape, dtype=bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        at_upper = divergences.binary(name, upper, q_n)
    # D(upper) <= δ: the upper end itself is the answer (γ = 1 for KL when −log q_n <= δ).
    saturated = (q_n < 1.0) & (at_upper <= delta) & ~capped
    gamma[saturated] = upper[saturated]
    # KL at q_n = 0: any γ > 0 has D = +inf, so γ* = 0 (reverse KL and JS stay finite).
    stuck = (q_n <= 0.0) & (name == "kl")
    solve = (q_n < 1.0) & ~saturated & ~stuck & ~capped
    if np.any(solve):
        low, high = q_n[solve], upper[solve]

        def excess(x: Array, q: Array) -> Array:
            return divergences.binary(name, x, q) - delta

        gamma[solve] = roots.feasible_root(excess, low, high, args=(low,))
    return gamma
