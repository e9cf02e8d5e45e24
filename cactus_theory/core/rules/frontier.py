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

Solution method (exact, in a fixed number of vectorised passes). Sort the ratios
r_x = p_x/q_x (r = +inf where q_x = 0). For a cap c = c_hi:

- acceptance is 1 − E(c), with excess E(c) = Σ_x (p_x − c q_x)_+;
- Σ h = 1 forces the lift to move the same mass: D(c_lo) = E(c), with
  D(t) = Σ_x (t q_x − p_x)_+;
- KL(h‖q) = Q_L φ(c_lo) + Σ_M q φ(r) + Q_H φ(c), φ(t) = t log t − t + 1, where L, M, H
  are the lifted, middle and capped tokens and Q_S = Σ_S q (P_S = Σ_S p).

Along the path c = 1 → max finite r (h moves from q towards p) the sets change only at
breakpoints: c passing a ratio r_k > 1 (k leaves H) and c_lo passing a ratio r_k < 1
(k leaves L). Between breakpoints c_lo(c) = (P_H + P_L − c Q_H)/Q_L is linear and KL is
smooth, increasing and convex: dKL/dc = Q_H log(c/c_lo) > 0. So:

1. every breakpoint is an event with a known moved mass m = E(r_k) or D(r_k); one argsort
   of these masses orders the events along the path and gives the sets at each of them
   from two prefix counts, hence c, c_lo and KL at any event in O(1);
2. KL increases along the path, so bisection over the sorted events (⌈log2(V+1)⌉ rounds)
   finds the events on either side of the root: the segment (L, H) that holds it;
3. on that segment safeguarded Newton from the right end converges monotonically, and c
   is then moved down by ulps until KL(h‖q) <= δ holds as computed.

The work is O(V log V) per row (two sorts, five prefix sums), then O(log V) bisection
rounds and a handful of Newton steps of O(1) each, all rows at once. Rows with zeros in
p or q are exact: q_x = 0 forces h_x = 0, p_x = 0 gives h_x = c_lo q_x. If the draft puts
mass where q = 0 the curve ends at c = max finite r (h = max(p, c_lo q) on supp q):
acceptance cannot exceed P_p(q > 0) within any finite KL.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from cactus_theory.core import divergences, roots, validate
from cactus_theory.core.rules.base import TargetRule, Tunable

Array = np.ndarray


class Frontier(TargetRule):
    """h = clip(p, c_lo q, c_hi q) with KL(h‖q) = δ: the output-law-optimal rule."""

    name: ClassVar[str] = "frontier"
    support_only: ClassVar[bool] = True
    lossless_at: ClassVar[Mapping[str, Any]] = {"delta": 0.0}
    tunable: ClassVar[Tunable] = Tunable("delta", 0.0, 1e4, log=True)
    greedy_consistent: ClassVar[bool] = True

    def __init__(self, delta: float) -> None:
        self.delta = validate.nonnegative("delta", delta)

    def params(self) -> dict[str, Any]:
        return {"delta": self.delta}

    def target_law(self, target_probs: Array, draft_probs: Array) -> Array:
        return frontier_target(target_probs, draft_probs, self.delta)


#: Below this vocabulary size prefix sums loop over the columns: numpy's cumsum is slow on
#: short rows (same additions, same order, same result).
SHORT_ROWS = 64
#: φ(t) for t below this is 1 to rounding; clamping there keeps log finite.
_TINY = 1e-300


def _phi(t: Array) -> Array:
    """φ(t) = t log t − t + 1 >= 0 (φ(0) = 1): the per-unit-q KL of h = t q.

    Computed as s log s − (s − 1) with s = max(t, 1e-300). np.log is accurate to an ulp of
    its result, so near t = 1 the error is O(ε |t − 1|) (as ``divergences.kl_terms``).
    """
    safe = np.maximum(t, _TINY)
    return np.maximum(safe * np.log(safe) - (safe - 1.0), 0.0)


def _prefix(values: Array) -> Array:
    """[R, V+1]: Σ of the first j values of each row, j = 0..V, added left to right."""
    rows, size = values.shape
    sums = np.zeros((rows, size + 1), dtype=values.dtype)
    if size > SHORT_ROWS:
        np.cumsum(values, axis=-1, out=sums[:, 1:])
    else:
        for column in range(size):
            np.add(sums[:, column], values[:, column], out=sums[:, column + 1])
    return sums


