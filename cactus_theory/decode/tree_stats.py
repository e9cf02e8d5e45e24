"""Acceptance of tree runs by depth and by rank, from the walks' outcomes.

At every node with children that a walk reaches (depth d, K children), the walk ends at
the child of rank r (the draft's r-th choice, 0-based) or rejects all K. For rules that
try children in order (every ``core.trees.base`` rule), P(end at rank r) = a_r Π_{j<r}
(1 − a_j) does not depend on how many siblings come after r, so

    α(d, r) = ended(d, r) / reached(d, r)

with reached(d, r) the visits at depth d of a node with more than r children, estimates
the chance that a reached node's rank-r child is accepted: the table a tree's expected
accepted length is built from (``core.trees.shape_search``). α by depth (any child
accepted) is ``DecodeResult.alpha_by_position``; α by rank sums over depths.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def rank_counts(outcomes: Tensor, children: Tensor) -> tuple[list[list[int]], list[list[int]]]:
    """(ended [D][R], reached [D][R]) from ``outcomes`` and ``children`` [..., D] (the
    layout of ``DecodeResult.tree_outcomes``; R = the most children of any visited node)."""
    levels = outcomes.shape[-1]
    flat_outcomes = outcomes.reshape(-1, levels)  # [M, D]
    flat_children = children.reshape(-1, levels)
    width = int(flat_children.max()) if flat_children.numel() else 0
    ended = [[0] * width for _ in range(levels)]
    reached = [[0] * width for _ in range(levels)]
    for depth in range(levels):
        visited = flat_outcomes[:, depth] >= 0
        outcome = flat_outcomes[visited, depth]
        count = flat_children[visited, depth]
        for rank in range(width):
            reached[depth][rank] = int((count > rank).sum())
            ended[depth][rank] = int((outcome == rank).sum())
    return ended, reached


def add_counts(total: list[list[int]], part: list[list[int]]) -> None:
    """total += part elementwise, growing ``total`` (lists [D][R]) as needed."""
    while len(total) < len(part):
        total.append([])
    for row, values in zip(total, part, strict=False):
        row.extend([0] * (len(values) - len(row)))
        for index, value in enumerate(values):
            row[index] += value


def ratios(ended: list[list[int]], reached: list[list[int]]) -> list[list[float | None]]:
    """α(d, r) = ended / reached per depth and rank (None where nothing reached)."""
    return [
        [done / seen if seen else None for done, seen in zip(row_end, row_seen, strict=True)]
        for row_end, row_seen in zip(ended, reached, strict=True)
    ]


def by_rank(ended: list[list[int]], reached: list[list[int]]) -> list[float | None]:
    """α(r) pooled over depths: Σ_d ended(d, r) / Σ_d reached(d, r)."""
    width = max((len(row) for row in ended), default=0)
    pooled = []
    for rank in range(width):
        done = sum(row[rank] for row in ended if rank < len(row))
        seen = sum(row[rank] for row in reached if rank < len(row))
        pooled.append(done / seen if seen else None)
    return pooled


def tree_costs(timing: dict, acceptance_length: float, step: float) -> dict:
    """A tree run's costs in autoregressive steps ``step``: c per draft forward, v per
    verify call, the rest per call, L draft forwards per step and (AL + 1)/(L c + v)."""
    calls = max(timing.get("verifier_calls", 0), 1)
    forwards = timing.get("draft_calls", 0) / calls
    draft = timing.get("draft", 0.0) / max(timing.get("draft_calls", 0), 1) / step
    verify = timing.get("verify", 0.0) / calls / step
    rest = timing.get("total", 0.0) - timing.get("prefill", 0.0)
    rest -= timing.get("draft", 0.0) + timing.get("verify", 0.0)
    return {
        "draft_cost": draft,
        "verify_cost": verify,
        "other_cost": rest / calls / step,
        "draft_forwards": forwards,
        "predicted_speedup": (acceptance_length + 1.0) / max(forwards * draft + verify, 1e-12),
    }
