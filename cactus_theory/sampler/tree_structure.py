"""The structure of drafted trees in torch, batched: depths, ancestors, children in order.

A batch of trees is ``parents [B, N+1]`` (int64): node 0 of every row is the root (parent
−1), node j > 0 has a parent before it, or −1 when it is padding (a row with fewer nodes
than the batch's N). This is the layout of ``cactus_theory.core.trees.verify``, whose numpy
loops these replace with O(D) vectorised steps (D = the greatest depth): pointer jumping
for depths and ancestors, one comparison [B, N+1, N+1] for the children's order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tensor = torch.Tensor


@dataclass(frozen=True)
class TreeStructure:
    """What the walk, the masks and the compaction read, computed once per step.

    parents [B, N+1], real [B, N+1] bool (root and drafted nodes), depth [B, N+1],
    children [B, N+1, K] node indices in the order the walk tries them (−1 padded, K the
    most children of any node), num_children [B, N+1], rank [B, N+1] (a node's place among
    its siblings; 0 for the root), levels = D (the greatest depth).
    """

    parents: Tensor
    real: Tensor
    depth: Tensor
    children: Tensor
    num_children: Tensor
    rank: Tensor
    levels: int

    @classmethod
    def of(cls, parents: Tensor) -> TreeStructure:
        """The structure of ``parents [B, N+1]`` (int64; layout in the module docstring)."""
        parents = parents.to(torch.int64)
        batch, nodes = parents.shape
        real = parents >= 0
        real[:, 0] = True
        depth = node_depths(parents)
        sibling = (parents[:, :, None] == parents[:, None, :]) & real[:, None, :]  # [B, N+1, N+1]
        index = torch.arange(nodes, device=parents.device)
        earlier = index[None, :] < index[:, None]  # [N+1, N+1]: j < i
        rank = (sibling & earlier[None]).sum(dim=-1)  # [B, N+1]
        rank = torch.where(parents >= 0, rank, 0)
        num_children = torch.zeros(batch, nodes, dtype=torch.int64, device=parents.device)
        drafted = parents >= 0  # [B, N+1]
        num_children.scatter_add_(1, parents.clamp(min=0), drafted.to(torch.int64))
        width = max(int(num_children.max()) if nodes else 0, 1)
        children = torch.full((batch, nodes, width), -1, dtype=torch.int64, device=parents.device)
        rows, kids = torch.nonzero(drafted, as_tuple=True)
        children[rows, parents[rows, kids], rank[rows, kids]] = kids
        levels = int(depth.max()) if nodes else 0
        return cls(parents, real, depth, children, num_children, rank, levels)


def node_depths(parents: Tensor) -> Tensor:
    """[B, N+1] depth of every node (root and padding 0), by pointer jumping (D gathers)."""
    depth = torch.zeros_like(parents)
    above = parents.clone()  # [B, N+1] the ancestor reached so far (−1: past the root)
    while bool((above >= 0).any()):
        depth += (above >= 0).to(depth.dtype)
        above = torch.where(above >= 0, parents.gather(1, above.clamp(min=0)), above)
    return depth


def ancestors(parents: Tensor, levels: int) -> Tensor:
    """[B, N+1, N+1] bool: entry (i, j) is True iff node j is node i or an ancestor of it
    (padding nodes see only themselves); ``levels`` = the greatest depth."""
    batch, nodes = parents.shape
    seen = torch.eye(nodes, dtype=torch.bool, device=parents.device).expand(batch, -1, -1).clone()
    above = parents.clone()  # [B, N+1]
    for _ in range(levels):
        rows, own = torch.nonzero(above >= 0, as_tuple=True)
        seen[rows, own, above[rows, own]] = True
        above = torch.where(above >= 0, parents.gather(1, above.clamp(min=0)), above)
    return seen


def path_tokens(tokens: Tensor, path: Tensor) -> Tensor:
    """[B, D+1] the tokens of the nodes on each row's ``path [B, D+1]`` (−1 past its end)."""
    return torch.where(path >= 0, tokens.gather(1, path.clamp(min=0)), -1)
