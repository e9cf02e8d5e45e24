"""The frontier rule in torch: the solves of ``cactus_theory.core.rules.frontier``, batched.

h = clip(p, c_lo q, c_hi q) with KL(h‖q) = δ (h = p when KL(p‖q) <= δ, h = q when δ = 0),
one h per row, independent of the drafted token, so the emitted law is h and within δ.
The numpy module's docstring derives the method. Per row:

0. the budget check KL(p‖q) <= δ (``fits_budget``): for float32 rows four passes over a
   cache-sized chunk (p/q, log, · p, sum), the correction Σ q − Σ p only near δ;
1. rows that need a solve and are long (V >= ``BINNED_MIN_VOCAB``) are bracketed on
   binned ratios (``_solve_binned``): the tokens are grouped by the float32 bit pattern of
   r = p/q (monotone in r), a group lying wholly on one side of c_lo and of c_hi acts as
   one token, so three bincounts over the row and solves on a few hundred tokens, level by
   level in finer bins around the root, give (c_lo, c_hi) exactly; the result is checked
   and the rare row that fails takes step 2 on its whole row. No sort of the row;
2. ``_solve_caps`` (short rows, the coarse and fine solves of step 1, the fallback): sort
   the ratios (+inf where q = 0) and take prefix and suffix sums of q, p and the KL terms
   q φ(r); locate the root's segment (fixed lifted set L and capped set H) by two searches
   over the sorted ratios (``_locate_root``); solve c_hi on that segment by safeguarded
   Newton from the right, then move c down by ulps until KL(h‖q) <= δ as computed; c_lo
   follows from Σ h = 1.

Sums and solves are float64; elementwise work over [V] stays in the rows' dtype.
"""

from __future__ import annotations

import math

import torch

from cactus_theory.core.rules import frontier as frontier_rule
from cactus_theory.sampler.divergences import kl_div
from cactus_theory.sampler.rules.base import State, TorchTargetRule

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


