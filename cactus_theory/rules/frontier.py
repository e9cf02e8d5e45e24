"""The frontier rule: the acceptance-optimal h whose *emitted* law stays within δ.

Choose one h, independent of the drafted token, solving

    maximise Σ_x min(p_x, h_x)  subject to  KL(h‖q) <= δ,  h in the simplex,

and run generalised SpS against it. Because h does not depend on n, the emitted token is
distributed exactly as h, so the budget holds for what is emitted; and since any scheme
with output law μ accepts at most Σ min(p, μ) (maximal coupling), no scheme whose emitted
law is within δ accepts more. This traces the exact acceptance–divergence Pareto frontier.

KKT conditions give h_x = clip(p_x, c_lo q_x, c_hi q_x) with c_lo <= 1 <= c_hi:
tokens the draft over-weights (p_x > c_hi q_x) are capped at c_hi q_x, tokens it
under-weights (p_x < c_lo q_x) are lifted to c_lo q_x, the rest keep p_x. The two constants
are fixed by Σ h = 1 and KL(h‖q) = δ (h = p when KL(p‖q) <= δ, h = q when δ = 0).

Solution method (exact up to one scalar root). Sort the ratios r_x = p_x/q_x (r = +inf
where q_x = 0). For a cap c = c_hi:

- acceptance is 1 − E(c), with excess E(c) = Σ_x (p_x − c q_x)_+;
- Σ h = 1 forces the lift to move the same mass: D(c_lo) = E(c), with
  D(c) = Σ_x (c q_x − p_x)_+, a piecewise-linear increasing function inverted exactly
  from prefix sums over the sorted ratios;
- KL(h‖q) = Q_lo φ(c_lo) + Σ_mid q φ(r) + Q_hi φ(c_hi), φ(t) = t log t − t + 1, which
  increases with c along this path. ``roots.feasible_root`` (scipy's vectorised
  Chandrupatla) solves KL = δ for c in [1, max(1, max finite r)] over a batch and returns
  the feasible end of its final bracket, so KL(h‖q) <= δ holds as computed.

Each evaluation is O(V) per row; the sort is O(V log V). Rows with zeros in p or q are
exact: q_x = 0 forces h_x = 0, p_x = 0 gives h_x = c_lo q_x. If the draft puts mass where
q = 0 the curve ends at c = max finite r (h = max(p, c_lo q) on supp q): acceptance
cannot exceed P_p(q > 0) within any finite KL.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from scipy import special

from cactus_theory import divergences, roots, validate
from cactus_theory.rules.base import TargetRule

Array = np.ndarray


class Frontier(TargetRule):
    """h = clip(p, c_lo q, c_hi q) with KL(h‖q) = δ: the output-law-optimal rule."""

    name: ClassVar[str] = "frontier"

    def __init__(self, delta: float) -> None:
        self.delta = validate.nonnegative("delta", delta)

    def params(self) -> dict[str, Any]:
        return {"delta": self.delta}

    def target_law(self, target_probs: Array, draft_probs: Array) -> Array:
        return frontier_target(target_probs, draft_probs, self.delta)


def _phi(t: Array) -> Array:
    """φ(t) = t log t − t + 1 >= 0, the per-unit-q KL contribution of h = t q."""
    return special.kl_div(t, 1.0)


def _tail_sums(rows: Array) -> Array:
    """[..., k] = Σ_{j >= k} rows[..., j]."""
    return np.cumsum(rows[..., ::-1], axis=-1)[..., ::-1]


class _SortedRows:
    """Per-row sorted ratios and prefix sums that make every evaluation O(V)."""

    def __init__(self, target_probs: Array, draft_probs: Array) -> None:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(target_probs > 0, draft_probs / target_probs, np.inf)
        order = np.argsort(ratio, axis=-1, kind="stable")
        self.ratio = np.take_along_axis(ratio, order, axis=-1)
        target_sorted = np.take_along_axis(target_probs, order, axis=-1)
        draft_sorted = np.take_along_axis(draft_probs, order, axis=-1)
        finite = np.isfinite(self.ratio)
        kl_terms = np.where(finite, special.kl_div(draft_sorted, target_sorted), 0.0)
        zero = np.zeros(target_probs.shape[:-1] + (1,))
        self.target_cum = np.concatenate([zero, np.cumsum(target_sorted, axis=-1)], axis=-1)
        self.draft_cum = np.concatenate([zero, np.cumsum(draft_sorted, axis=-1)], axis=-1)
        # Tail sums (elements from k on), summed directly: total − prefix would cancel and
        # lose a tail of tiny masses (q = 1e-27 next to q ≈ 1) entirely.
        self.target_tail = np.concatenate([_tail_sums(target_sorted), zero], axis=-1)
        self.draft_tail = np.concatenate([_tail_sums(draft_sorted), zero], axis=-1)
        self.kl_cum = np.concatenate([zero, np.cumsum(kl_terms, axis=-1)], axis=-1)
        # D at each breakpoint: D(r_k) = r_k Q[k] − P[k] (elements strictly before k).
        with np.errstate(invalid="ignore"):
            lift = self.ratio * self.target_cum[..., :-1] - self.draft_cum[..., :-1]
        self.lift_at_breaks = np.where(finite, lift, np.inf)
        self.max_finite_ratio = np.max(np.where(finite, self.ratio, 0.0), axis=-1)

    def take(self, rows: Array) -> _SortedRows:
        subset = object.__new__(_SortedRows)
        for key, value in vars(self).items():
            setattr(subset, key, value[rows])
        return subset

    def count_below(self, value: Array, *, strict: bool) -> Array:
        """#{x : r_x < value} (strict) or #{x : r_x <= value}, per row."""
        compare = np.less if strict else np.less_equal
        return compare(self.ratio, value[..., None]).sum(axis=-1)

    def gather(self, prefix: Array, count: Array) -> Array:
        return np.take_along_axis(prefix, count[..., None], axis=-1)[..., 0]

    def lift_for_cap(self, cap: Array) -> Array:
        """c_lo with D(c_lo) = E(cap): the lift that puts back the mass the cap removes."""
        above = self.count_below(cap, strict=False)
        target_above = self.gather(self.target_tail, above)
        draft_above = self.gather(self.draft_tail, above)
        excess = np.maximum(draft_above - cap * target_above, 0.0)
        # The lift lies in [r_{m−1}, r_m] with m = #{k : D(r_k) <= excess} >= 1.
        segment = (self.lift_at_breaks <= excess[..., None]).sum(axis=-1)
        segment = np.maximum(segment, 1)
        lift = (excess + self.gather(self.draft_cum, segment)) / self.gather(
            self.target_cum, segment
        )
        return np.minimum(lift, cap)

    def kl_for_cap(self, cap: Array) -> Array:
        """KL(h‖q) for h = clip(p, c_lo q, cap q) with c_lo = lift_for_cap(cap)."""
        lift = self.lift_for_cap(cap)
        low = self.count_below(lift, strict=True)
        high = self.count_below(cap, strict=False)
        target_low = self.gather(self.target_cum, low)
        target_high = self.gather(self.target_tail, high)
        middle = self.gather(self.kl_cum, high) - self.gather(self.kl_cum, low)
        return target_low * _phi(lift) + middle + target_high * _phi(cap)


