"""Interpolated Kneser–Ney n-gram language models over a token stream (vectorised numpy).

The real-text source needs a verifier and a weaker draft that give *full* next-token
distributions in real contexts. We use a smoothed 4-gram verifier and (by default) a
trigram draft, both interpolated Kneser–Ney (Chen & Goodman 1998), built from the
``cactus_theory.real.corpus`` train stream with ``np.unique`` counts and cached on disk keyed by
their settings and the stream.

For order N and a history h = (w_{-N+1}, ..., w_{-1}), with h' the history without its
oldest token and D_m the discount of order m:

    P_m(w | h) = max(c_m(h w) − D_m, 0) / T_m(h) + D_m N_m(h) / T_m(h) · P_{m−1}(w | h'),

where T_m(h) = Σ_w c_m(h w) and N_m(h) = #{w : c_m(h w) > 0}; when T_m(h) = 0 (unseen
history) P_m(w | h) = P_{m−1}(w | h'). The top order uses raw counts c_N; lower orders use
continuation counts c_m(g) = #{distinct tokens seen right before the m-gram g}. The base is

    P_1(w) = max(c_1(w) − D_1, 0) / T_1 + D_1 N_1 / T_1 · 1/V,

so every token has positive probability and every row sums to 1 exactly (up to rounding).
Discounts are Ney's estimate D_m = n1 / (n1 + 2 n2) from the count-of-counts of order m.

Token n-grams are coded as integers base V (V^N < 2^63 is checked), so every table is a
sorted int64 array and a history's entries are one ``searchsorted`` range.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cactus_theory.real import corpus
from cactus_theory.util.files import atomic_write_bytes
from cactus_theory.util.provenance import fingerprint

Array = np.ndarray


@dataclass(frozen=True)
class OrderTable:
    """The counts of one order m >= 2: sorted m-gram codes and their per-history sums."""

    codes: Array  # [E] int64, sorted: history_code * V + token
    counts: Array  # [E] float64: raw (top order) or continuation counts
    history_codes: Array  # [H] int64, sorted
    history_totals: Array  # [H] float64: T_m(h)
    history_types: Array  # [H] float64: N_m(h)
    discount: float


class NGramModel:
    """An interpolated Kneser–Ney model of order ``order`` over a vocabulary of ``vocab_size``.

    ``probs(histories)`` gives the dense next-token distributions [R, V] for histories
    [R, order − 1] (oldest token first). Build one with ``NGramModel.fit`` or ``load``.
    """

    def __init__(
        self, order: int, vocab_size: int, unigram: Array, tables: tuple[OrderTable, ...]
    ) -> None:
        self.order = order
        self.vocab_size = vocab_size
        self.unigram = unigram
        self.tables = tables  # tables[m - 2] is order m

    # -- building -------------------------------------------------------------------------

    @classmethod
    def fit(cls, tokens: object, order: int, vocab_size: int) -> NGramModel:
        """Count every order 1..``order`` of ``tokens`` and return the smoothed model."""
        stream = _check_tokens(tokens, vocab_size)
        if not isinstance(order, int) or isinstance(order, bool) or order < 1:
            raise ValueError(f"order: must be an integer >= 1, got {order!r}")
        if float(vocab_size) ** order >= 2.0**62:
            raise ValueError(f"order: vocab_size**order must fit in int64, got {order}")
        if stream.size < order:
            raise ValueError(f"tokens: need at least {order} tokens, got {stream.size}")
        size = np.int64(vocab_size)
        distinct = {}  # m -> sorted unique codes of the m-grams in the stream
        top_counts = None
        for m in range(1, order + 1):
            codes = _ngram_codes(stream, m, size)
            if m == order:
                distinct[m], top_counts = np.unique(codes, return_counts=True)
            else:
                distinct[m] = np.unique(codes)
        tables = []
        for m in range(2, order + 1):
            if m == order:
                codes, counts = distinct[m], top_counts.astype(np.float64)
            else:
                codes, counts = _continuation(distinct[m + 1], size**m)
            tables.append(_order_table(codes, counts, size))
        if order == 1:
            uni_codes, uni_counts = distinct[1], top_counts.astype(np.float64)
        else:
            uni_codes, uni_counts = _continuation(distinct[2], size)
        unigram = _unigram(uni_codes, uni_counts, vocab_size)
        return cls(order, vocab_size, unigram, tuple(tables))

    # -- querying -------------------------------------------------------------------------

    def probs(self, histories: object) -> Array:
        """[R, V] float64: P(next token | history) for each history row [R, order − 1].

        Written as P = Λ ⊗ P_1 + S, with Λ the product of the backoff weights of the seen
        orders and S the sparse discounted counts, each scaled by the weights above it.
        """
        rows = self._check_histories(histories)
        scale, entry_rows, entry_tokens, entry_mass = self.decompose(rows)
        result = np.multiply.outer(scale, self.unigram)
        for where, tokens, mass in zip(entry_rows, entry_tokens, entry_mass, strict=True):
            result[where, tokens] += mass  # (row, token) pairs are distinct within an order
        return result

    def decompose(self, rows: Array) -> tuple[Array, list[Array], list[Array], list[Array]]:
        """(Λ [R], and per order: entry rows, tokens, scaled masses) with P = Λ ⊗ P_1 + S.

        Orders are visited from the top; ``scale`` holds the product of the backoff weights
        D_m N_m(h) / T_m(h) of the seen orders above the current one.
        """
        scale = np.ones(rows.shape[0])
        entry_rows, entry_tokens, entry_mass = [], [], []
        size = np.int64(self.vocab_size)
        for table, which, code, total, types in self._seen_levels(rows):
            start = np.searchsorted(table.codes, code * size)
            stop = np.searchsorted(table.codes, code * size + size)
            lengths = stop - start
            offsets = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            entry = np.repeat(start, lengths) + offsets
            entry_rows.append(np.repeat(which, lengths))
            entry_tokens.append(table.codes[entry] % size)
            weight = np.repeat(scale[which] / total, lengths)
            entry_mass.append(np.maximum(table.counts[entry] - table.discount, 0.0) * weight)
            scale[which] *= table.discount * types / total
        return scale, entry_rows, entry_tokens, entry_mass

    def token_probs(self, histories: object, tokens: object) -> Array:
        """[R]: P(tokens[r] | histories[r]), from the same sum without building rows."""
        rows = self._check_histories(histories)
        ids = np.asarray(tokens)
        if ids.shape != (rows.shape[0],) or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"tokens: expected {rows.shape[0]} integer ids, got {ids.shape}")
        if np.any((ids < 0) | (ids >= self.vocab_size)):
            raise ValueError(f"tokens: ids must lie in [0, {self.vocab_size})")
        ids = ids.astype(np.int64)
        scale = np.ones(rows.shape[0])
        result = np.zeros(rows.shape[0])
        size = np.int64(self.vocab_size)
        for table, which, code, total, types in self._seen_levels(rows):
            key = code * size + ids[which]
            slot = np.minimum(np.searchsorted(table.codes, key), table.codes.size - 1)
            count = np.where(table.codes[slot] == key, table.counts[slot], 0.0)
            result[which] += scale[which] * np.maximum(count - table.discount, 0.0) / total
            scale[which] *= table.discount * types / total
        return result + scale * self.unigram[ids]

    def _seen_levels(self, rows: Array):
        """Per order m >= 2, top first, for the rows whose history h_m was seen in training:
        (table, those rows, their history codes, T_m(h), N_m(h))."""
        size = np.int64(self.vocab_size)
        for m in range(self.order, 1, -1):
            table = self.tables[m - 2]
            code = _codes_of(rows[:, rows.shape[1] - (m - 1) :], size)
            slot = np.minimum(
                np.searchsorted(table.history_codes, code), table.history_codes.size - 1
            )
            which = np.flatnonzero(table.history_codes[slot] == code)
            if which.size:
                found = slot[which]
                yield (
                    table,
                    which,
                    code[which],
                    table.history_totals[found],
                    table.history_types[found],
                )

    def _check_histories(self, histories: object) -> Array:
        rows = np.asarray(histories)
        width = self.order - 1
        if rows.ndim != 2 or rows.shape[1] != width or not np.issubdtype(rows.dtype, np.integer):
            raise ValueError(
                f"histories: expected integer ids of shape [R, {width}], got {rows.shape}"
            )
        if np.any((rows < 0) | (rows >= self.vocab_size)):
            raise ValueError(f"histories: ids must lie in [0, {self.vocab_size})")
        return rows.astype(np.int64)

    # -- persistence ----------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        arrays = {"meta": np.array([self.order, self.vocab_size]), "unigram": self.unigram}
        for m, table in enumerate(self.tables, start=2):
            for field in OrderTable.__dataclass_fields__:
                arrays[f"{m}_{field}"] = np.asarray(getattr(table, field))
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        return buffer.getvalue()

    @classmethod
    def from_file(cls, path: Path) -> NGramModel:
        with np.load(path) as data:
            order, vocab_size = (int(v) for v in data["meta"])
            tables = tuple(
                OrderTable(
                    **{
                        field: (
                            float(data[f"{m}_{field}"])
                            if field == "discount"
                            else data[f"{m}_{field}"]
                        )
                        for field in OrderTable.__dataclass_fields__
                    }
                )
                for m in range(2, order + 1)
            )
            return cls(order, vocab_size, data["unigram"], tables)


def cached_model(tokens: Array, order: int, vocab_size: int) -> NGramModel:
    """``NGramModel.fit`` cached under ``corpus.cache_dir()``, keyed by settings and stream."""
    stream = _check_tokens(tokens, vocab_size)
    digest = hashlib.sha256(stream.astype(np.int32).tobytes()).hexdigest()
    key = fingerprint("kneser-ney", order, vocab_size, digest)
    path = corpus.cache_dir() / f"ngram-{order}-{key}.npz"
    if path.exists():
        return NGramModel.from_file(path)
    model = NGramModel.fit(stream, order, vocab_size)
    atomic_write_bytes(path, model.to_bytes())
    return model


# -- helpers (pure) -------------------------------------------------------------------------


def _check_tokens(tokens: object, vocab_size: int) -> Array:
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 2:
        raise ValueError(f"vocab_size: must be an integer >= 2, got {vocab_size!r}")
    stream = np.asarray(tokens)
    if stream.ndim != 1 or stream.size == 0:
        raise ValueError(f"tokens: expected a non-empty 1-D token stream, got {stream.shape}")
    if not np.issubdtype(stream.dtype, np.integer):
        raise ValueError(f"tokens: expected integer ids, got dtype {stream.dtype}")
    if np.any((stream < 0) | (stream >= vocab_size)):
        raise ValueError(f"tokens: ids must lie in [0, {vocab_size})")
    return stream.astype(np.int64)


def _ngram_codes(stream: Array, m: int, size: np.int64) -> Array:
    """Codes Σ_j w_{i+j} V^{m−1−j} of every m-gram window of ``stream``."""
    count = stream.size - m + 1
    codes = np.zeros(count, dtype=np.int64)
    for j in range(m):
        codes = codes * size + stream[j : j + count]
    return codes


def _codes_of(rows: Array, size: np.int64) -> Array:
    codes = np.zeros(rows.shape[0], dtype=np.int64)
    for j in range(rows.shape[1]):
        codes = codes * size + rows[:, j]
    return codes


def _continuation(longer_codes: Array, modulus: np.int64) -> tuple[Array, Array]:
    """Continuation counts: for each m-gram, how many distinct (m+1)-grams end with it."""
    suffixes = longer_codes % modulus
    codes, counts = np.unique(suffixes, return_counts=True)
    return codes, counts.astype(np.float64)


def _ney_discount(counts: Array) -> float:
    """D = n1 / (n1 + 2 n2), clipped to [0.1, 0.9] when either count-of-counts is 0."""
    n1 = float(np.sum(counts == 1))
    n2 = float(np.sum(counts == 2))
    if n1 == 0 or n2 == 0:
        return 0.5
    return float(np.clip(n1 / (n1 + 2.0 * n2), 0.1, 0.9))


def _order_table(codes: Array, counts: Array, size: np.int64) -> OrderTable:
    history, inverse = np.unique(codes // size, return_inverse=True)
    return OrderTable(
        codes=codes,
        counts=counts,
        history_codes=history,
        history_totals=np.bincount(inverse, weights=counts),
        history_types=np.bincount(inverse).astype(np.float64),
        discount=_ney_discount(counts),
    )


def _unigram(codes: Array, counts: Array, vocab_size: int) -> Array:
    discount = _ney_discount(counts)
    total = counts.sum()
    probs = np.full(vocab_size, discount * codes.size / total / vocab_size)
    probs[codes] += np.maximum(counts - discount, 0.0) / total
    return probs / probs.sum()
