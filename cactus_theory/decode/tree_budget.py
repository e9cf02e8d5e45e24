"""The per-sequence KL budget for trees (``speculative_generate(tree=..., max_kl=...)``).

As for chains (``decode.budget``), every row's Σ_t KL(e_t ‖ q_t) stays within ``max_kl``
surely: before each verification a row takes the first rule of a ladder whose *worst case*
this step fits in what it has left. A walk emits one token per node on its path, each
with that node's law, so the worst case of a step is the largest sum of KL(e_v ‖ q_v) over
the root-to-leaf paths of the row's tree (nodes with children; a leaf's bonus token has
law q): one pass over the depths, deepest first,

    worst(v) = KL(e_v ‖ q_v) + max(0, max_{children w} worst(w)),  worst = worst(root).

The ladder: a chain rule's lift runs the chain ladder lifted rule by rule (δ halved 8
times, then SpS, whose lift is lossless); a tree rule that declares ``lossless_at`` moves
its parameters halfway there 8 times; every ladder ends with the lossless lift of SpS
(the deterministic walk, or recursive rejection for sampled children), whose KL is 0. The
meter's laws are exact only for deterministic children or lossless rules
(``sampler.tree_meter``), so a budget with sampled children needs a lossless rule.
"""

from __future__ import annotations

import torch

from cactus_theory.core.rules.sps import SpS
from cactus_theory.core.trees import LiftedRule, lift
from cactus_theory.core.trees.base import DETERMINISTIC, TreeRule
from cactus_theory.decode.budget import LADDER_HALVINGS
from cactus_theory.decode.budget import ladder as chain_ladder
from cactus_theory.sampler.tree_meter import node_divergence
from cactus_theory.sampler.tree_structure import TreeStructure

Tensor = torch.Tensor


def tree_ladder(rule: TreeRule) -> list[TreeRule]:
    """The rules ``TreeBudget`` tries in order (module docstring)."""
    chain = rule.chain if isinstance(rule, LiftedRule) else None
    if chain is not None:
        return [lift(step) for step in chain_ladder(chain)]
    steps = [rule]
    if getattr(rule, "lossless", False):
        return steps
    lossless = getattr(rule, "lossless_at", None) or {}
    params = rule.params()
    moving = {
        key: (float(params[key]), float(value))
        for key, value in lossless.items()
        if key in params and isinstance(params[key], int | float) and params[key] != value
    }
    if moving and hasattr(rule, "with_params"):
        for halving in range(1, LADDER_HALVINGS + 1):
            changes = {
                key: target + (start - target) / 2**halving
                for key, (start, target) in moving.items()
            }
            steps.append(rule.with_params(**changes))
    steps.append(lift(SpS()))
    return steps


class TreeBudget:
    """Per-row rules so that every row's Σ KL(e_t ‖ q_t) stays within ``max_kl`` (module
    docstring); ``spent`` [B] holds what each original row has realised so far."""

    def __init__(self, rule: TreeRule, scheme: str, max_kl: float, prepared) -> None:
        if isinstance(max_kl, bool) or not isinstance(max_kl, int | float) or not max_kl >= 0:
            raise ValueError(f"max_kl: must be a number >= 0 (nats per sequence), got {max_kl!r}")
        if scheme != DETERMINISTIC and not getattr(rule, "lossless", False):
            raise ValueError(
                f"max_kl: the exact law of {rule.label} with {scheme} children is not computed "
                "(sampler.tree_meter); a budget needs deterministic children or a lossless rule"
            )
        self.max_kl = float(max_kl)
        self.ladder = tree_ladder(rule)
        self.spent = torch.zeros(prepared.batch, dtype=torch.float64, device=prepared.device)

    def choose(
        self, active: Tensor, target_probs: Tensor, tree, structure: TreeStructure
    ) -> list[TreeRule]:
        """The rule of each active row (original rows ``active`` [A]) this step."""
        batch = target_probs.shape[0]
        left = self.max_kl - self.spent[active]  # [A]
        chosen: list[TreeRule | None] = [None] * batch
        undecided = torch.arange(batch, device=target_probs.device)
        for rule in self.ladder:
            if getattr(rule, "lossless", False):
                fits = torch.ones(len(undecided), dtype=torch.bool, device=undecided.device)
            else:
                worst = worst_path_kl(rule, target_probs, tree.tokens, structure, undecided)
                fits = worst <= left[undecided]
            for row in undecided[fits].tolist():
                chosen[row] = rule
            undecided = undecided[~fits]
            if undecided.numel() == 0:
                break
        return chosen  # type: ignore[return-value]

    def spend(self, active: Tensor, realised: list[float]) -> None:
        """Add each active row's realised KL this step."""
        self.spent[active] += torch.tensor(realised, dtype=torch.float64, device=self.spent.device)


def worst_path_kl(
    rule: TreeRule,
    target_probs: Tensor,  # [A, N+1, V]
    tokens: Tensor,  # [A, N+1]
    structure: TreeStructure,
    rows: Tensor,  # [U] the rows to evaluate
) -> Tensor:
    """[U] the largest Σ KL(e_v ‖ q_v) over root-to-leaf paths of each row's tree under
    ``rule`` (deterministic children; module docstring)."""
    nodes = structure.parents.shape[1]
    kl = torch.zeros(len(rows), nodes, dtype=torch.float64, device=target_probs.device)
    counts = structure.num_children[rows]  # [U, N+1]
    for size in torch.unique(counts[counts > 0]).tolist():
        place, node = torch.nonzero(counts == size, as_tuple=True)  # [M] each
        row = rows[place]
        kids = structure.children[row, node, :size]  # [M, K]
        drafted = tokens[row].gather(1, kids)
        target_rows = target_probs[row, node].to(torch.float64)  # [M, V]
        kl[place, node] = node_divergence(rule, target_rows, drafted)[0]
    depth = structure.depth[rows]  # [U, N+1]
    parents = structure.parents[rows].clamp(min=0)
    worst = kl.clone()
    for level in range(structure.levels, 0, -1):
        below = torch.where(depth == level, worst, torch.zeros_like(worst))
        best_child = torch.zeros_like(worst).scatter_reduce(1, parents, below, "amax")
        worst = torch.where(depth == level - 1, kl + best_child, worst)
    return worst[:, 0]