def _suffix(values: Array) -> Array:
    """[R, V+1]: Σ of the values from index j on, j = 0..V, added from the end (so a tiny
    mass at a large ratio is not lost next to the O(1) masses before it)."""
    rows, size = values.shape
    sums = np.zeros((rows, size + 1), dtype=values.dtype)
    if size > SHORT_ROWS:
        sums[:, :-1] = np.cumsum(values[:, ::-1], axis=-1)[:, ::-1]
    else:
        for column in range(size - 1, -1, -1):
            np.add(sums[:, column + 1], values[:, column], out=sums[:, column])
    return sums


def _reduce_rows(ufunc: np.ufunc, values: Array) -> Array:
    """ufunc.reduce over the last axis of [R, V] (a loop over the columns for short rows)."""
    size = values.shape[-1]
    if size > SHORT_ROWS or size == 0:
        return ufunc.reduce(values, axis=-1)
    result = values[:, 0].copy()
    for column in range(1, size):
        ufunc(result, values[:, column], out=result)
    return result


def _gather(table: Array, index: Array) -> Array:
    """table[r, index[r, ...]] for every row r of a 2-d ``table`` (index [R] or [R, K])."""
    rows, width = table.shape
    offsets = (np.arange(rows) * width).reshape((rows,) + (1,) * (index.ndim - 1))
    return np.ravel(table)[index + offsets]


def _tie_groups(ratio: Array) -> tuple[Array, Array] | None:
    """(start, end) per sorted position k: the first position with r_j = r_k and one past
    the last; None when no two ratios are equal (then they are k and k + 1)."""
    rows, size = ratio.shape
    same = ratio[:, 1:] == ratio[:, :-1]
    if not same.any():
        return None
    index = np.broadcast_to(np.arange(size), (rows, size))
    edge = np.ones((rows, 1), dtype=bool)
    starts = np.concatenate([edge, ~same], axis=-1)
    ends = np.concatenate([~same, edge], axis=-1)
    start = np.maximum.accumulate(np.where(starts, index, 0), axis=-1)
    end = np.minimum.accumulate(np.where(ends, index, size)[:, ::-1], axis=-1)[:, ::-1] + 1
    return start, end


class _Path:
    """Rows [R, V] sorted by ratio r = p/q (+inf where q = 0), with the sums the path needs.

    For j = 0..V: target_below[j] = Q_<j = Σ_{k<j} q_k, draft_below[j] = P_<j and
    kl_below[j] = Σ_{k<j} q_k φ(r_k) (finite r only); target_above[j] = Q_>=j and
    draft_above[j] = P_>=j. Tokens with r < 1 are the ones a lift can reach (``lifted``,
    positions [0, first_middle)), tokens with 1 < r < inf the ones a cap can reach
    (``capped``, positions [first_capped, first_infinite)); tokens with r = 1 keep h = p = q.
    """

    def __init__(self, target_rows: Array, draft_rows: Array, kl_terms: Array) -> None:
        rows, size = target_rows.shape
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            ratio = np.where(target_rows > 0, draft_rows / target_rows, np.inf)
        order = np.argsort(ratio, axis=-1, kind="stable")
        flat = order + np.arange(rows)[:, None] * size
        self.ratio = np.ravel(ratio)[flat]
        target_sorted = np.ravel(target_rows)[flat]
        draft_sorted = np.ravel(draft_rows)[flat]
        finite = np.isfinite(self.ratio)
        self.target_below = _prefix(target_sorted)
        self.draft_below = _prefix(draft_sorted)
        self.kl_below = _prefix(np.where(finite, np.ravel(kl_terms)[flat], 0.0))
        self.target_above = _suffix(target_sorted)
        self.draft_above = _suffix(draft_sorted)
        self.lifted = self.ratio < 1.0
        self.capped = finite & (self.ratio > 1.0)
        self.first_capped = _reduce_rows(np.add, (self.ratio <= 1.0).astype(np.intp))
        self.first_infinite = _reduce_rows(np.add, finite.astype(np.intp))
        #: The curve ends at c = max finite ratio (h = p on supp q), where E = P_{q=0}.
        last_finite = np.maximum(self.first_infinite - 1, 0)
        self.upper = np.maximum(1.0, _gather(self.ratio, last_finite))
        self.end_mass = _gather(self.draft_above, self.first_infinite)