def frontier_constants(
    target_probs: Array, draft_probs: Array, delta: float
) -> tuple[Array, Array]:
    """(c_lo, c_hi) per row for validated rows [..., V]; see the module docstring.

    Rows with KL(p‖q) <= δ get (0, +inf) (h = p); δ = 0 gives (1, 1) (h = q).
    """
    batch_shape = target_probs.shape[:-1]
    target_rows = target_probs.reshape(-1, target_probs.shape[-1])
    draft_rows = draft_probs.reshape(-1, draft_probs.shape[-1])
    lift = np.ones(target_rows.shape[0])
    cap = np.ones(target_rows.shape[0])
    if delta > 0:
        draft_fits = divergences.kl_rows(draft_rows, target_rows) <= delta
        lift[draft_fits], cap[draft_fits] = 0.0, np.inf
        todo = np.flatnonzero(~draft_fits)
        if todo.size:
            lift[todo], cap[todo] = _solve_caps(target_rows[todo], draft_rows[todo], delta)
    return lift.reshape(batch_shape), cap.reshape(batch_shape)


def _solve_caps(target_rows: Array, draft_rows: Array, delta: float) -> tuple[Array, Array]:
    sorted_rows = _SortedRows(target_rows, draft_rows)
    upper = np.maximum(1.0, sorted_rows.max_finite_ratio)
    cap = upper.copy()
    # The curve can end before KL reaches δ (draft mass where q = 0): then take its end.
    reaches = sorted_rows.kl_for_cap(upper) > delta
    rows = np.flatnonzero(reaches & (upper > 1.0))
    if rows.size:

        def excess_kl(c: Array, row: Array) -> Array:
            return sorted_rows.take(row.astype(np.intp)).kl_for_cap(c) - delta

        cap[rows] = roots.feasible_root(
            excess_kl, np.ones(rows.size), upper[rows], args=(rows.astype(np.float64),)
        )
    return sorted_rows.lift_for_cap(cap), cap


def frontier_target(target_probs: Array, draft_probs: Array, delta: float) -> Array:
    """h = clip(p, c_lo q, c_hi q) for validated rows [..., V] (see the module docstring)."""
    if delta == 0:
        return target_probs
    lift, cap = frontier_constants(target_probs, draft_probs, delta)
    with np.errstate(invalid="ignore"):
        upper = np.where(target_probs > 0, cap[..., None] * target_probs, 0.0)
    adjusted = np.clip(draft_probs, lift[..., None] * target_probs, upper)
    return adjusted / adjusted.sum(axis=-1, keepdims=True)
