"""Inverse-CDF sampling in two levels: block sums, then one block per row.

The token drawn from a row w [V] (nonnegative, not necessarily normalised) with uniform u is
the first index j whose cumulative sum S_j = Σ_{i<=j} w_i exceeds u · S_{V−1}; when rounding
puts u · S at or past the end, the first index where S reaches its total (the last token
with positive mass), so a zero-mass token is never drawn; a row without mass gives 0.

A full cumulative sum is a sequential pass over [V] (on CPU about 8x slower than a sum).
Split the row into blocks of ``BLOCK`` tokens instead:

1. block sums W_b = Σ_{i in block b} w_i (a vectorised reduction, one read of the row);
2. the cumulative block sums C_b (float64, over V / BLOCK values) give the block
   b* = first b with C_b > u · C_last;
3. the cumulative sum inside block b* (float64, BLOCK values) on top of C_{b*−1} gives j.

This is the same rule as a single cumulative sum; only the rounding of S_j differs (block
sums are pairwise, in the row's dtype), so draws agree except when u · S lies within
rounding of a boundary. If rounding makes block b*'s own sum fall short of the threshold,
the last positive token of b* is taken (b* has positive mass: C_{b*} > C_{b*−1}).

Rows shorter than ``TWO_LEVEL_MIN_VOCAB`` use one cumulative sum (``inverse_cdf_flat``).
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor

#: Tokens per block of the two-level inverse CDF.
BLOCK = 1024
#: Below this vocabulary size a single cumulative sum is cheaper than two levels.
TWO_LEVEL_MIN_VOCAB = 4 * BLOCK


def inverse_cdf_flat(probs: Tensor, uniforms: Tensor) -> Tensor:
    """Token ids [...] from rows ``probs [..., V]`` and uniforms [...] by one cumulative sum
    (a binary search on it; the fallback of the module docstring). Always in [0, V)."""
    vocab = probs.shape[-1]
    cumulative = torch.cumsum(probs, dim=-1)  # [..., V]
    total = cumulative[..., -1:].contiguous()  # [..., 1]
    threshold = (uniforms.to(torch.float64)[..., None] * total.to(torch.float64)).to(probs.dtype)
    index = torch.searchsorted(cumulative, threshold, right=True)  # [..., 1]
    last_positive = torch.searchsorted(cumulative, total, right=False)  # [..., 1]
    chosen = torch.where(index >= vocab, last_positive, index)[..., 0]
    return chosen.clamp(0, vocab - 1)


def num_blocks(vocab: int) -> int:
    """Blocks of ``BLOCK`` tokens covering [V] (the last one may be short)."""
    return -(-vocab // BLOCK)


def block_sums_into(row: Tensor, out: Tensor) -> Tensor:
    """W_b of one row [V] written into ``out [num_blocks(V)]`` (the row's dtype)."""
    vocab = row.shape[-1]
    full = vocab // BLOCK
    if full:
        torch.sum(row[: full * BLOCK].view(full, BLOCK), dim=-1, out=out[:full])
    if full * BLOCK < vocab:
        torch.sum(row[full * BLOCK :], dim=-1, out=out[full])
    return out


def block_sums(rows: Tensor) -> Tensor:
    """W [R, num_blocks(V)] of rows [R, V] (the rows' dtype)."""
    count, vocab = rows.shape
    full = vocab // BLOCK
    parts = []
    if full:
        parts.append(rows[:, : full * BLOCK].reshape(count, full, BLOCK).sum(dim=-1))  # [R, F]
    if full * BLOCK < vocab:
        parts.append(rows[:, full * BLOCK :].sum(dim=-1, keepdim=True))  # [R, 1]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def choose_blocks(sums: Tensor, uniforms: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(block b* [R], C_{b*−1} [R] float64, threshold u · C_last [R] float64) from block
    sums [R, nb] and uniforms [R]: the first block whose cumulative sum exceeds the
    threshold, or the block where the cumulative sum reaches its total (the last with
    positive mass) when rounding leaves none."""
    cumulative = torch.cumsum(sums.to(torch.float64), dim=-1)  # [R, nb]
    count, blocks = cumulative.shape
    total = cumulative[:, -1:].contiguous()  # [R, 1]
    threshold = uniforms.to(torch.float64)[:, None] * total  # [R, 1]
    block = torch.searchsorted(cumulative, threshold, right=True)  # [R, 1]
    last = torch.searchsorted(cumulative, total, right=False)  # [R, 1]
    block = torch.where(block >= blocks, last, block).clamp(0, blocks - 1)  # [R, 1]
    before = torch.where(
        block > 0, cumulative.gather(-1, (block - 1).clamp(min=0)), torch.zeros_like(total)
    )  # [R, 1]
    return block[:, 0], before[:, 0], threshold[:, 0]


def choose_in_block(values: Tensor, before: Tensor, threshold: Tensor, width: Tensor) -> Tensor:
    """Offsets [R] in the chosen blocks from their values [R, BLOCK] (zero-padded past
    ``width [R]``), C_{b*−1} [R] and the thresholds [R]: the first offset whose cumulative
    sum exceeds the threshold, else the last positive one (the block's own rounding)."""
    cumulative = torch.cumsum(values.to(torch.float64), dim=-1) + before[:, None]  # [R, BLOCK]
    index = torch.searchsorted(cumulative, threshold[:, None], right=True)  # [R, 1]
    last = torch.searchsorted(cumulative, cumulative[:, -1:].contiguous(), right=False)  # [R, 1]
    index = torch.where(index >= values.shape[-1], last, index)[:, 0]  # [R]
    return torch.minimum(index, (width - 1).clamp(min=0))


def block_values(rows: Tensor, block: Tensor) -> tuple[Tensor, Tensor]:
    """(values [R, BLOCK] of block b* of each row [R, V], zero-padded; widths [R])."""
    vocab = rows.shape[-1]
    offsets = block[:, None] * BLOCK + torch.arange(BLOCK, device=rows.device)  # [R, BLOCK]
    inside = offsets < vocab  # [R, BLOCK]
    values = rows.gather(-1, offsets.clamp(max=vocab - 1))  # [R, BLOCK]
    values = torch.where(inside, values, torch.zeros_like(values))
    return values, inside.sum(dim=-1)


def inverse_cdf(probs: Tensor, uniforms: Tensor) -> Tensor:
    """Token ids [...] from rows ``probs [..., V]`` (need not sum to 1) and uniforms [...]
    (the module docstring's rule; two levels for V >= ``TWO_LEVEL_MIN_VOCAB``). Always in
    [0, V); NaN rows give some index in range."""
    vocab = probs.shape[-1]
    if vocab < TWO_LEVEL_MIN_VOCAB:
        return inverse_cdf_flat(probs, uniforms)
    batch_shape = probs.shape[:-1]
    rows = probs.reshape(-1, vocab)  # [R, V]
    flat_u = uniforms.reshape(-1)  # [R]
    block, before, threshold = choose_blocks(block_sums(rows), flat_u)  # [R] x3
    values, width = block_values(rows, block)  # [R, BLOCK], [R]
    offset = choose_in_block(values, before, threshold, width)  # [R]
    chosen = (block * BLOCK + offset).clamp(0, vocab - 1)  # [R]
    return chosen.reshape(batch_shape)
