"""The sorted solve of the frontier constants (c_lo, c_hi), batched: the torch twin of
``cactus_theory.core.rules.frontier._solve_caps`` (whose docstring derives it).

Sort the ratios r = p/q (+inf where q = 0) and take prefix and suffix sums of q, p and the
KL terms q φ(r) (``_Path``); locate the root's segment (fixed lifted set L and capped set H)
by two searches over the sorted ratios (``_locate_root``); solve c_hi on that segment by
safeguarded Newton from the right, then move c down by ulps until KL(h‖q) <= δ as computed;
c_lo follows from Σ h = 1. ``solve_caps`` serves short rows, the solves of the binned
bracketing (``frontier_binned``) and its fallback. Sums and solves are float64.
"""

from __future__ import annotations

import math

import torch

from cactus_theory.core.rules import frontier as frontier_rule

Tensor = torch.Tensor


def _prefix(values: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """[R, V+1]: Σ of the first j values, j = 0..V (the cumsum written in place)."""
    rows, size = values.shape
    sums = torch.zeros(rows, size + 1, dtype=dtype or values.dtype, device=values.device)
    torch.cumsum(values, dim=-1, dtype=dtype, out=sums[:, 1:])
    return sums


def _suffix(values: Tensor) -> Tensor:
    """[R, V+1]: Σ of the values from index j on, summed from the end (tiny tails kept)."""
    return _prefix(values.flip(-1)).flip(-1)


def _at(table: Tensor, index: Tensor) -> Tensor:
    """table[r, index[r]] per row for index [R], or table[r, index[r, j]] for index [R, m]
    (any integer dtype)."""
    if index.dim() == 2:
        return table.gather(-1, index.long())
    return table.gather(-1, index.long()[:, None])[:, 0]


def _per_row(values: Tensor, position: Tensor) -> Tensor:
    """Per-row values [R] shaped to broadcast against positions [R] or [R, m]."""
    return values if position.dim() == 1 else values[:, None]


def _phi(t: Tensor) -> Tensor:
    """φ(t) = t log t − t + 1 >= 0 (φ(0) = 1), as s log s − (s − 1) with s = max(t, 1e-300)."""
    safe = torch.clamp(t, min=1e-300)
    return torch.clamp(safe * torch.log(safe) - (safe - 1.0), min=0.0)


def _tie_groups(ratio: Tensor) -> tuple[Tensor, Tensor] | None:
    """(start, end) per sorted position k: the first position with r_j = r_k and one past
    the last (``rules.frontier._tie_groups``); None when no two ratios are equal."""
    rows, size = ratio.shape
    same = ratio[:, 1:] == ratio[:, :-1]
    if not bool(same.any().item()):
        return None
    index = torch.arange(size, device=ratio.device).expand(rows, size)
    edge = torch.ones_like(same[:, :1])
    start = torch.cummax(torch.where(torch.cat([edge, ~same], dim=-1), index, 0), dim=-1)
    end_marks = torch.where(torch.cat([~same, edge], dim=-1), index, size).flip(-1)
    end = torch.cummin(end_marks, dim=-1).values.flip(-1) + 1
    return start.values, end


class _Path:
    """Sorted ratios r = p/q (+inf where q = 0) with prefix and suffix sums
    (``rules.frontier._Path``)."""

    def __init__(self, target_rows: Tensor, draft_rows: Tensor, kl_terms: Tensor) -> None:
        positive = target_rows > 0
        safe_target = torch.where(positive, target_rows, torch.ones_like(target_rows))
        ratio = torch.where(positive, draft_rows / safe_target, math.inf)
        self.ratio, order = torch.sort(ratio, dim=-1, stable=True)
        del ratio, positive, safe_target
        target_sorted = target_rows.gather(-1, order)
        draft_sorted = draft_rows.gather(-1, order)
        finite = torch.isfinite(self.ratio)
        self.target_below = _prefix(target_sorted)  # lifted side: small ratios
        self.draft_below = _prefix(draft_sorted)
        self.kl_below = _prefix(torch.where(finite, kl_terms.gather(-1, order), 0.0))
        self.target_above = _suffix(target_sorted)  # capped side: large ratios
        self.draft_above = _suffix(draft_sorted)
        del target_sorted, draft_sorted, order
        self.lifted = self.ratio < 1.0
        self.capped = finite & (self.ratio > 1.0)
        self.first_capped = (self.ratio <= 1.0).sum(dim=-1)
        self.first_infinite = finite.sum(dim=-1)
        last_finite = torch.clamp(self.first_infinite - 1, min=0)  # garbage rows: none
        self.upper = torch.clamp(_at(self.ratio, last_finite), min=1.0)
        self.end_mass = _at(self.draft_above, self.first_infinite)
        # D(r_k) = Σ_{r_i < r_k} (r_k q_i − p_i) (tied tokens left out), made nondecreasing
        # against rounding so that it can be searched.
        self.ties = _tie_groups(self.ratio)
        if self.ties is None:
            lift = self.ratio * self.target_below[:, :-1] - self.draft_below[:, :-1]
        else:
            start = self.ties[0]
            lift = self.ratio * self.target_below.gather(-1, start)
            lift -= self.draft_below.gather(-1, start)
        lift = torch.where(finite, lift, math.inf)
        self.lift_at_breaks = torch.cummax(lift, dim=-1).values


class _Segment:
    """Fixed sets L = {<low}, H = {>=high}: c_lo(c) = (P_H + P_L − c Q_H)/Q_L and
    KL(c) = Q_L φ(c_lo) + K_M + Q_H φ(c) (``rules.frontier._Segment``)."""

    def __init__(self, path: _Path, low: Tensor, high: Tensor) -> None:
        self.draft_high = _at(path.draft_above, high)
        self.target_high = _at(path.target_above, high)
        self.draft_low = _at(path.draft_below, low)
        self.target_low = _at(path.target_below, low)
        middle = _at(path.kl_below, high) - _at(path.kl_below, low)
        self.kl_middle = torch.clamp(middle, min=0.0)

    def lift_for(self, cap: Tensor) -> Tensor:
        return (self.draft_high - cap * self.target_high + self.draft_low) / self.target_low

    def kl_at(self, cap: Tensor, lift: Tensor) -> Tensor:
        return self.target_low * _phi(lift) + self.kl_middle + self.target_high * _phi(cap)

    def kl_and_slope(self, cap: Tensor) -> tuple[Tensor, Tensor]:
        """(KL(c), dKL/dc = Q_H log(c / c_lo))."""
        lift = self.lift_for(cap)
        slope = self.target_high * (torch.log(cap) - torch.log(lift))
        return self.kl_at(cap, lift), slope


def _cap_event_kl(path: _Path, position: Tensor) -> Tensor:
    """KL(h‖q) at c = r_k for each row's sorted position k, [R] or [R, m] (k capped).

    E(r_k) = Σ_{r_j > r_k} (p_j − r_k q_j) = P_>=j − r_k Q_>=j with j one past k's ties.
    The lift solves D(c_lo) = E: with l = #{i : D(r_i) <= E} (a search of the
    nondecreasing breakpoint values D(r_i)), L = {<l} and c_lo = (E + P_L)/Q_L, and
    KL = Q_L φ(c_lo) + Σ_{l<=i<j} q φ(r) + Q_>=j φ(r_k).
    """
    ratio = _at(path.ratio, position)
    after = position + 1 if path.ties is None else _at(path.ties[1], position)
    target_high = _at(path.target_above, after)
    moved = torch.clamp(_at(path.draft_above, after) - ratio * target_high, min=0.0)
    queries = moved.reshape(moved.shape[0], -1)
    below = torch.searchsorted(path.lift_at_breaks, queries, right=True).reshape(moved.shape)
    below = torch.clamp(below, min=1)
    target_low = _at(path.target_below, below)
    lift = torch.minimum((moved + _at(path.draft_below, below)) / target_low, ratio)
    middle = torch.clamp(_at(path.kl_below, after) - _at(path.kl_below, below), min=0.0)
    return target_low * _phi(lift) + middle + target_high * _phi(ratio)


def _bisect(first: Tensor, last: Tensor, rounds: int, predicate) -> Tensor:
    """The first position in [first, last) where a monotone ``predicate`` (false, then
    true) holds, per row (``last`` when none): ``rounds`` >= log2(V + 1) bisection steps,
    no host synchronisation."""
    low, high = first.clone(), last.clone()
    for _ in range(rounds):
        active = low < high
        middle = torch.minimum((low + high) // 2, torch.clamp(last - 1, min=0))
        holds = predicate(middle)
        high = torch.where(active & holds, middle, high)
        low = torch.where(active & ~holds, middle + 1, low)
    return low


#: Up to this many elements (rows × V) by device type, ``_first_position`` evaluates the
#: predicate at every position at once instead of bisecting: a few passes over [R, V]
#: cost less than 2 log2(V) rounds of small kernels there. CPU: measured crossover about
#: 3e4 elements on one thread (5 rows × 4096: 7.8 ms dense vs 12.1 ms bisecting; 20 ×
#: 4096: 30 vs 20 ms). CUDA: a guess from kernel-launch costs, not measured on a GPU.
DENSE_SEARCH_ELEMENTS = {"cuda": 1 << 22, "cpu": 1 << 15}


def _first_position(first: Tensor, last: Tensor, rounds: int, predicate, size: int) -> Tensor:
    """The first position in [first, last) where a monotone ``predicate`` (false, then
    true) holds, per row (``last`` when none): ``_bisect``, or for small problems (see
    ``DENSE_SEARCH_ELEMENTS``) one evaluation at every position [R, V]."""
    rows = first.shape[0]
    if rows * size > DENSE_SEARCH_ELEMENTS.get(first.device.type, 0):
        return _bisect(first, last, rounds, predicate)
    positions = torch.arange(size, device=first.device).expand(rows, size)
    inside = (positions >= first[:, None]) & (positions < last[:, None])
    hits = torch.where(inside & predicate(positions), positions, size)
    return torch.minimum(hits.amin(dim=-1), last)


def _locate_root(path: _Path, delta: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(low, high, left, right): the root's segment L = {<low}, H = {>=high} and its ends.

    Two bisections over the sorted ratios, O(log V) steps of O(1) work per row:

    1. KL at a cap breakpoint c = r_k (``_cap_event_kl``) rises with k, so ``high`` is
       the first capped position with KL > δ (first_infinite when none: the curve ends
       first), and c lies in [c_a, c_b] = [max(1, r_{high−1}), r_high].
    2. With H fixed, E(c) = P_H − c Q_H, so lift breakpoint i (c_lo = r_i) is passed at
       c_i = (P_H − D_i)/Q_H, where KL = Q_<i φ(r_i) + Σ_{i<=k<high} q φ(r) + Q_H φ(c_i).
       A lifted token i is still lifted at the root iff D_i < E(c_b), or
       D_i < E(c_a) and KL_i > δ; this holds for the first ``low`` of them.

    The nearest lift events on either side narrow [c_a, c_b] to the segment [left, right].
    The same segment as ``rules.frontier._locate_root`` (which sorts all breakpoints by
    the mass they move and bisects over them), without a second sort.
    """
    size = path.ratio.shape[-1]
    rounds = size.bit_length()
    high = _first_position(
        path.first_capped,
        path.first_infinite,
        rounds,
        lambda position: _cap_event_kl(path, position) > delta,
        size,
    )
    reaches = high < path.first_infinite
    low_cap = torch.where(
        high > path.first_capped, _at(path.ratio, torch.clamp(high - 1, min=0)), 1.0
    )
    low_cap = torch.clamp(low_cap, min=1.0)
    high_cap = torch.where(reaches, _at(path.ratio, torch.clamp(high, max=size - 1)), path.upper)
    draft_high, target_high = _at(path.draft_above, high), _at(path.target_above, high)
    safe_target = torch.where(target_high > 0, target_high, 1.0)
    kl_high = _at(path.kl_below, high)
    # Moved mass at both ends: E(c_b) = P_{q=0} once the curve has ended (Q_H = 0).
    mass_right = torch.clamp(draft_high - high_cap * target_high, min=0.0)
    mass_left = torch.where(reaches, draft_high - low_cap * target_high, mass_right)

    def still_lifted(position: Tensor) -> Tensor:
        def row(values: Tensor) -> Tensor:
            return _per_row(values, position)

        breaks = _at(path.lift_at_breaks, position)
        cap = (row(draft_high) - breaks) / row(safe_target)
        middle = torch.clamp(row(kl_high) - _at(path.kl_below, position), min=0.0)
        ratio = _at(path.ratio, position)
        kl = _at(path.target_below, position) * _phi(ratio) + middle + row(target_high) * _phi(cap)
        return (breaks < row(mass_right)) | ((breaks < row(mass_left)) & (kl > delta))

    first_middle = path.lifted.sum(dim=-1)
    low = _first_position(
        torch.zeros_like(first_middle), first_middle, rounds, lambda k: ~still_lifted(k), size
    )
    low = torch.clamp(low, min=1)
    # The lift events next to the root: l − 1 (still lifted, passed at a larger c) and l.
    right = torch.fmin(high_cap, (draft_high - _at(path.lift_at_breaks, low - 1)) / safe_target)
    following = torch.clamp(low, max=size - 1)
    at_next = (draft_high - _at(path.lift_at_breaks, following)) / safe_target
    left = torch.where(low < first_middle, torch.fmax(low_cap, at_next), low_cap)
    return low, high, left, torch.maximum(right, left)


#: Newton steps between host synchronisations (the convergence check).
NEWTON_BLOCK = 4


def _newton_cap(
    segment: _Segment, delta: float, low: Tensor, high: Tensor, done: Tensor
) -> tuple[Tensor, Tensor]:
    """Safeguarded Newton from c = ``high`` on each row's segment (rows already ``done``
    are left alone): ``rules.frontier._newton_cap``, checking convergence on the host once
    every ``NEWTON_BLOCK`` steps."""
    cap = high.clone()
    from_newton = torch.ones_like(done)
    tolerance = frontier_rule.NEWTON_TOLERANCE
    for iteration in range(frontier_rule.NEWTON_STEPS):
        kl, slope = segment.kl_and_slope(cap)
        excess = kl - delta
        over = excess > 0
        high = torch.where(over, cap, high)
        low = torch.where(over, low, cap)
        done = done | (~over & from_newton) | (excess == 0)
        step = excess / slope
        usable = torch.isfinite(slope) & (slope > 0)
        newton = cap - step
        small = usable & (step.abs() <= tolerance * cap)
        inside = usable & (newton >= low) & (newton <= high)
        middle = torch.where(
            high > 4.0 * low, torch.sqrt(low) * torch.sqrt(high), 0.5 * (low + high)
        )
        settled = done | small | (high - low <= tolerance * high)
        cap = torch.where(done, cap, torch.where(inside, newton, middle))
        done, from_newton = settled, inside
        if iteration % NEWTON_BLOCK == NEWTON_BLOCK - 1 and bool(done.all().item()):
            break
    return cap, low


def _feasible_cap(
    segment: _Segment, delta: float, cap: Tensor, low: Tensor, rows: Tensor
) -> Tensor:
    """Move c down by 1, 2, 4, ... ulps (not below ``low``) until KL(c) <= δ as computed,
    on the ``rows`` (a mask) that Newton solved."""
    for power in range(64):
        over = rows & (segment.kl_and_slope(cap)[0] > delta)
        if not bool(over.any().item()):
            break
        lowered = torch.maximum(cap - cap * 2.0 ** (power - 52), low)
        cap = torch.where(over, lowered, cap)
    return cap


def solve_caps(
    target_rows: Tensor, draft_rows: Tensor, kl_terms: Tensor, delta: float
) -> tuple[Tensor, Tensor]:
    """(c_lo, c_hi) for rows with KL(p‖q) > δ > 0, in the fixed passes of
    ``rules.frontier._solve_caps``: sort the ratios, find the root's segment from KL at
    the breakpoints (``_locate_root``), Newton on it from the right, then ulps down until
    KL(h‖q) <= δ as computed. Rows whose curve ends first get c = max finite ratio; a
    budget below the rounding noise of KL at the segment's left end keeps that end.
    """
    path = _Path(target_rows, draft_rows, kl_terms)
    low, high, left, right = _locate_root(path, delta)
    segment = _Segment(path, low, high)
    reaches = high < path.first_infinite
    at_left, slope = segment.kl_and_slope(left)
    starts_over = at_left >= delta
    tangent = left - (at_left - delta) / slope
    start = torch.where(tangent > left, torch.fmin(tangent, right), right)
    solve = reaches & ~starts_over
    found, feasible_low = _newton_cap(segment, delta, left, start, ~solve)
    found = _feasible_cap(segment, delta, found, feasible_low, solve)
    cap = torch.where(solve, found, torch.where(reaches, left, path.upper))
    # c_lo <= 1 <= c_hi (KKT): as ``rules.frontier._solve_caps``, a balance above 1 (small
    # masses below the rounding of the large ones) is c_lo = 1.
    return segment.lift_for(cap).clamp(max=1.0), cap
