"""The divergence meter for trees: KL(e ‖ q) and TV(e, q) of every token a tree walk emits.

The token emitted at a node with children S (accepted child or residual, one draw either
way) has the node's law; the walk measures it as it goes (``verify_tree(measure=True)``,
from the acceptances and residuals it computes anyway), and ``node_divergence`` gives it
for any nodes (the KL budget's worst case). For **deterministic children** S is a
function of the history (the draft's state at the step's start), so the law given the
history is the conditional law e(· | S) = Σ_i P_i e_{x_i} + Π_j (1 − a_j) r
(``core.trees.base.conditional_law``): exact, from the rule's acceptances and residual at
the node. For **sampled children** of a rule that declares ``lossless`` the law is q, so
the meter reads 0 exactly. For sampled children of any other rule the law is an
expectation over the drafted tuples (V^K of them) and is not computed: the walk and the
decoder refuse that combination with the meter on, rather than print a number they cannot
stand behind. At a node without children (a leaf's bonus
token) the law is q: 0.

As for chains (``sampler.divergence_meter``), a row's sum is an unbiased estimate of the
KL of (text, tree phase) between the rule's law and the verifier's, and an upper bound in
expectation on the text's KL.

``accepted_moments`` gives the exact mean and second moment of a whole tree's accepted
length (deterministic children), which ``real.theory_trees`` compares with decoding.
"""

from __future__ import annotations

import torch

from cactus_theory.core.trees.base import DETERMINISTIC, TreeRule, end_probs
from cactus_theory.sampler.tree_rows import (
    conditional_divergence,
    final_residual,
    node_rows,
    sibling_accepts,
)
from cactus_theory.sampler.tree_structure import TreeStructure

Tensor = torch.Tensor


def metered_exactly(rule: TreeRule, scheme: str) -> bool:
    """Whether the meter's number is exact for ``rule`` with ``scheme`` children (module
    docstring): deterministic children, or a rule that declares ``lossless``."""
    return scheme == DETERMINISTIC or bool(getattr(rule, "lossless", False))


def node_divergence(
    rule: TreeRule,
    target_rows: Tensor,  # [R, V] q at the nodes
    children: Tensor,  # [R, K] drafted ids (deterministic)
) -> tuple[Tensor, Tensor]:
    """(KL(e ‖ q) [R], TV(e, q) [R]) of the conditional law of nodes with deterministic
    children, float64 (on rows packed to their support when the rule allows it:
    ``sampler.tree_rows``; the divergences are sums over the support). The walk computes
    the same for the nodes it visits (``verify_tree(measure=True)``)."""
    rows = node_rows(rule, target_rows, None, children, DETERMINISTIC)
    return conditional_divergence(rows, sibling_accepts(rule, rows), final_residual(rule, rows))


def accepted_moments(
    rule: TreeRule,
    target_probs: Tensor,  # [A, N+1, V]
    tokens: Tensor,  # [A, N+1]
    structure: TreeStructure,
) -> tuple[Tensor, Tensor]:
    """(E[L] [A], E[L²] [A]) float64 of the accepted length L of one walk of each row's
    tree with deterministic children: the walk reaches a child of u at rank r with
    P(reach u) · P_r(u) (``core.trees.base.end_probs`` of the rule's sequential
    acceptances at u), so E[L] = Σ_v P(reach v) over the drafted nodes, and, since a path
    of L nodes has L² = Σ_{j<=L} (2j − 1), E[L²] = Σ_v P(reach v)(2 depth(v) − 1)."""
    batch, nodes = structure.parents.shape
    reach = torch.zeros(batch, nodes, dtype=torch.float64, device=target_probs.device)
    reach[:, 0] = 1.0
    counts = structure.num_children
    for depth in range(structure.levels):
        here = (structure.depth == depth) & (counts > 0)  # [A, N+1]
        for size in torch.unique(counts[here]).tolist():
            rows, node = torch.nonzero(here & (counts == size), as_tuple=True)  # [M]
            kids = structure.children[rows, node, :size]  # [M, K]
            drafted = tokens[rows].gather(1, kids)
            group = node_rows(rule, target_probs[rows, node], None, drafted, DETERMINISTIC)
            ends = end_probs(sibling_accepts(rule, group))  # [M, K+1]
            reach[rows[:, None], kids] = reach[rows, node][:, None] * ends[:, :size]
    drafted = structure.parents >= 0  # [A, N+1]
    weights = torch.where(drafted, reach, 0.0)
    length = weights.sum(dim=1)
    square = (weights * (2 * structure.depth - 1).to(torch.float64)).sum(dim=1)
    return length, square
