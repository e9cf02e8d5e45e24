"""How far the paper's closed form (Cor. 5) overshoots the KL budget, exactly.

The closed form raises the drafted token to γ = min(1, q + d), d = √(2δ q (1 − q)) (q = q_n).
Its branch divergence is the binary KL (Thm 2's reduction)

    K(q, δ) = γ log(γ/q) + (1 − γ) log((1 − γ)/(1 − q)).

**Overshoot.** sup over q in (0, 1) of K(q, δ)/δ equals log(1 + 2δ)/δ, attained at the
saturation kink q_s = 1/(1 + 2δ) where γ first reaches 1 (see ``DERIVATION``).

**When the closed form stays within budget (sharpening Cor. 6).** Let
Δ_q(γ) = KL(γ‖q) − (γ − q)²/(2q(1 − q)), so an unclipped branch is within budget iff
Δ_q(γ) <= 0. Δ_q(q) = Δ_q'(q) = 0 and Δ_q''(γ) = 1/(γ(1−γ)) − 1/(q(1−q)), negative exactly
for γ strictly between q and 1 − q. Hence for q < 1/2, Δ_q < 0 on (q, γ₁(q)) and > 0 after,
with a single root γ₁(q) in (1 − q, 1] (γ₁ = 1 when Δ_q(1) <= 0); for q >= 1/2, Δ_q > 0 on
(q, 1]. With δ₁(q) = (γ₁(q) − q)²/(2q(1 − q)) (0 for q >= 1/2):

    KL(h‖q) <= δ   iff   δ <= δ₁(q)  or  δ >= −log q.

In particular γ <= 1 − q suffices (weaker than Cor. 6's γ <= 1/2), and for
q <= q* ≈ 0.2847 (root of −log q = (1 − q)/(2q)) the closed form never exceeds δ.

All functions here take q through u = 1 − q where it matters, so q near 1 (where the
overshoot lives for small δ) is computed without cancellation.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

Array = np.ndarray

DERIVATION = r"""
**The closed form's overshoot, derived.** For the drafted token with verifier mass q
(u = 1 − q) the paper's closed form sets γ = min(1, q + d) with d = √(2δ q u); by Thm 2 the
branch divergence is the binary KL K(q) = γ log(γ/q) + (1 − γ) log((1 − γ)/u).

1. *Saturated branches*, q ≥ q_s = 1/(1 + 2δ) (there d ≥ u): γ = 1 and K = −log q, which
   decreases in q, so its largest value is K(q_s) = log(1 + 2δ).
2. *Unsaturated branches*, q < q_s: put a = d/q ≥ 0 and b = d/u ∈ [0, 1). Since
   ∂K/∂γ = L := log(1 + a) − log(1 − b), ∂K/∂q = −(a + b) and dγ/dq = 1 + (a − b)/2,
   dK/dq = L (2 + a − b)/2 − (a + b). The bounds log(1 + a) ≥ 2a/(2 + a) and
   −log(1 − b) ≥ 2b/(2 − b) give L ≥ 4(a + b)/((2 + a)(2 − b)), and
   (2 + a)(2 − b) ≤ 2(2 + a − b) because ab ≥ 0; so dK/dq ≥ 0 and K increases up to q_s.

Hence **sup over q_n of KL(h‖q)/δ = log(1 + 2δ)/δ**, a maximum attained at the saturation
kink q_n = 1/(1 + 2δ) (not a limit at q_n → 0 or 1). It exceeds 1 exactly when
δ < δ_c ≈ {delta_critical:.6f} (the root of log(1 + 2δ) = δ), tends to 2 as δ → 0, and is
below 2 for every δ > 0. Because every branch reduces to this binary problem, the bound
holds for KL(h^n‖q) at any vocabulary size.

