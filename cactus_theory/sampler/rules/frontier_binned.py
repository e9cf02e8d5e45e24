"""The frontier constants of long rows by bracketing on binned ratios, without sorting
the rows (``solve_binned``; ``frontier.frontier_constants`` calls it for V >=
``frontier.BINNED_MIN_VOCAB``).

The tokens are grouped by the float32 bit pattern of r = p/q (monotone in r); a group lying
wholly on one side of c_lo and of c_hi acts as one token, so three bincounts over the row
and solves on a few hundred tokens (``frontier_sorted.solve_caps``), level by level in
finer bins around the root, give (c_lo, c_hi) exactly; the result is checked and the rare
row that fails is solved on its whole sorted row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cactus_theory.sampler.divergences import kl_div
from cactus_theory.sampler.rules import frontier_sorted

Tensor = torch.Tensor


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
#: Elements (rows × V) per chunk of the level-0 passes of ``solve_binned``, by device
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


def _pack_rows(row_index: Tensor, rows: int, *values: Tensor) -> tuple[Tensor, ...]:
    """Flat entries [S] of rows ``row_index`` [S] (in row order) moved to the front of rows
    [R, M] (M = the largest count) and padded with zeros, for every ``values`` [S]."""
    counts = torch.bincount(row_index, minlength=rows)  # [R]
    width = max(int(counts.max().item()) if rows else 0, 1)
    starts = torch.cumsum(counts, dim=0) - counts  # [R]
    slot = torch.arange(row_index.numel(), device=row_index.device) - starts[row_index]  # [S]
    packed = []
    for value in values:
        out = torch.zeros(rows, width, dtype=value.dtype, device=value.device)  # [R, M]
        out[row_index, slot] = value
        packed.append(out)
    return tuple(packed)


def _pack(mask: Tensor, *columns: Tensor) -> tuple[Tensor, ...]:
    """The entries of each row [R, N] where ``mask`` holds, moved to the front of rows
    [R, M] (M = the largest count) and padded with zeros, for every column [R, N]."""
    row_index, column_index = mask.nonzero(as_tuple=True)  # [S], [S]
    entries = (column[row_index, column_index] for column in columns)  # [S] each
    return _pack_rows(row_index, mask.shape[0], *entries)


def _group_sums(
    row_of: Tensor, index: Tensor, groups: int, rows: int, values: tuple[Tensor, ...]
) -> list[Tensor]:
    """Σ of each of ``values`` (shaped as ``index``) per (row, group): ``index`` in
    [0, groups), ``row_of`` its row (broadcast against it); [R, groups] each, float64."""
    flat = (index + groups * row_of).reshape(-1)
    return [
        torch.bincount(
            flat, weights=value.to(torch.float64).reshape(-1), minlength=rows * groups
        ).reshape(rows, groups)
        for value in values
    ]


def _near(keys: Tensor, lift_key: Tensor, cap_key: Tensor) -> Tensor:
    """[R, N] bool: keys [R, N] within ``BIN_MARGIN`` of the row's lift or cap key [R]."""
    near_lift = (keys - lift_key[:, None]).abs() <= BIN_MARGIN
    return near_lift | ((keys - cap_key[:, None]).abs() <= BIN_MARGIN)


