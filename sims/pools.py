"""A pool of (target, draft) next-token pairs: the common form of every source.

A pool is the empirical law of a source: N rows of verifier (target, the paper's q) and
draft (the paper's p) distributions over a shared per-row vocabulary. Synthetic pools
use the full vocabulary in every row; the real-text pool stores each row on the union of
the two supports (``sims.rows``), with ``ids`` mapping columns to token ids.

Drawing a pair uniformly from the pool at every position gives an i.i.d. source, for which
the block statistics of ``cactus_theory.block`` with α = mean acceptance over the pool are
exact; that is what the Monte Carlo check uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cactus_theory.core import validate

Array = np.ndarray


@dataclass(frozen=True)
class PairPool:
    """N (target, draft) rows; ``ids[r, j]`` is the token of column j (pad = vocab_size)."""

    name: str
    target_probs: Array
    draft_probs: Array
    ids: Array
    vocab_size: int
    description: str = ""
    settings: dict = field(default_factory=dict)
    contexts: Array | None = None  # the conditioning history of each row, when there is one

    def __post_init__(self) -> None:
        target = np.asarray(self.target_probs)
        if target.ndim != 2 or target.shape[0] == 0:
            raise ValueError(
                f"target_probs: the source {self.name!r} is empty (expected [N >= 1, V] rows, "
                f"got shape {target.shape})"
            )
        checked_target, checked_draft = validate.pair(self.target_probs, self.draft_probs)
        object.__setattr__(self, "target_probs", checked_target)
        object.__setattr__(self, "draft_probs", checked_draft)
        ids = np.asarray(self.ids, dtype=np.int64)
        if ids.shape != checked_target.shape:
            raise ValueError(f"ids: shape {ids.shape} does not match the rows {target.shape}")
        object.__setattr__(self, "ids", ids)

    @property
    def size(self) -> int:
        return self.target_probs.shape[0]

    @classmethod
    def full(
        cls,
        name: str,
        target_probs: Array,
        draft_probs: Array,
        description: str = "",
        settings: dict | None = None,
    ) -> PairPool:
        """A pool whose columns are the whole vocabulary (ids = 0..V−1 in every row)."""
        target = np.asarray(target_probs, dtype=np.float64)
        if target.ndim != 2 or target.shape[0] == 0 or target.shape[1] == 0:
            raise ValueError(
                f"target_probs: the source {name!r} is empty (expected [N >= 1, V] rows, "
                f"got shape {target.shape})"
            )
        ids = np.broadcast_to(np.arange(target.shape[1]), target.shape)
        return cls(
            name, target, draft_probs, ids, target.shape[1], description, dict(settings or {})
        )
