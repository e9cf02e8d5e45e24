"""The optimal lossless verifier: any scheme's best acceptance α*, attained (Khisti et al.,
"Multi-Draft Speculative Sampling: Canonical Decomposition and Theoretical Limits",
ICLR 2025; SpecTr's OT with membership cost, NeurIPS 2023).

Khisti et al. show that an optimal verifier can be decomposed into an importance-weighted
choice of one drafted token followed by single-draft speculative sampling. This rule
follows the optimal coupling itself (``optimum.optimal_flow``: the max-flow from the sets
of drafted tokens to q), which is that decomposition with the choice and the SpS step
merged: given the drafted tuple x with token set S,

    P(end at the first child holding y) = f(S, y) / P(S)       (y ∈ S),
    r = (q − inflow) / (1 − α*),   inflow(y) = Σ_S f(S, y) <= q(y),

so the node emits inflow + (q − inflow) = q exactly and accepts Σ f = α*. The flow depends
on the whole joint law of the tuples, so the rule is made for one drafting scheme
(``optimal:scheme=with-replacement``, the default; ``without-replacement``, ``hub``, or
``deterministic``, where it is the walk). It solves one LP per distinct node (cached), in
numpy only: it is the reference for what the others leave on the table, not a sampler
for large vocabularies (its tuples are enumerated).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from cactus_theory.core.arrays import is_numpy
from cactus_theory.core.trees.base import DETERMINISTIC, SCHEMES, WITH_REPLACEMENT, TreeRule
from cactus_theory.core.trees.law import scheme_tuples, tuple_probabilities
from cactus_theory.core.trees.optimum import Flow, _token_sets, optimal_flow, sorted_optimum
from cactus_theory.core.trees.rules.sequential import Walk

Array = np.ndarray

#: Distinct nodes whose flows are kept.
CACHE_SIZE = 512
_WALK = Walk()


class OptimalVerifier(TreeRule):
    """Follows an optimal coupling of the drafted sets and q (module docstring): lossless,
    acceptance α*."""

    name: ClassVar[str] = "optimal"
    lossless: ClassVar[bool] = True
    lossless_at: ClassVar[Mapping[str, Any]] = {}
    support_only: ClassVar[bool] = True

    def __init__(self, scheme: str = "with-replacement") -> None:
        if scheme not in SCHEMES:
            raise ValueError(f"scheme: expected one of {SCHEMES}, got {scheme!r}")
        self.scheme = scheme
        self._flows: OrderedDict[bytes, Flow] = OrderedDict()

    def params(self) -> dict[str, Any]:
        return {"scheme": self.scheme}

    @property
    def schemes(self) -> tuple[str, ...]:  # type: ignore[override]
        return (self.scheme,)

    def flow(self, target_row: Array, draft_row: Array, width: int) -> Flow:
        """The optimal flow of one node (q, p, K children by this rule's scheme), cached."""
        key = b"".join([target_row.tobytes(), draft_row.tobytes(), str(width).encode()])
        if key in self._flows:
            self._flows.move_to_end(key)
            return self._flows[key]
        tuples = scheme_tuples(draft_row, width, self.scheme)
        chance = tuple_probabilities(draft_row, tuples, self.scheme)
        found = optimal_flow(target_row, tuples, chance)
        self._flows[key] = found
        if len(self._flows) > CACHE_SIZE:
            self._flows.popitem(last=False)
        return found

    def _rows(self, target_probs, proposals, children):
        """(ends [R, K+1], residual [R, V]) for the flattened rows."""
        if not all(is_numpy(a) for a in (target_probs, proposals, children)):
            raise ValueError("rule: the optimal verifier runs on numpy rows only")
        vocab, width = target_probs.shape[-1], children.shape[-1]
        target = np.broadcast_to(target_probs, children.shape[:-1] + (vocab,)).reshape(-1, vocab)
        draft = np.broadcast_to(proposals[..., 0, :], target.shape[:-1] + (vocab,))
        draft = draft.reshape(-1, vocab)
        ids = children.reshape(-1, width)
        ends = np.zeros((ids.shape[0], width + 1))
        residual = np.zeros_like(target)
        keys = np.concatenate([target, draft], axis=-1)
        unique, where = np.unique(keys, axis=0, return_inverse=True)
        for group in range(unique.shape[0]):
            rows = np.flatnonzero(where.reshape(-1) == group)
            found = self.flow(target[rows[0]].copy(), draft[rows[0]].copy(), width)
            index = np.searchsorted(found.sets, _token_sets(ids[rows], found.tokens))
            chance = found.chance[index][:, None]  # [r, 1] P(S); 0 for a tuple never drafted
            share = found.accepted[index] / np.where(chance > 0, chance, 1.0)  # [r, V]
            picked = np.take_along_axis(share, ids[rows], axis=-1)  # [r, K]
            first = np.ones_like(picked, dtype=bool)
            for i in range(1, width):
                first[:, i] = np.all(ids[rows][:, :i] != ids[rows][:, i : i + 1], axis=-1)
            ends[rows, :-1] = np.where(first, picked, 0.0)
            ends[rows, -1] = np.maximum(1.0 - ends[rows, :-1].sum(axis=-1), 0.0)
            left = np.maximum(target[rows[0]] - found.inflow, 0.0)
            residual[rows] = left / left.sum() if left.sum() > 0 else target[rows[0]]
        return ends, residual

    def sibling_accepts(self, target_probs, proposals, children):
        if self.scheme == DETERMINISTIC:
            return _WALK.sibling_accepts(target_probs, proposals, children)
        ends, _ = self._rows(target_probs, proposals, children)
        before = 1.0 - np.concatenate(
            [np.zeros((ends.shape[0], 1)), np.cumsum(ends[:, :-2], axis=-1)], axis=-1
        )  # [R, K] P(reach child i)
        accepts = np.where(before > 0, ends[:, :-1] / np.where(before > 0, before, 1.0), 0.0)
        return np.clip(accepts, 0.0, 1.0).reshape(children.shape)

    def final_residual(self, target_probs, proposals, children):
        if self.scheme == DETERMINISTIC:
            return _WALK.final_residual(target_probs, proposals, children)
        _, residual = self._rows(target_probs, proposals, children)
        return residual.reshape(children.shape[:-1] + (target_probs.shape[-1],))

    def closed_form_law(self, target_probs, draft_probs, width, scheme):
        return target_probs

    def closed_form_acceptance(self, target_probs, draft_probs, width, scheme):
        """α* by the sorted-prefix scan for i.i.d. children (``optimum``); else None."""
        if scheme != WITH_REPLACEMENT and width > 1:
            return None
        return sorted_optimum(target_probs, draft_probs, width)
