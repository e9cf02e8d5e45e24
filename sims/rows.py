"""Compact next-token rows: only the tokens with positive probability, as (ids, probs).

After top-k / top-p a verifier or draft row has a few dozen tokens with positive mass out
of thousands. Every rule in ``cactus_theory.rules`` works row by row and ignores columns
where both the target and the draft are 0 (such a column has h = 0 for every rule, adds
nothing to entropies, sums or sorts, and a top-k threshold over it is 0 exactly when it is
0 over the full row). So a (target, draft) pair can be verified exactly on the *union of
their supports* instead of the full vocabulary. Ids are kept ascending within a row so that
"first index on ties" and inverse-CDF sampling pick the same token as on the full row.

A compact batch is ``ids [R, W]`` (int64, ascending, padded with ``pad_id``) and ``probs
[R, W]`` (0 on padding). ``pad_id`` is the vocabulary size, so it sorts after every token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cactus_theory.core import processors
from cactus_theory.core.processors import SamplingSettings

Array = np.ndarray


@dataclass(frozen=True)
class CompactRows:
    """Rows of a distribution over a vocabulary of ``vocab_size``, stored sparsely."""

    ids: Array  # [R, W] int64 ascending, pad = vocab_size
    probs: Array  # [R, W] float64, 0 on padding
    vocab_size: int

    @property
    def width(self) -> int:
        return self.ids.shape[1]

    def take(self, rows: Array) -> CompactRows:
        return CompactRows(self.ids[rows], self.probs[rows], self.vocab_size)

    def dense(self) -> Array:
        """[R, V]: the full rows (for tests and small vocabularies)."""
        out = np.zeros((self.ids.shape[0], self.vocab_size + 1))
        np.put_along_axis(out, self.ids, self.probs, axis=1)
        return out[:, : self.vocab_size]


def pack(ids: Array, probs: Array, keep: Array, vocab_size: int) -> CompactRows:
    """Keep the entries where ``keep`` is true, packed left in ascending id order."""
    order = np.argsort(np.where(keep, ids, vocab_size), axis=1, kind="stable")
    ids_sorted = np.take_along_axis(np.where(keep, ids, vocab_size), order, axis=1)
    probs_sorted = np.take_along_axis(np.where(keep, probs, 0.0), order, axis=1)
    width = max(1, int(keep.sum(axis=1).max(initial=0)))
    return CompactRows(ids_sorted[:, :width].copy(), probs_sorted[:, :width].copy(), vocab_size)


def from_dense(probs: Array) -> CompactRows:
    """Compact rows from dense rows [R, V] (positive entries only)."""
    vocab_size = probs.shape[1]
    ids = np.broadcast_to(np.arange(vocab_size), probs.shape)
    return pack(ids, probs, probs > 0, vocab_size)


def top_candidates(dense: Array, count: int) -> CompactRows:
    """Every token whose probability is >= the ``count``-th largest of its row (ties kept)."""
    vocab_size = dense.shape[1]
    if count >= vocab_size:
        return from_dense(dense)
    kth = -np.partition(-dense, count - 1, axis=1)[:, count - 1]
    keep = dense >= kth[:, None]
    rows, cols = np.nonzero(keep)  # row-major: ascending ids within each row
    counts = keep.sum(axis=1)
    width = int(counts.max())
    slot = np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)
    ids = np.full((dense.shape[0], width), vocab_size, dtype=np.int64)
    probs = np.zeros((dense.shape[0], width))
    ids[rows, slot] = cols
    probs[rows, slot] = dense[rows, cols]
    return CompactRows(ids, probs, vocab_size)


def process(dense: Array, settings: SamplingSettings) -> CompactRows:
    """``processors.process_probs(dense, settings)`` as compact rows, without sorting [R, V].

    With top-k (or greedy), only the candidates >= the k-th largest can survive; processing
    them renormalised gives exactly the processed full row, because temperature, top-k and
    top-p are invariant to the row's normalisation and rank tokens within the kept set only.
    """
    if settings.temperature == 0:
        candidates = top_candidates(dense, 1)
    elif settings.top_k:
        candidates = top_candidates(dense, settings.top_k)
    else:
        candidates = from_dense(dense)
    rows = candidates.probs / candidates.probs.sum(axis=1, keepdims=True)
    processed = processors.process_probs(rows, settings)
    return pack(candidates.ids, processed, processed > 0, dense.shape[1])


@dataclass(frozen=True)
class AlignedPairs:
    """(target, draft) rows on a shared compact vocabulary per row: ids [R, W]."""

    ids: Array
    target_probs: Array
    draft_probs: Array
    vocab_size: int

    def column_of(self, tokens: Array) -> Array:
        """[R]: the column of ``tokens[r]`` in row r (the token must be in the row)."""
        match = self.ids == np.asarray(tokens)[:, None]
        if not np.all(match.any(axis=1)):
            raise ValueError("tokens: a token is not in its row's compact vocabulary")
        return np.argmax(match, axis=1)


def align(target: CompactRows, draft: CompactRows) -> AlignedPairs:
    """Put each target row and draft row on the union of their ids (ascending)."""
    if target.vocab_size != draft.vocab_size or target.ids.shape[0] != draft.ids.shape[0]:
        raise ValueError("draft: rows or vocabulary do not match the target rows")
    pad = target.vocab_size
    both = np.sort(np.concatenate([target.ids, draft.ids], axis=1), axis=1)
    repeated = np.zeros(both.shape, dtype=bool)
    repeated[:, 1:] = both[:, 1:] == both[:, :-1]
    union = np.sort(np.where(repeated, pad, both), axis=1)
    width = max(1, int((union < pad).sum(axis=1).max(initial=0)))
    union = union[:, :width].copy()
    return AlignedPairs(
        union,
        _scatter(union, target),
        _scatter(union, draft),
        target.vocab_size,
    )


def _scatter(union: Array, rows: CompactRows) -> Array:
    """The probabilities of ``rows`` placed in the columns of ``union`` (same row order)."""
    count, width = union.shape
    stride = np.int64(rows.vocab_size + 1)
    offsets = np.arange(count, dtype=np.int64)[:, None] * stride
    flat_union = (union + offsets).ravel()
    real = rows.ids < rows.vocab_size
    keys = (rows.ids + offsets)[real]
    where = np.searchsorted(flat_union, keys)
    out = np.zeros(count * width)
    out[where] = rows.probs[real]
    return out.reshape(count, width)
