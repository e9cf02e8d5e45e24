"""Sampling processors (temperature, top-k, top-p) as exact numpy, the reference for torch.

In a speculative decoder both q (verifier) and p (draft) must be the distributions *after*
the same processors; p must be exactly the law the drafted token was sampled from.

Order and semantics follow Hugging Face ``generate`` (temperature, then top-k, then top-p),
made tie-robust so that numpy and torch agree exactly:

- temperature T > 0: probs ∝ exp(logits / T) (on probabilities: ∝ probs^(1/T));
  T = 0 means greedy: the one-hot at argmax (first index on ties).
- top-k (k >= 1, or None/0 to disable): keep x iff its probability is >= the k-th largest
  (ties at the boundary are all kept, as in ``TopKLogitsWarper``).
- top-p (0 < top_p <= 1, 1 disables): keep x iff the mass of tokens strictly more probable
  than x is < top_p, i.e. the smallest top set reaching top_p, with boundary ties kept.
  Without ties this is exactly ``TopPLogitsWarper``.

The paper's setting is ``PAPER_SETTING`` (T = 0.6, top-k 20, top-p 0.95).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special

from cactus_theory.core import validate

Array = np.ndarray


@dataclass(frozen=True)
class SamplingSettings:
    """Temperature, top-k and top-p applied identically to draft and verifier."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0

    def __post_init__(self) -> None:
        validate.nonnegative("temperature", self.temperature)
        if self.top_k is not None and self.top_k != 0:
            validate.positive_int("top_k", self.top_k)
        top_p = validate.positive("top_p", self.top_p)
        if top_p > 1.0:
            raise ValueError(f"top_p: must lie in (0, 1], got {top_p!r}")

    @property
    def label(self) -> str:
        parts = [f"T={self.temperature:g}"]
        if self.top_k:
            parts.append(f"top-k={self.top_k}")
        if self.top_p < 1.0:
            parts.append(f"top-p={self.top_p:g}")
        return ", ".join(parts)


PAPER_SETTING = SamplingSettings(temperature=0.6, top_k=20, top_p=0.95)
PLAIN_SETTING = SamplingSettings(temperature=1.0)


def greedy_rows(scores: Array) -> Array:
    """One-hot rows at argmax (first index on ties)."""
    return (np.arange(scores.shape[-1]) == np.argmax(scores, axis=-1)[..., None]).astype(float)


def top_k_mask(probs: Array, top_k: int | None) -> Array:
    """Keep x iff probs_x >= the k-th largest of its row (boundary ties kept)."""
    if not top_k or top_k >= probs.shape[-1]:
        return np.ones(probs.shape, dtype=bool)
    kth = -np.partition(-probs, top_k - 1, axis=-1)[..., top_k - 1]
    return probs >= kth[..., None]


def top_p_mask(probs: Array, top_p: float) -> Array:
    """Keep x iff Σ_{y : probs_y > probs_x} probs_y < top_p (boundary ties kept)."""
    if top_p >= 1.0:
        return np.ones(probs.shape, dtype=bool)
    order = np.argsort(-probs, axis=-1, kind="stable")
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    before = np.cumsum(sorted_probs, axis=-1) - sorted_probs  # mass ranked strictly before
    # Tokens tied with an earlier one share the mass strictly above the tie group.
    group_start = np.concatenate(
        [np.ones(probs.shape[:-1] + (1,), bool), sorted_probs[..., 1:] != sorted_probs[..., :-1]],
        axis=-1,
    )
    start_index = np.maximum.accumulate(
        np.where(group_start, np.arange(probs.shape[-1]), 0), axis=-1
    )
    strictly_above = np.take_along_axis(before, start_index, axis=-1)
    keep_sorted = strictly_above < top_p
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return keep


def _truncate(probs: Array, settings: SamplingSettings) -> Array:
    kept = np.where(top_k_mask(probs, settings.top_k), probs, 0.0)
    kept = kept / kept.sum(axis=-1, keepdims=True)
    kept = np.where(top_p_mask(kept, settings.top_p), kept, 0.0)
    return kept / kept.sum(axis=-1, keepdims=True)


def process_logits(logits: object, settings: SamplingSettings = PLAIN_SETTING) -> Array:
    """Processed probabilities [..., V] from logits (−inf allowed for masked tokens)."""
    scores = np.asarray(logits, dtype=np.float64)
    if scores.ndim == 0 or scores.shape[-1] == 0:
        raise ValueError("logits: expected an array with a vocabulary axis")
    if np.any(np.isnan(scores)) or np.any(scores == np.inf):
        raise ValueError("logits: contains NaN or +inf")
    if np.any(np.all(scores == -np.inf, axis=-1)):
        raise ValueError("logits: a row is entirely -inf")
    if settings.temperature == 0:
        return greedy_rows(scores)
    return _truncate(special.softmax(scores / settings.temperature, axis=-1), settings)


def process_probs(probs: object, settings: SamplingSettings = PLAIN_SETTING) -> Array:
    """Processed probabilities [..., V] from probabilities (zeros stay zero)."""
    rows = validate.distribution("probs", probs)
    if settings.temperature == 0:
        return greedy_rows(rows)
    if settings.temperature != 1.0:
        with np.errstate(divide="ignore"):
            rows = special.softmax(np.log(rows) / settings.temperature, axis=-1)
    return _truncate(rows, settings)