**Sharpest condition for Cor. 6.** With Δ_q(γ) = KL(γ‖q) − (γ − q)²/(2q(1 − q)):
Δ_q(q) = Δ_q'(q) = 0 and Δ_q'' = 1/(γ(1 − γ)) − 1/(q(1 − q)) < 0 exactly between q and
1 − q. So for q < 1/2 the unclipped closed form is within budget iff γ ≤ γ₁(q), the single
root of Δ_q in (1 − q, 1] (γ₁ = 1 if Δ_q(1) ≤ 0); for q ≥ 1/2 it always overshoots unless
clipped with δ ≥ −log q. Equivalently, with δ₁(q) = (γ₁(q) − q)²/(2q(1 − q)) (0 for q ≥ 1/2),
**KL(h‖q) ≤ δ iff δ ≤ δ₁(q_n) or δ ≥ −log q_n.** A simple sufficient form: γ ≤ 1 − q_n
(Cor. 6's γ ≤ 1/2 is the special case), and for q_n ≤ q* ≈ {q_star:.6f} (the root of
−log q = (1 − q)/(2q)) the closed form never exceeds δ, whatever δ.
"""


def phi_1p(shift: Array) -> Array:
    """φ(1 + w) = (1 + w) log(1 + w) − w for w >= −1, accurate to float64 for small w.

    φ(t) = t log t − t + 1 is the KL integrand (KL(a‖b) = Σ b φ(a/b)). Near w = 0 the direct
    form cancels to w²/2, so |w| < 0.05 uses the series Σ_{k>=2} (−w)^k / (k(k − 1)).
    """
    shift = np.asarray(shift, dtype=np.float64)
    small = np.abs(shift) < 0.05
    series = np.zeros_like(shift)
    power = shift * shift
    for order in range(2, 16):
        series += power / (order * (order - 1)) * (1.0 if order % 2 == 0 else -1.0)
        power = power * shift
    with np.errstate(divide="ignore", invalid="ignore"):
        direct = special.kl_div(1.0 + shift, 1.0)
    return np.where(small, series, direct)


def branch_kl_from_lift(lift: Array, target_gap: Array, target: Array | None = None) -> Array:
    """Binary KL(q + d ‖ q) from d = γ − q and u = 1 − q, without cancellation.

    KL = q φ(1 + d/q) + u φ(1 − d/u): two non-negative terms, each accurate. Pass ``target``
    (q) as well when it is known more accurately than 1 − u (q tiny).
    """
    lift = np.asarray(lift, dtype=np.float64)
    target_gap = np.asarray(target_gap, dtype=np.float64)
    target = 1.0 - target_gap if target is None else np.asarray(target, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        first = np.where(target > 0, target * phi_1p(lift / np.where(target > 0, target, 1)), 0)
        second = np.where(
            target_gap > 0, target_gap * phi_1p(-lift / np.where(target_gap > 0, target_gap, 1)), 0
        )
    return first + second


def closed_form_lift(target_gap: Array, delta: float, target: Array | None = None) -> Array:
    """d = γ − q for the closed form, from u = 1 − q (and q): min(u, √(2δ q u))."""
    target_gap = np.asarray(target_gap, dtype=np.float64)
    target = 1.0 - target_gap if target is None else np.asarray(target, dtype=np.float64)
    return np.minimum(target_gap, np.sqrt(2.0 * delta * target * target_gap))


def closed_form_branch_kl(target_mass: Array, delta: float) -> Array:
    """K(q, δ): the binary KL of the closed form's branch for verifier mass q."""
    target = np.asarray(target_mass, dtype=np.float64)
    target_gap = 1.0 - target
    lift = closed_form_lift(target_gap, delta, target)
    return branch_kl_from_lift(lift, target_gap, target)


def _branch_kl_at_gap(target_gap: Array, delta: float) -> Array:
    return branch_kl_from_lift(closed_form_lift(target_gap, delta), target_gap)


def analytic_overshoot(delta: Array) -> Array:
    """sup_q K(q, δ)/δ = log(1 + 2δ)/δ (δ > 0)."""
    delta = np.asarray(delta, dtype=np.float64)
    return np.log1p(2.0 * delta) / delta


def saturation_kink(delta: Array) -> Array:
    """q_s = 1/(1 + 2δ): the smallest q whose closed-form branch is clipped to γ = 1."""
    return 1.0 / (1.0 + 2.0 * np.asarray(delta, dtype=np.float64))