class _Segment:
    """A piece of the path with fixed sets L = {<low}, H = {>=high} (sorted positions).

    There E(c) = P_H − c Q_H and D(c_lo) = c_lo Q_L − P_L, so Σ h = 1 gives
    c_lo(c) = (P_H + P_L − c Q_H)/Q_L, and
    KL(c) = Q_L φ(c_lo) + K_M + Q_H φ(c) with K_M = Σ_M q φ(r),
    dKL/dc = Q_H log(c / c_lo) > 0 and d²KL/dc² = Q_H (1/c + Q_H/(Q_L c_lo)) > 0.
    """

    def __init__(self, path: _Path, low: Array, high: Array) -> None:
        rows, width = path.draft_above.shape
        offsets = (np.arange(rows) * width).reshape((rows,) + (1,) * (low.ndim - 1))
        low, high = low + offsets, high + offsets
        self.draft_high = np.ravel(path.draft_above)[high]
        self.target_high = np.ravel(path.target_above)[high]
        self.draft_low = np.ravel(path.draft_below)[low]
        self.target_low = np.ravel(path.target_below)[low]
        kl_below = np.ravel(path.kl_below)
        self.kl_middle = np.maximum(kl_below[high] - kl_below[low], 0.0)

    def lift_for(self, cap: Array) -> Array:
        """c_lo(c) = (P_H + P_L − c Q_H)/Q_L."""
        moved = self.draft_high - cap * self.target_high
        return (moved + self.draft_low) / self.target_low

    def kl_at(self, cap: Array, lift: Array) -> Array:
        """Q_L φ(c_lo) + K_M + Q_H φ(c)."""
        return self.target_low * _phi(lift) + self.kl_middle + self.target_high * _phi(cap)

    def value_and_slope(self, cap: Array) -> tuple[Array, Array]:
        """``kl_and_slope`` under the name ``roots.NewtonTerms`` uses."""
        return self.kl_and_slope(cap)

    def kl_and_slope(self, cap: Array) -> tuple[Array, Array]:
        """(KL(c), dKL/dc = Q_H log(c / c_lo)) on this segment."""
        lift = self.lift_for(cap)
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = self.target_high * (np.log(cap) - np.log(lift))
        return self.kl_at(cap, lift), slope

    def take(self, rows: Array) -> _Segment:
        subset = object.__new__(_Segment)
        for key, value in vars(self).items():
            setattr(subset, key, value[rows])
        return subset


#: Packs two counts (each < 2^31) into one integer for a single prefix pass.
_CAP_UNIT = 1 << 31


class _Events:
    """The breakpoints of the path, sorted by the mass m they move (m falls as c rises).

    A capped token k is passed at c = r_k, where m = E(r_k) = Σ_{r_j > r_k} (p_j − r_k q_j);
    a lifted token k at c_lo = r_k, where m = D(r_k) = Σ_{r_j < r_k} (r_k q_j − p_j).
    (Tokens tied with r_k are left out: their terms are 0 but would leave rounding noise of
    size ε p_j, which can swamp a tiny m.) Tokens with r = 1 or r = inf are never passed;
    they sort last (m = +inf). In mass order, ``lifts_before[s]`` and ``caps_before[s]``
    count the lift and cap events at positions < s: the lift events with less mass are
    the tokens still lifted at event s, the cap events with more mass the ones passed.
    """

    def __init__(self, path: _Path) -> None:
        rows, size = path.ratio.shape
        groups = _tie_groups(path.ratio)
        with np.errstate(invalid="ignore", over="ignore"):
            if groups is None:  # D(r_k) from the tokens before k, E(r_k) from those after
                lift_mass = path.ratio * path.target_below[:, :-1] - path.draft_below[:, :-1]
                cap_mass = path.draft_above[:, 1:] - path.ratio * path.target_above[:, 1:]
            else:
                start, end = groups
                lift_mass = path.ratio * _gather(path.target_below, start)
                lift_mass -= _gather(path.draft_below, start)
                cap_mass = _gather(path.draft_above, end)
                cap_mass -= path.ratio * _gather(path.target_above, end)
        mass = np.where(path.lifted, lift_mass, np.where(path.capped, cap_mass, np.inf))
        self.path = path
        self.token = np.argsort(mass, axis=-1, kind="stable")
        flat = self.token + np.arange(rows)[:, None] * size
        self.mass = np.ravel(mass)[flat]
        kind = path.lifted.astype(np.intp) + path.capped.astype(np.intp) * _CAP_UNIT
        self.kind = np.ravel(kind)[flat]
        below = _prefix(self.kind)
        self.lifts_before, self.caps_before = below % _CAP_UNIT, below // _CAP_UNIT
        self.cap_count = self.caps_before[:, -1]

    def at(self, position: Array) -> tuple[Array, Array]:
        """(c, KL(h‖q)) at the event in each row's sorted ``position`` [R] (< V).

        A lift event at token k has L = {<k} and H = the cap events with less mass; a cap
        event at k has H = {>=k} and L = the lift events with less mass. KL is +inf for a
        lift event beyond the end of the curve (m <= P_{q=0}) and −inf for a non-event.
        """
        path = self.path
        token = _gather(self.token, position)
        mass = _gather(self.mass, position)
        kind = _gather(self.kind, position)
        lift_event, cap_event = kind == 1, kind == _CAP_UNIT
        low = np.where(lift_event, token, np.maximum(_gather(self.lifts_before, position), 1))
        passed = path.first_capped + self.cap_count - _gather(self.caps_before, position)
        sets = _Segment(path, low, np.where(cap_event, token, passed))
        ratio = _gather(path.ratio, token)
        with np.errstate(divide="ignore", invalid="ignore"):
            cap = np.where(cap_event, ratio, (sets.draft_high - mass) / sets.target_high)
            lift = np.where(lift_event, ratio, (mass + sets.draft_low) / sets.target_low)
            kl = sets.kl_at(cap, lift)
        beyond = lift_event & ((mass <= path.end_mass) | ~(sets.target_high > 0))
        kl = np.where(lift_event | cap_event, np.where(beyond, np.inf, kl), -np.inf)
        return np.where(lift_event | cap_event, cap, 1.0), kl


