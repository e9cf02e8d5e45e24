"""The tree shape that buys the most tokens per second (Sequoia-style), from the acceptance
by depth and rank and the measured costs.

**Expected accepted length of a template.** Let α(d, r) be the probability that a walk at
a node of depth d ends at its child of rank r (the draft's r-th choice), given the node
was reached; for rules that try children in order this does not depend on how many
siblings follow r (``decode.tree_stats``). If these chances are the same wherever the node
sits (the positional assumption Sequoia makes), a node v is accepted with the product of
α over the edges of its path, and the expected accepted drafts of a template are

    E = Σ_v Π_{(u → w) on the path to v} α(depth(u), rank(w)).

**The best template for m nodes** (at most m, depth at most L) is a dynamic programme over
subtrees. T(d, m) = the most a reached node of depth d can add with m nodes below it:

    T(d, m) = H(d, 0, m),  H(d, r, m) = max(0, max_{1<=j<=m} α(d, r)(1 + T(d+1, j − 1))
                                               + H(d, r + 1, m − j)),

with T(L, m) = 0 and α(d, r) = 0 beyond the table's ranks: child r takes j nodes (itself
and j − 1 below it), the later ranks share the rest. The tree is read back from the
arg-maxima, breadth-first with siblings in rank order (``decode.tree_shape``'s template).

**The choice.** For every depth cap L and budget m the template's cost per step is

    Σ_levels draft(F_l) + verify(m + 1) + rest,

one draft forward per level with a frontier (level 0: the root; level l: the nodes of
depth l that have children), the verifier's forward of the root and m nodes, and the rest
of a step; the chosen template maximises (1 + E) / cost (tokens per second up to the
common step time). Costs are in any one unit (seconds, or autoregressive steps).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Choice:
    """A template (``parents`` of nodes 1..N, breadth-first), its expected accepted drafts,
    its predicted cost per step and tokens per unit of cost."""

    parents: tuple[int, ...]
    expected_accepted: float
    cost: float
    tokens_per_cost: float

    @property
    def nodes(self) -> int:
        return len(self.parents)

    @property
    def depth(self) -> int:
        return max(template_depths(self.parents)) if self.parents else 0

    @property
    def spec(self) -> str:
        """The ``tree=`` spec of this template (``"parents:..."``)."""
        return "parents:" + ",".join(str(parent) for parent in self.parents)


def template_depths(parents: Sequence[int]) -> list[int]:
    """Depths of nodes 0..N (root 0) of a template."""
    depth = [0]
    for parent in parents:
        depth.append(depth[parent] + 1)
    return depth


def expected_accepted(parents: Sequence[int], acceptance: np.ndarray) -> float:
    """E of a template under the table α(d, r) [D, R] (module docstring); α = 0 beyond it."""
    table = np.asarray(acceptance, dtype=np.float64)
    depth = template_depths(parents)
    reach = [1.0]
    rank_seen: dict[int, int] = {}
    total = 0.0
    for node, parent in enumerate(parents, start=1):
        rank = rank_seen.get(parent, 0)
        rank_seen[parent] = rank + 1
        level = depth[parent]
        chance = table[level, rank] if level < table.shape[0] and rank < table.shape[1] else 0.0
        reach.append(reach[parent] * chance)
        total += reach[node]
    return total


def best_templates(acceptance: np.ndarray, max_nodes: int, max_depth: int) -> list[list[tuple]]:
    """best[m] for m = 0..max_nodes: (E, parents) of the best template with at most m nodes
    and depth at most ``max_depth`` (module docstring's programme)."""
    table = np.clip(np.asarray(acceptance, dtype=np.float64), 0.0, 1.0)
    ranks = table.shape[1] if table.ndim == 2 else 0
    levels = min(max_depth, table.shape[0])
    # value[d][m] = T(d, m); split[d][r][m] = nodes j given to rank r (0: none)
    value = np.zeros((levels + 1, max_nodes + 1))
    split = np.zeros((levels, ranks + 1, max_nodes + 1), dtype=np.int64)
    for level in range(levels - 1, -1, -1):
        rest = np.zeros(max_nodes + 1)  # H(d, r + 1, ·) while r goes down
        for rank in range(ranks - 1, -1, -1):
            here = np.zeros(max_nodes + 1)
            choice = np.zeros(max_nodes + 1, dtype=np.int64)
            chance = table[level, rank]
            for nodes in range(1, max_nodes + 1):
                sizes = np.arange(1, nodes + 1)  # j
                gains = chance * (1.0 + value[level + 1, sizes - 1]) + rest[nodes - sizes]
                best = int(np.argmax(gains))
                if gains[best] > here[nodes]:
                    here[nodes], choice[nodes] = gains[best], sizes[best]
            split[level, rank] = choice
            rest = here
        value[level] = rest
    results = []
    for nodes in range(max_nodes + 1):
        results.append((float(value[0, nodes]), _read_back(split, nodes, levels, ranks)))
    return results


def _read_back(split: np.ndarray, nodes: int, levels: int, ranks: int) -> tuple[int, ...]:
    """The template of T(0, nodes) from the arg-maxima, breadth-first."""
    # queue of (node id, depth, nodes below it); children appended in rank order
    parents: list[int] = []
    queue = [(0, 0, nodes)]
    while queue:
        following = []
        for node, level, budget in queue:
            if level >= levels:
                continue
            left = budget
            for rank in range(ranks):
                size = int(split[level, rank, left]) if left > 0 else 0
                if size == 0:
                    break
                parents.append(node)
                following.append((len(parents), level + 1, size - 1))
                left -= size
        queue = following
    return tuple(parents)


def frontier_sizes(parents: Sequence[int]) -> list[int]:
    """Nodes with children per depth 0..D−1 (the draft forwards' frontiers)."""
    depth = template_depths(parents)
    with_children = sorted(set(parents))
    sizes = [0] * (max(depth) if parents else 0)
    for node in with_children:
        sizes[depth[node]] += 1
    return sizes


def choose_template(
    acceptance: np.ndarray,
    max_nodes: int,
    draft_cost: Callable[[int], float],
    verify_cost: Callable[[int], float],
    rest_cost: float = 0.0,
) -> Choice:
    """The template with at most ``max_nodes`` nodes maximising (1 + E) / cost (module
    docstring); ``draft_cost(F)`` is a draft forward over a frontier of F nodes (F = 1 for
    the root's level), ``verify_cost(n)`` the verifier's forward of n tokens."""
    if max_nodes < 1:
        raise ValueError(f"max_nodes: must be >= 1, got {max_nodes}")
    table = np.asarray(acceptance, dtype=np.float64)
    if table.ndim != 2 or table.shape[0] < 1 or table.shape[1] < 1:
        raise ValueError(f"acceptance: expected a table [depth, rank], got shape {table.shape}")
    best: Choice | None = None
    for cap in range(1, table.shape[0] + 1):
        for expected, parents in best_templates(table, max_nodes, cap)[1:]:
            if not parents:
                continue
            cost = sum(draft_cost(size) for size in frontier_sizes(parents))
            cost += verify_cost(len(parents) + 1) + rest_cost
            rate = (1.0 + expected) / cost
            if best is None or rate > best.tokens_per_cost + 1e-12:
                best = Choice(tuple(parents), expected, cost, rate)
    if best is None:  # nothing is ever accepted: one child of the root
        cost = draft_cost(1) + verify_cost(2) + rest_cost
        best = Choice((0,), 0.0, cost, 1.0 / cost)
    return best
