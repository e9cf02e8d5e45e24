"""The numpy reference of one tree verification: walk a drafted tree from the root.

A drafted tree (per batch row) is N + 1 nodes in an order where every parent comes before
its children: node 0 is the root (the last committed token, whose verifier row gives the
law of the first new token), node j > 0 holds the drafted token ``tokens[j]`` and has the
parent ``parents[j]`` (−1 for the root; −1 also marks a padding node, which is ignored).
The children of a node are tried in the order of their node indices (the decoder lays
them out by rank: the draft's top-1 first). ``target_probs[j]`` is the verifier's law q
of the token after node j's path; ``draft_probs[j]`` the draft's law p there, which the
children of j were drafted from (read only by sampled schemes).

The walk: at the current node with children x = (x_1..x_K), the node is verified by the
numpy node sampler (``core.trees.sample.verify_node``: the rule's sequential acceptances,
one uniform ``decide_uniforms[b, d]`` for the node at depth d through ``base.decide``,
the final residual drawn with ``sample_uniforms[b]``). At an accepted child the walk moves
there and goes on; when every child is rejected the emitted token is the residual's draw,
and at a node without children (a leaf, or a node of a truncated row) the bonus token is
drawn from q at that node by inverse CDF with ``sample_uniforms[b]``
(``core.verify.inverse_cdf``). Only the node where the walk stops uses the sample
uniform. A chain of k drafts is the tree where every node has one child, and the walk is
then ``core.verify.verify_block`` with ``accept_uniforms = decide_uniforms``.

Output layout as the chain's: ``token_ids [B, D+1]`` holds the accepted tokens in path
order, then the emitted token, then ``PAD_ID``; ``num_accepted [B]``; ``path [B, D+1]``
the node indices visited from the root (−1 after the last). D is the tree's greatest depth.

This is the oracle of the torch walk (``cactus_theory.sampler.tree_verify``): the same
decisions from the same uniforms.
"""

from __future__ import annotations

import numpy as np

from cactus_theory.core import validate
from cactus_theory.core.trees.base import DETERMINISTIC, SCHEMES, Node, TreeRule
from cactus_theory.core.trees.sample import verify_node
from cactus_theory.core.verify import PAD_ID, inverse_cdf

Array = np.ndarray


def check_parents(parents: object) -> Array:
    """``parents`` [B, N+1] as int64, checked: node 0 is the root (−1), every other node has
    −1 (padding) or a parent that is a real node before it. ValueError naming ``parents``."""
    table = np.asarray(parents)
    if table.ndim != 2 or table.shape[1] < 1 or not np.issubdtype(table.dtype, np.integer):
        raise ValueError(f"parents: expected integer node indices [B, N+1], got {table.shape}")
    table = table.astype(np.int64)
    if np.any(table[:, 0] != -1):
        raise ValueError("parents: node 0 is the root and must have parent −1")
    nodes = np.arange(table.shape[1])
    if np.any((table < -1) | (table >= nodes[None, :]) & (nodes[None, :] > 0)):
        raise ValueError("parents: every parent must come before its child (or be −1)")
    real = real_nodes(table)
    has_parent = table >= 0
    parent_real = np.take_along_axis(real, np.maximum(table, 0), axis=1)
    if np.any(has_parent & ~parent_real):
        raise ValueError("parents: a node hangs below a padding node")
    return table


def real_nodes(parents: Array) -> Array:
    """[B, N+1] bool: the root and every node with a parent (the rest is padding)."""
    real = parents >= 0
    real[:, 0] = True
    return real


def depths(parents: Array) -> Array:
    """[B, N+1] depth of every node (root 0; padding nodes 0), parents before children."""
    depth = np.zeros(parents.shape, dtype=np.int64)
    for node in range(1, parents.shape[1]):
        parent = parents[:, node]
        depth[:, node] = np.where(parent >= 0, depth[np.arange(len(parent)), parent] + 1, 0)
    return depth