def _solve_caps(
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
    return torch.minimum(segment.lift_for(cap), cap), cap


#: Elements (rows × V) the frontier solve handles at once, by device type.
FRONTIER_CHUNK = {"cuda": 1 << 26, "cpu": 1 << 23}
#: Elements (rows × V) per chunk of the budget check KL(p‖q) <= δ, by device type: on CPU
#: a chunk's temporaries stay in cache.
CHECK_CHUNK = {"cuda": 1 << 26, "cpu": 1 << 16}
#: Rows at least this long are solved by bracketing on binned ratios (``_solve_binned``);
#: shorter ones by the sort of ``_solve_caps`` directly.
BINNED_MIN_VOCAB = 4096
#: Low bits of the float32 ratio dropped to form its bin, coarse to fine (23 − shift
#: mantissa bits kept): bins of 1/16, 1/256 and 1/4096 of an octave for rows shorter than
#: ``FINE_START_VOCAB``, of 1/64, 1/1024 and 1/16384 for longer ones (whose coarse bins
#: would hold too many tokens; the coarse sums take 24 bytes per bin and row).
BIN_SHIFTS = (19, 15, 11)
FINE_BIN_SHIFTS = (17, 13, 9)
FINE_START_VOCAB = 1 << 15


def _bin_shifts(vocab: int) -> tuple[int, ...]:
    """The level shifts for rows of length V."""
    return FINE_BIN_SHIFTS if vocab >= FINE_START_VOCAB else BIN_SHIFTS


def _num_bins(shift: int) -> int:
    """Bins of a nonnegative float32 at ``shift`` (+inf in the last): bit patterns 0 ..
    0x7f800000, shifted."""
    return (0x7F800000 >> shift) + 1


#: Bins on each side of a root's bin refined at the next level (a window of 2 m + 1).
BIN_MARGIN = 2
WINDOW = 2 * BIN_MARGIN + 1


#: Rows whose Σ p log(p/q) lies within this of δ get the exact correction Σ q − Σ p
#: (rows passing the checks sum to 1 within 1e-4 in float32, 1e-2 in half precision).
CORRECTION_BAND = 0.05


def fits_budget(target_rows: Tensor, draft_rows: Tensor, delta: float) -> Tensor:
    """[R] bool: KL(p‖q) = Σ (p log(p/q) − p + q) <= δ for rows [R, V].

    float64 rows: Σ of the accurate terms ``kl_div`` (as the numpy reference). Other rows
    in their own dtype (float32), one row chunk at a time so that temporaries stay in
    cache: A = Σ p log(p/q) (quotient, log, product, pairwise sum: four passes; p = 0
    terms, NaN, left out; +inf where p > 0 = q), then the correction Σ q − Σ p (two more
    passes) only on rows with |A − δ| <= ``CORRECTION_BAND``: farther rows are decided
    by A alone. The float32 value is within ~1e-6 relative of the float64 one, which
    moves the decision (h = p or a solve, continuous in between) only for rows within
    that of the budget.
    """
    rows, vocab = target_rows.shape
    if target_rows.dtype == torch.float64:
        return kl_div(draft_rows, target_rows).sum(dim=-1) <= delta
    totals = torch.empty(rows, dtype=torch.float64, device=target_rows.device)  # [R]
    step = max(1, CHECK_CHUNK.get(target_rows.device.type, 1 << 26) // max(vocab, 1))
    for start in range(0, rows, step):
        target = target_rows[start : start + step]  # [c, V]
        draft = draft_rows[start : start + step]  # [c, V]
        terms = torch.div(draft, target).log_().mul_(draft)  # [c, V] p log(p/q)
        totals[start : start + step] = terms.nansum(dim=-1)
    near = ((totals - delta).abs() <= CORRECTION_BAND).nonzero(as_tuple=True)[0]  # [N]
    if near.numel():
        target, draft = target_rows[near], draft_rows[near]  # [N, V]
        totals[near] += (target.sum(dim=-1) - draft.sum(dim=-1)).to(torch.float64)
    return totals <= delta


def frontier_constants(
    target_rows: Tensor, draft_rows: Tensor, delta: float
) -> tuple[Tensor, Tensor]:
    """(c_lo, c_hi) per row of [R, V] (float64), the twin of ``rules.frontier_constants``.

    Rows with KL(p‖q) <= δ get (0, +inf) (h = p; ``fits_budget``); δ = 0 gives (1, 1) (h = q).
    The other rows are solved in chunks of ``FRONTIER_CHUNK`` elements to bound memory:
    by bracketing on binned ratios for V >= ``BINNED_MIN_VOCAB`` (``_solve_binned``),
    else by ``_solve_caps`` on the whole sorted row.
    """
    rows, vocab = target_rows.shape
    device = target_rows.device
    lift = torch.ones(rows, dtype=torch.float64, device=device)  # [R]
    cap = torch.ones(rows, dtype=torch.float64, device=device)  # [R]
    if delta <= 0 or rows == 0:
        return lift, cap
    fits = fits_budget(target_rows, draft_rows, delta)  # [R]
    lift = torch.where(fits, 0.0, lift)
    cap = torch.where(fits, math.inf, cap)
    todo = (~fits).nonzero(as_tuple=True)[0]  # [S]
    step = max(1, FRONTIER_CHUNK.get(device.type, 1 << 23) // vocab)
    for start in range(0, todo.numel(), step):
        part = todo[start : start + step]  # [s]
        if vocab >= BINNED_MIN_VOCAB:
            lift[part], cap[part] = _solve_binned(target_rows[part], draft_rows[part], delta)
        else:
            target = target_rows[part].to(torch.float64)  # [s, V]
            draft = draft_rows[part].to(torch.float64)  # [s, V]
            lift[part], cap[part] = _solve_caps(target, draft, kl_div(draft, target), delta)
    return lift, cap


#: The float32 normal range: ratios outside it share the end bins (saturated).
_TINY32, _HUGE32 = 2.0**-126, 2.0**127
#: Constants beyond these fall in or next to a saturated bin: such rows take the fallback.
_SAFE_LOW, _SAFE_HIGH = 2.0**-120, 2.0**120


def _ratio_bits(ratio: Tensor) -> Tensor:
    """The float32 bit pattern [...] (int64) of ratios >= 0 (float64; +inf included).

    The bit pattern of a nonnegative float32 is increasing in its value, so
    ``bits >> shift`` is a monotone bin of r: rounding to float32 is monotone, and ratios
    outside the float32 normal range are first clamped into it (0 and +inf kept), so bin
    b holds the ratios whose float32 lies in [edge_b, edge_{b+1}), edge_b = the float32
    with bits b << shift, except the two saturated end bins.
    """
    clamped = ratio.clamp(_TINY32, _HUGE32)  # [...]
    clamped = torch.where(ratio == 0, 0.0, torch.where(ratio == math.inf, math.inf, clamped))
    return clamped.to(torch.float32).view(torch.int32).to(torch.int64)


#: Bit patterns above this (+inf's) are NaN: they are clamped to +inf's bin.
_INF_BITS = 0x7F800000
#: Elements (rows × V) per chunk of the level-0 passes of ``_solve_binned``, by device
#: type: on CPU a chunk's temporaries stay in cache.
BIN_CHUNK = {"cuda": 1 << 26, "cpu": 1 << 16}


def _chunk_bits(target: Tensor, draft: Tensor) -> tuple[Tensor, Tensor]:
    """(bits [c, V] int64 as ``_ratio_bits``, the ratio r [c, V] in the rows' dtype) of
    rows [c, V] in their own dtype.

    float64 rows: r = p/q (+inf where q = 0), clamped into the float32 range first. Other
    rows: r = p/q in their dtype (correctly rounded, so monotone in the exact ratio),
    whose +inf (q = 0, or an overflow for q > 0 below 2^-126 p) and NaN (p = q = 0) both
    land in the +inf bin or bin 0 (a NaN of either sign; such a token has no mass). An
    overflowed token with q > 0 shares the +inf bin: it is capped at any c below 2^127,
    as every token there with q = 0 keeps h = 0 = c q, so the merged bin adds the same
    P − c Q and Q φ(c) as its tokens; a larger c takes the fallback (``_SAFE_HIGH``).
    """
    if target.dtype == torch.float64:
        ratio = torch.where(target > 0, draft / target, math.inf)  # [c, V]
        return _ratio_bits(ratio), ratio
    ratio = torch.div(draft, target)  # [c, V]
    bits = ratio.to(torch.float32).view(torch.int32).to(torch.int64)  # [c, V]
    return bits.clamp_(0, _INF_BITS), ratio


def _chunk_terms(target: Tensor, draft: Tensor, ratio: Tensor) -> Tensor:
    """KL terms q φ(r) [c, V] (0 where q = 0; float64 rows: ``kl_div``), from rows
    [c, V] in their dtype and their ``_chunk_bits`` ratio: p log r − p + q, with
    p log r read as 0 where it is NaN or infinite (p = 0, or q = 0), clamped at 0."""
    if target.dtype == torch.float64:
        return torch.where(target > 0, kl_div(draft, target), 0.0)
    terms = torch.log(ratio).mul_(draft).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    return terms.sub_(draft).add_(target).clamp_(min=0.0)  # [c, V]


def _key(values: Tensor, shift: int) -> Tensor:
    """The bin [R] at ``shift`` of per-row constants [R] (float64, >= 0)."""
    return _ratio_bits(values.clamp(min=0.0)) >> shift


def _pack(mask: Tensor, *columns: Tensor) -> tuple[Tensor, ...]:
    """The entries of each row [R, N] where ``mask`` holds, moved to the front of rows
    [R, M] (M = the largest count) and padded with zeros, for every column [R, N]."""
    rows = mask.shape[0]
    counts = mask.sum(dim=-1)  # [R]
    width = max(int(counts.max().item()) if rows else 0, 1)
    row_index, column_index = mask.nonzero(as_tuple=True)  # [S], [S]
    starts = torch.cumsum(counts, dim=0) - counts  # [R]
    slot = torch.arange(row_index.numel(), device=mask.device) - starts[row_index]  # [S]
    packed = []
    for column in columns:
        out = torch.zeros(rows, width, dtype=column.dtype, device=column.device)  # [R, M]
        out[row_index, slot] = column[row_index, column_index]
        packed.append(out)
    return tuple(packed)


def _near(keys: Tensor, lift_key: Tensor, cap_key: Tensor) -> Tensor:
    """[R, N] bool: keys [R, N] within ``BIN_MARGIN`` of the row's lift or cap key [R]."""
    near_lift = (keys - lift_key[:, None]).abs() <= BIN_MARGIN
    return near_lift | ((keys - cap_key[:, None]).abs() <= BIN_MARGIN)


def _solve_binned(target_rows: Tensor, draft_rows: Tensor, delta: float) -> tuple[Tensor, Tensor]:
    """(c_lo, c_hi) for rows [R, V] with KL(p‖q) > δ > 0, without sorting the rows.

    Group the tokens by a bin of their ratio r = p/q (``_ratio_bits``). A group whose
    tokens are all lifted (r < c_lo), all kept (c_lo <= r <= c_hi) or all capped
    (r > c_hi) enters Σ h and KL(h‖q) only through its sums Q_g = Σ q, P_g = Σ p and
    K_g = Σ q φ(r) (as c_lo Q_g and Q_g φ(c_lo); P_g and K_g; c Q_g and Q_g φ(c)), so it
    can be replaced by one token (Q_g, P_g) with KL term K_g: its ratio P_g/Q_g lies in
    the group's range, so the solver classifies it with its tokens. Hence, level by level
    (``_bin_shifts``: bins of 1/16, 1/256, 1/4096 octave, or 4x finer for long rows):

    1. level 0: the sums Q, P, K of every coarse bin (three ``bincount`` passes over
       [R, V], float64); ``_solve_caps`` on the nonempty bins as tokens gives (c_lo, c_hi);
    2. the bins within ``BIN_MARGIN`` of the bins of c_lo and c_hi (two windows) are split
       at the next level; every bin outside them stays one token; solve again on the
       merged bins plus the finer bins of the windows (a few hundred tokens);
    3. after the finest level the tokens of the last windows enter one by one, and the
       last solve gives (c_lo, c_hi);
    4. check: the result is exact when no merged bin straddles c_lo or c_hi, which holds
       when at every level the bins of the final c_lo and c_hi lie strictly inside that
       level's windows (a float32 rounding of c may land one bin over), and c_lo, c_hi
       are away from the saturated end bins (``_ratio_bits``). Rows that fail are
       solved on their whole sorted row (``_solve_caps``).

    The work over [R, V] is a few elementwise passes and three bincounts (no sort); the
    windows hold a shrinking share of the tokens, and every solve is on short rows.
    """
    rows, vocab = target_rows.shape
    device = target_rows.device
    row_offsets = torch.arange(rows, device=device)[:, None]  # [R, 1]

    def group_sums(index: Tensor, groups: int, *values: Tensor) -> list[Tensor]:
        """Σ of each of ``values [R', N]`` per (row, group index [R', N] in [0, groups))."""
        count = index.shape[0]
        flat = (index + groups * row_offsets[:count]).reshape(-1)  # [R'·N]
        return [
            torch.bincount(
                flat, weights=v.to(torch.float64).reshape(-1), minlength=count * groups
            ).reshape(count, groups)
            for v in values
        ]  # [R', groups] each, float64

    # Level 0, one row chunk at a time (cache-sized): the coarse bin sums Q, P, K.
    shifts = _bin_shifts(vocab)
    shift = shifts[0]
    num_bins = _num_bins(shift)
    step = max(1, BIN_CHUNK.get(device.type, 1 << 26) // vocab)
    sums = [torch.empty(rows, num_bins, dtype=torch.float64, device=device) for _ in range(3)]
    all_bits = torch.empty(rows, vocab, dtype=torch.int32, device=device)  # [R, V] kept
    for start in range(0, rows, step):
        target, draft = target_rows[start : start + step], draft_rows[start : start + step]
        bits, ratio = _chunk_bits(target, draft)  # [c, V] x2
        all_bits[start : start + step] = bits  # (bit patterns fit in int32)
        terms = _chunk_terms(target, draft, ratio)  # [c, V]
        for total, part in zip(
            sums, group_sums(bits >> shift, num_bins, target, draft, terms), strict=True
        ):
            total[start : start + step] = part
    keys = torch.arange(num_bins, device=device).expand(rows, num_bins)  # [R, bins]
    nonempty = (sums[0] > 0) | (sums[1] > 0)  # [R, bins]
    lift, cap = _solve_caps(*_pack(nonempty, *sums), delta)  # [R] x2
    lift_key, cap_key = _key(lift, shift), _key(cap, shift)  # [R] x2
    windows = [(shift, lift_key, cap_key)]
    split_bins = _near(keys, lift_key, cap_key) & (keys < num_bins - 1)  # [R, bins]
    merged = [_pack(nonempty & ~split_bins, *sums)]
    # The tokens of the split bins (the pool, flat lists [S]), one row at a time.
    pieces: list[list[Tensor]] = [[] for _ in range(4)]  # rows, bits, q, p of each token
    for row in range(rows):
        target, draft = target_rows[row], draft_rows[row]  # [V]
        bits = all_bits[row]  # [V]
        chosen = split_bins[row][bits >> shift].nonzero()[:, 0]  # [s]
        pieces[0].append(torch.full_like(chosen, row))
        pieces[1].append(bits[chosen].to(torch.int64))
        pieces[2].append(target[chosen])
        pieces[3].append(draft[chosen])
    token_rows, token_bits, token_target, token_draft = (torch.cat(p) for p in pieces)  # [S]
    ratio = torch.div(token_draft, token_target)  # [S]
    if token_target.dtype == torch.float64:
        ratio = torch.where(token_target > 0, ratio, math.inf)
    pool = (
        token_target.to(torch.float64),
        token_draft.to(torch.float64),
        _chunk_terms(token_target, token_draft, ratio).to(torch.float64),
    )  # [S] x3: q, p and the KL term of each token

    def flat_sums(index: Tensor, groups: int) -> list[Tensor]:
        """Σ q, p, K of the pool per (row, group index [S] in [0, groups))."""
        flat = index + groups * token_rows  # [S]
        return [
            torch.bincount(flat, weights=v, minlength=rows * groups).reshape(rows, groups)
            for v in pool
        ]  # [R, groups] x3

    def pack_pool() -> tuple[Tensor, ...]:
        """The pool as rows [R, M] (zero-padded), for a solve."""
        counts = torch.bincount(token_rows, minlength=rows)  # [R]
        slot = torch.arange(token_rows.numel(), device=device)  # [S]
        slot = slot - (torch.cumsum(counts, dim=0) - counts)[token_rows]
        width = max(int(counts.max().item()) if rows else 0, 1)
        packed = []
        for column in pool:
            out = torch.zeros(rows, width, dtype=column.dtype, device=device)  # [R, M]
            out[token_rows, slot] = column
            packed.append(out)
        return tuple(packed)

    for finer in shifts[1:]:
        split = 1 << (shift - finer)  # finer bins per bin
        groups = 2 * WINDOW * split
        fine_key = token_bits >> finer  # [S]
        lift_base = (lift_key - BIN_MARGIN) * split  # [R] first finer key of each window
        cap_base = (cap_key - BIN_MARGIN) * split
        in_lift = ((token_bits >> shift) - lift_key[token_rows]).abs() <= BIN_MARGIN  # [S]
        index = torch.where(
            in_lift,
            fine_key - lift_base[token_rows],
            WINDOW * split + fine_key - cap_base[token_rows],
        ).clamp_(0, groups - 1)  # [S] the finer bin within the row's two windows
        sums = flat_sums(index, groups)  # [R, groups] x3
        group = torch.arange(groups, device=device).expand(rows, groups)  # [R, groups]
        keys = torch.where(
            group < WINDOW * split,
            group + lift_base[:, None],
            group - WINDOW * split + cap_base[:, None],
        )  # [R, groups] the finer key of each group
        nonempty = (sums[0] > 0) | (sums[1] > 0)  # [R, groups]
        parts = [
            torch.cat(columns, dim=-1)
            for columns in zip(*merged, _pack(nonempty, *sums), strict=True)
        ]
        lift, cap = _solve_caps(*parts, delta)  # [R] x2
        shift = finer
        lift_key, cap_key = _key(lift, shift), _key(cap, shift)  # [R] x2
        windows.append((shift, lift_key, cap_key))
        merged.append(_pack(nonempty & ~_near(keys, lift_key, cap_key), *sums))
        keep = _near(fine_key[:, None], lift_key[token_rows], cap_key[token_rows])[:, 0]  # [S]
        token_rows, token_bits = token_rows[keep], token_bits[keep]
        pool = tuple(column[keep] for column in pool)
    parts = [torch.cat(columns, dim=-1) for columns in zip(*merged, pack_pool(), strict=True)]
    lift, cap = _solve_caps(*parts, delta)  # [R] x2
    inside = (cap <= _SAFE_HIGH) & ((lift == 0) | (lift >= _SAFE_LOW))  # [R]
    for level_shift, level_lift, level_cap in windows:
        inside &= (_key(lift, level_shift) - level_lift).abs() < BIN_MARGIN
        inside &= (_key(cap, level_shift) - level_cap).abs() < BIN_MARGIN
    failed = (~inside).nonzero(as_tuple=True)[0]  # [F]
    if failed.numel():
        target, draft = target_rows[failed], draft_rows[failed]  # [F, V]
        terms = _chunk_terms(target, draft, _chunk_bits(target, draft)[1]).to(torch.float64)
        target, draft = target.to(torch.float64), draft.to(torch.float64)  # [F, V]
        lift[failed], cap[failed] = _solve_caps(target, draft, terms, delta)
    return lift, cap


def frontier_target(target_probs: Tensor, draft_probs: Tensor, lift: Tensor, cap: Tensor) -> Tensor:
    """h = clip(p, c_lo q, c_hi q) with c_hi q read as 0 where q = 0 (constants broadcast).

    Not renormalised, as in ``rules.frontier_target``: the lift makes Σ h = 1 to rounding.
    """
    lower = lift[..., None].to(target_probs.dtype) * target_probs
    capped = cap[..., None].to(target_probs.dtype) * target_probs
    upper = torch.where(target_probs > 0, capped, torch.zeros_like(target_probs))
    return torch.minimum(torch.maximum(draft_probs, lower), upper)


class TorchFrontier(TorchTargetRule):
    """h = clip(p, c_lo q, c_hi q): whole rows are read to solve (c_lo, c_hi) per row."""

    reads_rows = True

    def solve(self, target_probs: Tensor, draft_probs: Tensor) -> State:
        if self.rule.delta == 0:
            return None  # h = q
        vocab = target_probs.shape[-1]
        lift, cap = frontier_constants(  # [R], [R]
            target_probs.reshape(-1, vocab), draft_probs.reshape(-1, vocab), self.rule.delta
        )
        batch_shape = target_probs.shape[:-1]
        return lift.reshape(batch_shape), cap.reshape(batch_shape)

    def target_law(self, target_probs, draft_probs, state):
        if state is None:
            return target_probs
        lift, cap = state
        return frontier_target(target_probs, draft_probs, lift, cap)
