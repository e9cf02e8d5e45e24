"""The numpy node sampler, from explicit uniforms: the reference the torch tree sampler and
the decoder are held to.

One node, given its drafted children x [..., K]:

1. the rule's sequential acceptances a_i (``sibling_accepts``) give C_i = 1 − Π_{j<=i}
   (1 − a_j); one uniform u picks the outcome: the first child i with u < C_i, or K
   (every child rejected) when u >= C_K (``base.decide``);
2. the emitted token is that child's id, or, when every child is rejected, a draw from the
   final residual r by inverse CDF with a second uniform (``core.verify.inverse_cdf``:
   the first index whose cumulative sum exceeds u · Σ r, never a token of probability 0).

Sampled children are drafted the same way: child i by inverse CDF from its proposal π_i
(which depends on the earlier children only) with a uniform of its own
(``draft_children``). ``sample_node`` draws every uniform from one seeded generator, so
the same seed gives the same samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cactus_theory.core import validate
from cactus_theory.core.trees.base import DETERMINISTIC, Node, TreeRule, decide, proposals
from cactus_theory.core.trees.law import check_scheme
from cactus_theory.core.trees.registry import as_tree_rule
from cactus_theory.core.verify import inverse_cdf

Array = np.ndarray


@dataclass(frozen=True)
class NodeSample:
    """Samples of one node: ``children`` [n, K] (the drafted ids), ``outcome`` [n] (the
    accepted child's position, or K when every child was rejected) and ``token`` [n]
    (the emitted id)."""

    children: Array
    outcome: Array
    token: Array


def draft_children(node: Node, uniforms: object) -> Array:
    """[..., K]: children drafted from the node's proposals by inverse CDF with
    ``uniforms`` [..., K] (one per child); the given children for a deterministic node."""
    draws = validate.unit_interval_array("uniforms", uniforms)
    if draws.ndim == 0 or draws.shape[-1] != node.k:
        raise ValueError(f"uniforms: expected shape [..., {node.k}], got {draws.shape}")
    if node.scheme == DETERMINISTIC:
        return np.broadcast_to(np.asarray(node.children), draws.shape).copy()
    children = np.zeros(draws.shape, dtype=np.int64)
    draft = np.broadcast_to(node.draft, draws.shape[:-1] + (node.vocab_size,))
    for index in range(node.k):
        rows = proposals(draft, children, node.scheme)[..., index, :]  # [..., V] π_i
        children[..., index] = inverse_cdf(rows, draws[..., index])
    return children


def verify_node(
    rule: TreeRule | str,
    node: Node,
    children: object,
    accept_uniforms: object,
    sample_uniforms: object,
) -> tuple[Array, Array]:
    """(outcome [...], token [...]) for drafted ``children`` [..., K] of ``node``, with one
    accept uniform and one sample uniform per node (module docstring)."""
    rule = as_tree_rule(rule)
    check_scheme(rule, node.scheme)
    ids = np.asarray(children)
    if ids.ndim == 0 or ids.shape[-1] != node.k or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"children: expected integer ids of shape [..., {node.k}]")
    if np.any((ids < 0) | (ids >= node.vocab_size)):
        raise ValueError(f"children: ids must lie in [0, {node.vocab_size})")
    accept_u = validate.unit_interval_array("accept_uniforms", accept_uniforms)
    sample_u = validate.unit_interval_array("sample_uniforms", sample_uniforms)
    if accept_u.shape != ids.shape[:-1] or sample_u.shape != ids.shape[:-1]:
        raise ValueError(
            f"accept_uniforms: expected shape {ids.shape[:-1]} (and sample_uniforms too)"
        )
    shape = ids.shape[:-1] + (node.vocab_size,)
    target = np.broadcast_to(node.target, shape)
    rows = proposals(np.broadcast_to(node.draft, shape), ids, node.scheme)
    accepts = np.asarray(rule.sibling_accepts(target, rows, ids), dtype=np.float64)
    outcome = decide(accepts, accept_u)  # [...] in 0..K
    residual = np.broadcast_to(np.asarray(rule.final_residual(target, rows, ids)), shape)
    drawn = inverse_cdf(residual, sample_u)
    picked = np.take_along_axis(ids, np.minimum(outcome, node.k - 1)[..., None], -1)[..., 0]
    return outcome, np.where(outcome < node.k, picked, drawn)


def sample_node(rule: TreeRule | str, node: Node, size: int, seed: object = 0) -> NodeSample:
    """``size`` independent samples of ``node`` under ``rule``: children drafted, then
    verified, every uniform from ``np.random.default_rng(seed)``."""
    count = validate.positive_int("size", size)
    generator = np.random.default_rng(seed)
    children = draft_children(node, generator.random((count, node.k)))
    outcome, token = verify_node(
        rule, node, children, generator.random(count), generator.random(count)
    )
    return NodeSample(children, outcome, token)