def _locate_root(events: _Events, delta: Array) -> tuple[Array, Array, Array]:
    """(s, c at event s − 1, c at event s) with s = #{events with KL > δ}, by bisection.

    KL falls along the mass order, so s is the first position with KL <= δ (V when none):
    ⌈log2(V + 1)⌉ rounds of one event evaluation per row. Each round that moves the lower
    end past an event records its c (the last one is event s − 1, the right end of the
    root's segment); each round that moves the upper end records the left end likewise.
    Rows where no event is past the root keep right = +inf; rows with none before it
    keep left = 1 (the start of the path).
    """
    rows, size = events.token.shape
    low = np.zeros(rows, dtype=np.intp)
    high = np.full(rows, size, dtype=np.intp)
    right = np.full(rows, np.inf)
    left = np.ones(rows)
    for _ in range(size.bit_length()):
        active = low < high
        middle = np.minimum((low + high) // 2, size - 1)
        cap, kl = events.at(middle)
        over = active & (kl > delta)
        within = active & ~over
        low = np.where(over, middle + 1, low)
        right = np.where(over, cap, right)
        high = np.where(within, middle, high)
        left = np.where(within, cap, left)
    return low, right, left


#: Relative step (and bracket width) at which the Newton iteration in c stops: a few ulps.
NEWTON_TOLERANCE = roots.NEWTON_TOLERANCE
#: Most safeguarded Newton steps per row (a handful are taken; bisections are rare).
NEWTON_STEPS = 200


def _newton_cap(segment: _Segment, delta: Array, low: Array, high: Array) -> tuple[Array, Array]:
    """(c, feasible lower end) with KL(c) = δ to rounding on one segment, from c = ``high``.

    Requires KL(low) < δ <= KL(high) in exact terms. KL is convex and increasing in c, so
    ``roots.newton_from_right`` applies: an infinite slope (c_lo = 0 at the right end) or a
    step outside the bracket becomes a bisection (geometric when the bracket spans a factor
    > 4). Rows left unsettled after ``NEWTON_STEPS`` are returned as they are.
    """
    found, feasible_low, _, _ = roots.newton_from_right(
        segment,
        delta,
        high,
        low,
        high,
        steps=NEWTON_STEPS,
        from_newton=np.ones(high.shape, dtype=bool),
        geometric_above=4.0,
    )
    return found, feasible_low


def frontier_constants(
    target_probs: Array, draft_probs: Array, delta: float | Array
) -> tuple[Array, Array]:
    """(c_lo, c_hi) per row for validated rows [..., V]; see the module docstring.

    ``delta`` is one budget or one per row (shape [...], broadcast against the rows).
    Rows with KL(p‖q) <= δ get (0, +inf) (h = p); δ = 0 gives (1, 1) (h = q).
    """
    batch_shape = target_probs.shape[:-1]
    target_rows = target_probs.reshape(-1, target_probs.shape[-1])
    draft_rows = draft_probs.reshape(-1, draft_probs.shape[-1])
    budget = np.broadcast_to(np.asarray(delta, dtype=np.float64), batch_shape).reshape(-1)
    lift = np.ones(target_rows.shape[0])
    cap = np.ones(target_rows.shape[0])
    spending = budget > 0
    if spending.any():
        kl_terms = divergences.kl_terms(draft_rows, target_rows)
        draft_fits = spending & (kl_terms.sum(axis=-1) <= budget)
        lift[draft_fits], cap[draft_fits] = 0.0, np.inf
        todo = np.flatnonzero(spending & ~draft_fits)
        if todo.size == draft_fits.size:
            lift, cap = _solve_caps(target_rows, draft_rows, kl_terms, budget)
        elif todo.size:
            lift[todo], cap[todo] = _solve_caps(
                target_rows[todo], draft_rows[todo], kl_terms[todo], budget[todo]
            )
    return lift.reshape(batch_shape), cap.reshape(batch_shape)


def _solve_caps(
    target_rows: Array, draft_rows: Array, kl_terms: Array, delta: Array
) -> tuple[Array, Array]:
    """(c_lo, c_hi) for rows [R, V] with KL(p‖q) > δ > 0 (steps 1–3 of the module docstring).

    With s events past the root (``_locate_root``), the root's segment has L = the lift
    events among them and H = the tokens of their cap events (plus r = inf); events s − 1
    and s bound it. Newton starts from the smaller of the right end and the tangent root
    at the left end (an upper bound, by convexity). When no cap event is past the root the
    curve ends first: c = max finite ratio. A budget below the rounding noise of KL at the
    segment's left end keeps that end.
    """
    path = _Path(target_rows, draft_rows, kl_terms)
    events = _Events(path)
    past, right, left = _locate_root(events, delta)
    low = np.maximum(_gather(events.lifts_before, past), 1)
    high = path.first_capped + events.cap_count - _gather(events.caps_before, past)
    segment = _Segment(path, low, high)
    left = np.maximum(left, 1.0)
    right = np.maximum(np.fmin(right, path.upper), left)
    cap = path.upper.copy()
    reaches = high < path.first_infinite
    at_left, slope = segment.kl_and_slope(left)
    starts_over = at_left >= delta
    cap[reaches & starts_over] = left[reaches & starts_over]
    solve = np.flatnonzero(reaches & ~starts_over)
    if solve.size:
        part = segment.take(solve)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            tangent = left[solve] - (at_left[solve] - delta[solve]) / slope[solve]
        start = np.where(tangent > left[solve], np.fmin(tangent, right[solve]), right[solve])
        found, feasible_low = _newton_cap(part, delta[solve], left[solve], start)
        # c moves down by ulps until KL(h‖q) <= δ as computed.
        cap[solve] = roots.step_down_to_budget(
            lambda rows, caps: part.take(rows).kl_and_slope(caps)[0],
            found,
            feasible_low,
            delta[solve],
        )
    # c_lo <= 1 <= c_hi (KKT). The balance Σ h = 1 can put c_lo above 1 only in rows whose
    # small masses lie below the rounding of their large ones (p_x = q_x = 1.0 beside
    # masses of 1e-250: the rows sum to 1 in float64 but their small parts do not balance);
    # there c_lo = 1 keeps h a law to rounding instead of lifting h_x = q_x = 1 to 2.5.
    return np.minimum(segment.lift_for(cap), 1.0), cap


def frontier_target(target_probs: Array, draft_probs: Array, delta: float | Array) -> Array:
    """h = clip(p, c_lo q, c_hi q) for validated rows [..., V] (see the module docstring);
    ``delta`` is one budget or one per row (shape [...])."""
    if np.all(np.asarray(delta) == 0):
        return target_probs
    lift, cap = frontier_constants(target_probs, draft_probs, delta)
    with np.errstate(invalid="ignore"):
        upper = np.where(target_probs > 0, cap[..., None] * target_probs, 0.0)
    # Not renormalised: the lift already makes Σ h = 1 (to rounding), and dividing by the
    # sum would move the tokens that keep h_x = p_x off p_x.
    return np.clip(draft_probs, lift[..., None] * target_probs, upper)