def children_of(parents: Array, row: int, node: int) -> Array:
    """The children of ``node`` in row ``row``, in the order the walk tries them."""
    return np.flatnonzero(parents[row] == node)


def verify_tree(
    rule: TreeRule,
    target_probs: object,
    draft_probs: object,
    parents: object,
    tokens: object,
    scheme: str,
    decide_uniforms: object,
    sample_uniforms: object,
) -> tuple[Array, Array, Array]:
    """Walk each row's tree from the root (module docstring).

    Shapes: target_probs, draft_probs [B, N+1, V]; parents, tokens [B, N+1] (tokens[:, 0]
    is ignored); decide_uniforms [B, D] (D >= the greatest depth; one per depth);
    sample_uniforms [B]. ``scheme`` is how every node's children were drafted
    (``base.SCHEMES``). Returns (token_ids [B, D+1], num_accepted [B], path [B, D+1]).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme: expected one of {', '.join(SCHEMES)}, got {scheme!r}")
    if scheme not in rule.schemes:
        raise ValueError(f"scheme: {rule.label} is not defined for {scheme} children")
    target = validate.distribution("target_probs", target_probs)
    draft = validate.distribution("draft_probs", draft_probs)
    table = check_parents(parents)
    batch, nodes = table.shape
    if target.shape[:2] != (batch, nodes) or draft.shape != target.shape:
        raise ValueError(
            f"target_probs: expected [B, N+1, V] = {(batch, nodes)} x V and draft_probs alike, "
            f"got {target.shape} and {draft.shape}"
        )
    vocab = target.shape[-1]
    ids = np.asarray(tokens)
    if ids.shape != (batch, nodes) or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"tokens: expected integer ids [B, N+1], got {ids.shape}")
    real = real_nodes(table)
    if np.any(real[:, 1:] & ((ids[:, 1:] < 0) | (ids[:, 1:] >= vocab))):
        raise ValueError(f"tokens: drafted ids must lie in [0, {vocab})")
    levels = int(depths(table).max())
    decide_u = validate.unit_interval_array("decide_uniforms", decide_uniforms)
    sample_u = validate.unit_interval_array("sample_uniforms", sample_uniforms)
    if decide_u.ndim != 2 or decide_u.shape[0] != batch or decide_u.shape[1] < levels:
        raise ValueError(
            f"decide_uniforms: expected [B, D] with D >= {levels}, got {decide_u.shape}"
        )
    if sample_u.shape != (batch,):
        raise ValueError(f"sample_uniforms: expected shape {(batch,)}, got {sample_u.shape}")

    token_ids = np.full((batch, levels + 1), PAD_ID, dtype=np.int64)
    path = np.full((batch, levels + 1), -1, dtype=np.int64)
    num_accepted = np.zeros(batch, dtype=np.int64)
    for row in range(batch):
        node, depth = 0, 0
        path[row, 0] = 0
        while True:
            kids = children_of(table, row, node)
            if kids.size == 0:  # a leaf: the bonus token from q at the node
                token = int(inverse_cdf(target[row, node], sample_u[row]))
                break
            drafted = ids[row, kids].astype(np.int64)  # [K]
            if scheme == DETERMINISTIC:
                here = Node(target=target[row, node], draft=draft[row, node], children=drafted)
            else:
                here = Node(target=target[row, node], draft=draft[row, node], k=kids.size,
                            scheme=scheme)  # fmt: skip
            outcome, token = verify_node(
                rule, here, drafted, decide_u[row, depth], sample_u[row]
            )  # the sample uniform is used only where the walk stops
            if int(outcome) == kids.size:  # every child rejected: the residual's draw
                token = int(token)
                break
            node, depth = int(kids[int(outcome)]), depth + 1
            token_ids[row, depth - 1] = ids[row, node]
            path[row, depth] = node
        num_accepted[row] = depth
        token_ids[row, depth] = token
    return token_ids, num_accepted, path


__all__ = ["DETERMINISTIC", "check_parents", "children_of", "depths", "verify_tree"]
