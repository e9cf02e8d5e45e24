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


class RowMemo:
    """Processed rows of an n-gram model, computed once per context.

    An n-gram model's next-token row, and so its processed row, depends only on the last
    order − 1 tokens of a history. Decoding many rules from the same prompts with common
    random numbers (``sims.montecarlo``) asks for the same contexts again and again, so
    ``rows(contexts)`` computes only the contexts it has not seen (``compute`` on them, one
    call) and assembles the rest from its table. The result equals ``compute(contexts)``
    exactly: the same values, ids ascending, the same width (the most positive entries of
    any of these rows), padding with ``vocab_size``.

    The table holds at most ``limit`` contexts; past it, new contexts are computed without
    being kept.
    """

    def __init__(self, compute, vocab_size: int, limit: int = 200_000) -> None:
        self.compute = compute
        self.vocab_size = vocab_size
        self.limit = limit
        self.index: dict[int, int] = {}
        self.ids = np.zeros((0, 1), dtype=np.int64)
        self.probs = np.zeros((0, 1))
        self.counts = np.zeros(0, dtype=np.int64)
        self.hits = 0
        self.misses = 0

    def __call__(self, contexts: Array) -> CompactRows:
        """Rows for ``contexts`` [R, m] (token ids < ``vocab_size``)."""
        codes = np.zeros(contexts.shape[0], dtype=np.int64)
        for column in range(contexts.shape[1]):
            codes = codes * self.vocab_size + contexts[:, column].astype(np.int64)
        unique, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
        slots = np.array([self.index.get(int(code), -1) for code in unique], dtype=np.int64)
        missing = np.flatnonzero(slots < 0)
        self.hits += unique.size - missing.size
        self.misses += missing.size
        if missing.size:
            fresh = self.compute(contexts[first[missing]])
            counts = (fresh.ids < self.vocab_size).sum(axis=1)
            if len(self.index) + missing.size <= self.limit:
                slots[missing] = self._store(unique[missing], fresh, counts)
            else:  # the table is full: assemble these rows from the fresh batch directly
                return self._assemble_with(slots, inverse, missing, fresh, counts)
        width = max(1, int(self.counts[slots].max(initial=0)))
        picked = slots[inverse]
        return CompactRows(
            self.ids[picked, :width].copy(), self.probs[picked, :width].copy(), self.vocab_size
        )

    def _store(self, codes: Array, fresh: CompactRows, counts: Array) -> Array:
        width = max(self.ids.shape[1], fresh.width)
        start = self.ids.shape[0]
        self.ids = np.concatenate(
            [_widen(self.ids, width, self.vocab_size), _widen(fresh.ids, width, self.vocab_size)]
        )
        self.probs = np.concatenate(
            [_widen(self.probs, width, 0.0), _widen(fresh.probs, width, 0.0)]
        )
        self.counts = np.concatenate([self.counts, counts])
        slots = np.arange(start, start + codes.size)
        self.index.update(zip(codes.tolist(), slots.tolist(), strict=True))
        return slots

    def _assemble_with(self, slots, inverse, missing, fresh, counts) -> CompactRows:
        known = slots >= 0
        width = max(1, int(max(self.counts[slots[known]].max(initial=0), counts.max(initial=0))))
        ids = np.full((slots.size, width), self.vocab_size, dtype=np.int64)
        probs = np.zeros((slots.size, width))
        ids[known] = _widen(self.ids[slots[known]], width, self.vocab_size)[:, :width]
        probs[known] = _widen(self.probs[slots[known]], width, 0.0)[:, :width]
        ids[missing] = _widen(fresh.ids, width, self.vocab_size)[:, :width]
        probs[missing] = _widen(fresh.probs, width, 0.0)[:, :width]
        return CompactRows(ids[inverse], probs[inverse], self.vocab_size)


def _widen(array: Array, width: int, value) -> Array:
    """``array`` [R, W] padded on the right with ``value`` to at least ``width`` columns."""
    extra = width - array.shape[1]
    if extra <= 0:
        return array
    return np.concatenate([array, np.full((array.shape[0], extra), value, array.dtype)], axis=1)