def _coarse_sums(
    target_rows: Tensor, draft_rows: Tensor, shift: int
) -> tuple[Tensor, list[Tensor]]:
    """Level 0, one cache-sized row chunk at a time: (the ratio bits [R, V] int32, the
    sums Q, P, K [R, bins] float64 of every bin at ``shift``)."""
    rows, vocab = target_rows.shape
    device = target_rows.device
    num_bins = _num_bins(shift)
    row_offsets = torch.arange(rows, device=device)[:, None]  # [R, 1]
    step = max(1, BIN_CHUNK.get(device.type, 1 << 26) // vocab)
    sums = [torch.empty(rows, num_bins, dtype=torch.float64, device=device) for _ in range(3)]
    all_bits = torch.empty(rows, vocab, dtype=torch.int32, device=device)  # [R, V] kept
    for start in range(0, rows, step):
        target, draft = target_rows[start : start + step], draft_rows[start : start + step]
        bits, ratio = _chunk_bits(target, draft)  # [c, V] x2
        all_bits[start : start + step] = bits  # (bit patterns fit in int32)
        terms = _chunk_terms(target, draft, ratio)  # [c, V]
        count = bits.shape[0]
        parts = _group_sums(
            row_offsets[:count], bits >> shift, num_bins, count, (target, draft, terms)
        )
        for total, part in zip(sums, parts, strict=True):
            total[start : start + step] = part
    return all_bits, sums


@dataclass
class _Bracket:
    """One level's solve: its bin shift, (c_lo, c_hi) [R] and their bins [R]."""

    shift: int
    lift: Tensor
    cap: Tensor

    def __post_init__(self) -> None:
        self.lift_key, self.cap_key = _key(self.lift, self.shift), _key(self.cap, self.shift)

    def holds(self, lift: Tensor, cap: Tensor) -> Tensor:
        """[R] bool: the bins of (lift, cap) at this level lie strictly inside its windows."""
        inside = (_key(lift, self.shift) - self.lift_key).abs() < BIN_MARGIN
        return inside & ((_key(cap, self.shift) - self.cap_key).abs() < BIN_MARGIN)


@dataclass
class _Pool:
    """The tokens of the split bins, flat [S] in row order: their row, their ratio bits,
    and their q, p and KL term (float64)."""

    rows: Tensor
    bits: Tensor
    values: tuple[Tensor, Tensor, Tensor]

    @classmethod
    def of_split_bins(
        cls, target_rows: Tensor, draft_rows: Tensor, all_bits: Tensor, split: Tensor, shift: int
    ) -> _Pool:
        """The tokens whose bin at ``shift`` is ``split`` [R, bins], one row at a time."""
        pieces: list[list[Tensor]] = [[] for _ in range(4)]  # rows, bits, q, p of each token
        for row in range(target_rows.shape[0]):
            bits = all_bits[row]  # [V]
            chosen = split[row][bits >> shift].nonzero()[:, 0]  # [s]
            pieces[0].append(torch.full_like(chosen, row))
            pieces[1].append(bits[chosen].to(torch.int64))
            pieces[2].append(target_rows[row][chosen])
            pieces[3].append(draft_rows[row][chosen])
        token_rows, token_bits, target, draft = (torch.cat(piece) for piece in pieces)  # [S]
        ratio = torch.div(draft, target)  # [S]
        if target.dtype == torch.float64:
            ratio = torch.where(target > 0, ratio, math.inf)
        terms = _chunk_terms(target, draft, ratio)
        values = tuple(value.to(torch.float64) for value in (target, draft, terms))
        return cls(token_rows, token_bits, values)  # type: ignore[arg-type]

    def sums(self, index: Tensor, groups: int, rows: int) -> list[Tensor]:
        """Σ q, p, K of the pool per (row, group index [S] in [0, groups)): [R, groups] x3."""
        return _group_sums(self.rows, index, groups, rows, self.values)

    def packed(self, rows: int) -> tuple[Tensor, ...]:
        """The pool as rows [R, M] (zero-padded), for a solve."""
        return _pack_rows(self.rows, rows, *self.values)

    def select(self, keep: Tensor) -> _Pool:
        values = tuple(value[keep] for value in self.values)
        return _Pool(self.rows[keep], self.bits[keep], values)  # type: ignore[arg-type]


def _refine(
    pool: _Pool, merged: list[tuple[Tensor, ...]], coarse: _Bracket, finer: int, delta: float
) -> tuple[_Bracket, tuple[Tensor, ...], _Pool]:
    """One finer level: split the pool's bins of the two windows of ``coarse`` at
    ``finer``, solve on them plus the ``merged`` bins; (the new bracket, the finer bins
    outside its windows as merged tokens, the pool of the tokens inside them)."""
    rows = coarse.lift.shape[0]
    split = 1 << (coarse.shift - finer)  # finer bins per bin
    groups = 2 * WINDOW * split
    fine_key = pool.bits >> finer  # [S]
    lift_base = (coarse.lift_key - BIN_MARGIN) * split  # [R] first finer key of each window
    cap_base = (coarse.cap_key - BIN_MARGIN) * split
    in_lift = ((pool.bits >> coarse.shift) - coarse.lift_key[pool.rows]).abs() <= BIN_MARGIN
    index = torch.where(
        in_lift,
        fine_key - lift_base[pool.rows],
        WINDOW * split + fine_key - cap_base[pool.rows],
    ).clamp_(0, groups - 1)  # [S] the finer bin within the row's two windows
    sums = pool.sums(index, groups, rows)  # [R, groups] x3
    group = torch.arange(groups, device=index.device).expand(rows, groups)  # [R, groups]
    keys = torch.where(
        group < WINDOW * split,
        group + lift_base[:, None],
        group - WINDOW * split + cap_base[:, None],
    )  # [R, groups] the finer key of each group
    nonempty = (sums[0] > 0) | (sums[1] > 0)  # [R, groups]
    parts = [
        torch.cat(columns, dim=-1) for columns in zip(*merged, _pack(nonempty, *sums), strict=True)
    ]
    bracket = _Bracket(finer, *frontier_sorted.solve_caps(*parts, delta))
    outside = _pack(nonempty & ~_near(keys, bracket.lift_key, bracket.cap_key), *sums)
    near = _near(fine_key[:, None], bracket.lift_key[pool.rows], bracket.cap_key[pool.rows])
    return bracket, outside, pool.select(near[:, 0])


def solve_binned(target_rows: Tensor, draft_rows: Tensor, delta: float) -> tuple[Tensor, Tensor]:
    """(c_lo, c_hi) for rows [R, V] with KL(p‖q) > δ > 0, without sorting the rows.

    Group the tokens by a bin of their ratio r = p/q (``_ratio_bits``). A group whose
    tokens are all lifted (r < c_lo), all kept (c_lo <= r <= c_hi) or all capped
    (r > c_hi) enters Σ h and KL(h‖q) only through its sums Q_g = Σ q, P_g = Σ p and
    K_g = Σ q φ(r) (as c_lo Q_g and Q_g φ(c_lo); P_g and K_g; c Q_g and Q_g φ(c)), so it
    can be replaced by one token (Q_g, P_g) with KL term K_g: its ratio P_g/Q_g lies in
    the group's range, so the solver classifies it with its tokens. Hence, level by level
    (``_bin_shifts``: bins of 1/16, 1/256, 1/4096 octave, or 4x finer for long rows):

    1. level 0 (``_coarse_sums``): the sums Q, P, K of every coarse bin (three
       ``bincount`` passes over [R, V], float64); ``solve_caps`` on the nonempty bins as
       tokens gives (c_lo, c_hi);
    2. the bins within ``BIN_MARGIN`` of the bins of c_lo and c_hi (two windows) are split
       at the next level (``_refine``); every bin outside them stays one token; solve
       again on the merged bins plus the finer bins of the windows (a few hundred tokens);
    3. after the finest level the tokens of the last windows enter one by one, and the
       last solve gives (c_lo, c_hi);
    4. check: the result is exact when no merged bin straddles c_lo or c_hi, which holds
       when at every level the bins of the final c_lo and c_hi lie strictly inside that
       level's windows (a float32 rounding of c may land one bin over), and c_lo, c_hi
       are away from the saturated end bins (``_ratio_bits``). Rows that fail are
       solved on their whole sorted row (``solve_caps``).

    The work over [R, V] is a few elementwise passes and three bincounts (no sort); the
    windows hold a shrinking share of the tokens, and every solve is on short rows.
    """
    rows, vocab = target_rows.shape
    shift, *finer_shifts = _bin_shifts(vocab)
    all_bits, sums = _coarse_sums(target_rows, draft_rows, shift)  # [R, V], [R, bins] x3
    num_bins = sums[0].shape[1]
    keys = torch.arange(num_bins, device=target_rows.device).expand(rows, num_bins)
    nonempty = (sums[0] > 0) | (sums[1] > 0)  # [R, bins]
    bracket = _Bracket(shift, *frontier_sorted.solve_caps(*_pack(nonempty, *sums), delta))
    brackets = [bracket]
    split = _near(keys, bracket.lift_key, bracket.cap_key) & (keys < num_bins - 1)
    merged = [_pack(nonempty & ~split, *sums)]
    pool = _Pool.of_split_bins(target_rows, draft_rows, all_bits, split, shift)
    for finer in finer_shifts:
        bracket, outside, pool = _refine(pool, merged, bracket, finer, delta)
        brackets.append(bracket)
        merged.append(outside)
    parts = [torch.cat(columns, dim=-1) for columns in zip(*merged, pool.packed(rows), strict=True)]
    lift, cap = frontier_sorted.solve_caps(*parts, delta)  # [R] x2
    inside = (cap <= _SAFE_HIGH) & ((lift == 0) | (lift >= _SAFE_LOW))  # [R]
    for level in brackets:
        inside &= level.holds(lift, cap)
    failed = (~inside).nonzero(as_tuple=True)[0]  # [F]
    if failed.numel():
        target, draft = target_rows[failed], draft_rows[failed]  # [F, V]
        terms = _chunk_terms(target, draft, _chunk_bits(target, draft)[1]).to(torch.float64)
        target, draft = target.to(torch.float64), draft.to(torch.float64)  # [F, V]
        lift[failed], cap[failed] = frontier_sorted.solve_caps(target, draft, terms, delta)
    return lift, cap