def delta_critical() -> float:
    """δ_c: the positive root of log(1 + 2δ) = δ; the closed form never overshoots for δ >= δ_c."""
    return float(optimize.brentq(lambda d: math.log1p(2.0 * d) - d, 0.5, 3.0, xtol=1e-15))


def measured_overshoot(delta: float, grid: int = 4000) -> tuple[float, float]:
    """(max over q of K(q, δ)/δ, the maximising q), found numerically without the formula.

    A dense grid in u = 1 − q (log-spaced near both ends, linear between) locates the peak;
    golden-section search on the bracketing grid cell then converges to float precision.
    Raises RuntimeError if the grid values are not unimodal (the derivation says they are).
    """
    gaps = np.unique(
        np.concatenate(
            [
                np.logspace(-17, 0, grid),  # q near 1
                np.linspace(0.0, 1.0, grid + 1)[1:-1],
                1.0 - np.logspace(-15, 0, grid),  # q near 0
            ]
        )
    )
    gaps = gaps[(gaps > 0) & (gaps < 1)]
    values = _branch_kl_at_gap(gaps, delta)
    peak = int(np.argmax(values))
    rising = np.diff(values[: peak + 1])
    falling = np.diff(values[peak:])
    slack = 1e-13 * values[peak]
    if np.any(rising < -slack) or np.any(falling > slack):
        raise RuntimeError(f"measured_overshoot: K(·, {delta}) is not unimodal on the grid")
    low = gaps[peak - 1] if peak > 0 else 0.0
    high = gaps[peak + 1] if peak + 1 < gaps.size else 1.0

    def value(gap: float) -> float:
        return float(_branch_kl_at_gap(np.array(gap), delta))

    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    left, right = high - ratio * (high - low), low + ratio * (high - low)
    f_left, f_right = value(left), value(right)
    for _ in range(200):
        if high - low <= 4 * np.spacing(high):
            break
        if f_left >= f_right:
            high, right, f_right = right, left, f_left
            left = high - ratio * (high - low)
            f_left = value(left)
        else:
            low, left, f_left = left, right, f_right
            right = low + ratio * (high - low)
            f_right = value(right)
    candidates = [(values[peak], gaps[peak]), (f_left, left), (f_right, right)]
    best_value, best_gap = max(candidates)
    return float(best_value / delta), float(1.0 - best_gap)


# --- Cor. 6, sharpened ---------------------------------------------------------------------


def _second_order_excess(raised: float, target: float) -> float:
    """Δ_q(γ) = KL(γ‖q) − (γ − q)²/(2q(1 − q))."""
    kl = float(special.kl_div(raised, target) + special.kl_div(1.0 - raised, 1.0 - target))
    return kl - (raised - target) ** 2 / (2.0 * target * (1.0 - target))


def q_star() -> float:
    """q*: the root in (0, 1/2) of −log q = (1 − q)/(2q); q <= q* never overshoots."""
    return float(
        optimize.brentq(lambda q: -math.log(q) - (1.0 - q) / (2.0 * q), 0.05, 0.5, xtol=1e-16)
    )


def gamma_one(target_mass: float) -> float:
    """γ₁(q): the largest γ with the unclipped closed form within budget (q if q >= 1/2)."""
    q = float(target_mass)
    if not 0.0 < q < 1.0:
        raise ValueError(f"target_mass: must lie strictly between 0 and 1, got {q!r}")
    if q >= 0.5:
        return q
    if _second_order_excess(1.0, q) <= 0.0:
        return 1.0
    # Δ_q < 0 at 1 − q (strictly inside its negative stretch) and > 0 at 1.
    return float(optimize.brentq(_second_order_excess, 1.0 - q, 1.0, args=(q,), xtol=1e-16))


def delta_one(target_mass: float) -> float:
    """δ₁(q) = (γ₁(q) − q)²/(2q(1 − q)): the largest unclipped budget that stays within δ."""
    q = float(target_mass)
    return (gamma_one(q) - q) ** 2 / (2.0 * q * (1.0 - q))


def predicted_within_budget(target_mass: float, delta: float) -> bool:
    """The sharp condition: KL(h‖q) <= δ iff δ <= δ₁(q) or δ >= −log q."""
    return delta <= delta_one(target_mass) or delta >= -math.log(target_mass)
