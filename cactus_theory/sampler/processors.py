"""Sampling processors in torch, mirroring ``cactus_theory.core.processors`` exactly.

The decoder applies these to both models' logits, so the rule sees exactly the draft law p
the drafted token was sampled from, and the verifier's q after the same processors.

HF order (temperature, then top-k, then top-p), tie-robust as in the numpy reference:

- T = 0: greedy, the one-hot at argmax (first index on ties; ``torch.argmax`` guarantees
  it);
- T > 0: softmax(logits / T) in float32 (float64 for float64 logits);
- top-k: keep x iff probs_x >= the k-th largest (boundary ties kept); renormalise;
- top-p: keep x iff the mass of tokens strictly more probable than x is < top_p (the
  smallest top set reaching top_p, boundary ties kept); renormalise.
"""

from __future__ import annotations

import torch

from cactus_theory.core.processors import PLAIN_SETTING, SamplingSettings

Tensor = torch.Tensor


def greedy_rows(scores: Tensor) -> Tensor:
    """One-hot rows at argmax (first index on ties)."""
    index = torch.argmax(scores, dim=-1, keepdim=True)
    return torch.zeros_like(scores).scatter(-1, index, 1.0)


def top_k_mask(probs: Tensor, top_k: int | None) -> Tensor:
    """Keep x iff probs_x >= the k-th largest of its row (boundary ties kept)."""
    if not top_k or top_k >= probs.shape[-1]:
        return torch.ones_like(probs, dtype=torch.bool)
    kth = torch.topk(probs, top_k, dim=-1).values[..., -1:]
    return probs >= kth


def top_p_mask(probs: Tensor, top_p: float, candidates: int | None = None) -> Tensor:
    """Keep x iff Σ_{y : probs_y > probs_x} probs_y < top_p (boundary ties kept).

    The kept set is a run of leading tie groups in descending order, so it is
    {x : probs_x >= t} with t the smallest kept value. t is found on the descending values:
    all of them (a sort), or only the largest ``candidates`` (``torch.topk``) when every
    row has at most that many nonzero entries (after top-k), which gives the same t: the
    prefix sums of the leading values are the same numbers either way.
    """
    if top_p >= 1.0:
        return torch.ones_like(probs, dtype=torch.bool)
    if candidates is not None and candidates < probs.shape[-1]:
        values = torch.topk(probs, max(candidates, 1), dim=-1).values
    else:
        values = torch.sort(probs, dim=-1, descending=True).values
    before = torch.cumsum(values, dim=-1) - values
    # Tokens tied with an earlier one share the mass strictly above their tie group.
    starts = torch.ones_like(values, dtype=torch.bool)
    starts[..., 1:] = values[..., 1:] != values[..., :-1]
    positions = torch.arange(values.shape[-1], device=probs.device).expand_as(values)
    start_index = torch.cummax(torch.where(starts, positions, 0), dim=-1).values
    kept = before.gather(-1, start_index) < top_p
    threshold = torch.where(kept, values, torch.full_like(values, torch.inf)).amin(-1)
    return probs >= threshold[..., None]


def _renormalised(probs: Tensor, keep: Tensor) -> Tensor:
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum(dim=-1, keepdim=True)


def _top_k_first(scores: Tensor, settings: SamplingSettings) -> Tensor:
    """The processed rows [R, V] of scores [R, V] from the top-k logits alone; rows with a
    tie at the top-k boundary go through the general path (which keeps every tied token).

    Temperature preserves the order, so the top-k set is the k largest logits; the
    softmax renormalised over that set is the softmax of those k logits / T; top-p then
    runs on the k values, already sorted in descending order; the result is scattered into
    a zero row. Mathematically the general path's result; one top-k over V instead of a
    softmax, two renormalisations and a top-k over V.
    """
    top_k = settings.top_k
    width = min(top_k + TIE_WINDOW, scores.shape[-1])
    values, index = torch.topk(scores, width, dim=-1)  # [R, W] descending
    tied = values[:, top_k] == values[:, top_k - 1]  # [R] a tie at the boundary
    small = torch.softmax(values[:, :top_k] / settings.temperature, dim=-1)  # [R, k]
    if settings.top_p < 1.0:
        small = _renormalised(small, top_p_mask(small, settings.top_p, top_k))
    probs = torch.zeros_like(scores).scatter_(-1, index[:, :top_k], small)  # [R, V]
    if bool(tied.any()):
        probs[tied] = _tied_rows(scores[tied], values[tied], index[tied], settings)
    return probs


#: Extra logits read past the k-th so that ties at the top-k boundary (frequent in
#: bfloat16 logits) are kept without a pass over the vocabulary.
TIE_WINDOW = 16


def _tied_rows(scores: Tensor, values: Tensor, index: Tensor, settings) -> Tensor:
    """Rows [T, V] with a tie at the top-k boundary, from their largest W logits (values,
    index [T, W]): the kept set is every logit >= the k-th (ties kept), renormalised and
    cut by top-p over those W values; rows whose ties may run past W take the general
    path."""
    top_k = settings.top_k
    kept = values >= values[:, top_k - 1 : top_k]  # [T, W] the top-k set with its ties
    scaled = torch.where(kept, values / settings.temperature, -torch.inf)
    small = torch.softmax(scaled, dim=-1)  # [T, W] (0 outside the kept set)
    if settings.top_p < 1.0:
        small = _renormalised(small, top_p_mask(small, settings.top_p, values.shape[-1]))
    probs = torch.zeros_like(scores).scatter_(-1, index, small)  # [T, V]
    overflow = kept[:, -1] & (values.shape[-1] < scores.shape[-1])  # [T]
    if bool(overflow.any()):
        probs[overflow] = _general(scores[overflow], settings)
    return probs


def process_logits(logits: Tensor, settings: SamplingSettings = PLAIN_SETTING) -> Tensor:
    """Processed probabilities [..., V] from logits (−inf allowed for masked tokens).

    Computes in float32 (float64 for float64 logits). No validation of values: the
    decoder's logits come from a model; use ``cactus_theory.processors`` to validate.
    With top-k set (k < V) and no tie at the top-k boundary, only the k largest logits
    are processed (``_top_k_first``): the same law without a pass of softmax over V.
    """
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    scores = logits.to(dtype)
    if settings.temperature == 0:
        return greedy_rows(scores)
    if settings.top_k and settings.top_k < scores.shape[-1] and scores.numel():
        rows = scores.reshape(-1, scores.shape[-1])  # [R, V]
        return _top_k_first(rows, settings).reshape(scores.shape)
    return _general(scores, settings)


def _general(scores: Tensor, settings: SamplingSettings) -> Tensor:
    """temperature -> top-k -> top-p over whole rows [..., V] (T > 0)."""
    probs = torch.softmax(scores / settings.temperature, dim=-1)
    keep = top_k_mask(probs, settings.top_k)
    probs = _renormalised(probs, keep)
    candidates = None
    if settings.top_k and settings.top_p < 1.0 and settings.top_k < probs.shape[-1]:
        # At most this many nonzero entries per row (top-k keeps boundary ties): top-p then
        # needs only a top-k of that size, not a sort of the vocabulary.
        candidates = int(keep.sum(dim=-1).max())
    return _renormalised(probs, top_p_mask(probs, settings.top_p, candidates))
