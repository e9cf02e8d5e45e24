"""γ*(q_n, δ) in torch (float64), the twin of ``cactus_theory.core.gamma``.

γ* is the largest mass the drafted token can be raised to within budget δ of a divergence:
the largest γ in [q_n, 1] with D((γ, 1−γ) ‖ (q_n, 1−q_n)) <= δ. χ², TV and squared
Hellinger have closed forms; KL, reverse KL and JS are solved by a safeguarded Newton
iteration from the right of the root (monotone, since D is convex and increasing in γ),
and every γ* is returned on the feasible side: D(γ*) <= δ as computed.
"""

from __future__ import annotations

import math

import torch

from cactus_theory.sampler.divergences import binary_divergence, binary_divergence_slope

Tensor = torch.Tensor


def _closed_form_gamma(q_n: Tensor, delta: float, name: str) -> Tensor:
    """γ* for chi2, tv and hellinger (exact closed forms; see ``cactus_theory.gamma``)."""
    if delta == 0.0:
        return q_n.clone()
    if name == "chi2":
        raised = torch.clamp(q_n + torch.sqrt(delta * q_n * (1.0 - q_n)), max=1.0)
    elif name == "tv":
        raised = torch.clamp(q_n + delta, max=1.0)
    elif delta >= 1.0:
        return torch.ones_like(q_n)
    else:
        # acos(1 − δ) = 2 asin(√(δ/2)), accurate for small δ.
        angle = torch.arcsin(torch.sqrt(q_n)) + 2.0 * math.asin(math.sqrt(delta / 2))
        raised = torch.clamp(torch.sin(torch.clamp(angle, max=math.pi / 2)) ** 2, max=1.0)
        raised = torch.maximum(raised, q_n)
    return _feasible_side(raised, q_n, delta, name)


def _feasible_side(raised: Tensor, q_n: Tensor, delta: float, name: str) -> Tensor:
    """Step γ down by ulps while rounding puts it over budget (``gamma._feasible_side``)."""
    for _ in range(8):
        over = (binary_divergence(name, raised, q_n) > delta) & (raised > q_n)
        if not bool(torch.any(over).item()):
            break
        lowered = torch.maximum(torch.nextafter(raised, torch.full_like(raised, -math.inf)), q_n)
        raised = torch.where(over, lowered, raised)
    return raised


def _upper_bracket(q_n: Tensor, delta: float, name: str) -> Tensor:
    """1, or for reverse KL 1 − (1−q) exp(−(δ − q log q)/(1−q)) (where D >= δ)."""
    if name != "reverse-kl":
        return torch.ones_like(q_n)
    q_log_q = torch.special.xlogy(q_n, q_n)
    below_one = q_n < 1.0
    spread = torch.where(below_one, 1.0 - q_n, torch.ones_like(q_n))
    exponent = -(delta - q_log_q) / spread
    upper = -torch.expm1(exponent) + q_n * torch.exp(exponent)  # 1 − (1 − q) e^t
    return torch.where(below_one, upper, torch.ones_like(q_n))


def feasible_newton_root(
    name: str, q_n: Tensor, delta: float, low: Tensor, high: Tensor, max_iterations: int = 100
) -> Tensor:
    """The largest x in [low, high] with D(x, q_n) <= δ, for D increasing and convex in x.

    Requires D(low) < δ < D(high). Safeguarded Newton from the right end: for a convex
    increasing g = D − δ, Newton from a point with g > 0 stays right of the root and
    converges monotonically; a step that leaves the bracket (or an infinite slope) becomes
    a bisection. An element stops once its step is below 1e-13 relative (rounding noise in
    g then dominates). Finally each x is moved down by 1, 2, 4, ... ulps until g <= 0 as
    computed (``low`` is feasible), so the budget holds on the returned value, as in
    ``roots.feasible_root``.
    """
    lo, hi, x = low.clone(), high.clone(), high.clone()
    done = torch.zeros_like(x, dtype=torch.bool)
    from_newton = torch.zeros_like(x, dtype=torch.bool)
    for iteration in range(max_iterations):
        excess = binary_divergence(name, x, q_n) - delta
        # A Newton iterate of a convex g never crosses the root in exact arithmetic, so
        # one with g <= 0 sits within rounding noise of it: stop there (it is feasible).
        done = done | (excess == 0) | (from_newton & (excess < 0))
        hi = torch.where(excess > 0, x, hi)
        lo = torch.where(excess <= 0, x, lo)
        slope = binary_divergence_slope(name, x, q_n)
        newton = x - excess / slope
        inside = torch.isfinite(slope) & torch.isfinite(newton) & (newton >= lo) & (newton <= hi)
        step = torch.where(done, x, torch.where(inside, newton, 0.5 * (lo + hi)))
        done = done | (torch.abs(step - x) <= 1e-13 * x) | (hi - lo <= 1e-13 * hi)
        from_newton = inside
        x = step
        if iteration % 4 == 3 and bool(torch.all(done).item()):
            break
    result = x
    for power in range(64):
        over = (binary_divergence(name, result, q_n) - delta) > 0
        if not bool(torch.any(over).item()):
            break
        lowered = torch.maximum(x - x * (2.0**power * 2.0**-52), lo)
        result = torch.where(over, lowered, result)
    return torch.maximum(result, low)


def exact_raised_mass(
    q_n: Tensor, delta: float, divergence: str = "kl", cap: Tensor | None = None
) -> Tensor:
    """γ*(q_n, δ) elementwise in float64, optionally min(γ*, cap) (``gamma.exact_raised_mass``).

    Returns float64. Roots are solved only where the answer is not already known: a cap at
    or below q_n is the answer; an upper end within budget is the answer (γ* = 1 for KL when
    −log q_n <= δ); KL at q_n = 0 gives γ* = 0.
    """
    q_n = q_n.to(torch.float64)
    bound = None if cap is None else cap.to(torch.float64).expand_as(q_n)
    if divergence in ("chi2", "hellinger", "tv") or delta == 0.0:
        raised = _closed_form_gamma(q_n, delta, divergence)
        return raised if bound is None else torch.minimum(raised, bound)
    gamma = q_n.clone()
    upper = _upper_bracket(q_n, delta, divergence)
    capped = torch.zeros_like(q_n, dtype=torch.bool)
    if bound is not None:
        upper = torch.minimum(upper, bound)
        capped = bound <= q_n
        gamma = torch.where(capped, bound, gamma)
    at_upper = binary_divergence(divergence, upper, q_n)
    saturated = (q_n < 1.0) & (at_upper <= delta) & ~capped
    gamma = torch.where(saturated, upper, gamma)
    stuck = (q_n <= 0.0) & (divergence == "kl")
    solve = (q_n < 1.0) & ~saturated & ~stuck & ~capped
    if bool(torch.any(solve).item()):
        where = solve.nonzero(as_tuple=True)
        low, high = q_n[where], upper[where]
        gamma = gamma.index_put(where, feasible_newton_root(divergence, low, delta, low, high))
    return gamma
