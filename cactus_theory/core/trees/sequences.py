"""A whole drafted tree, exactly: the expected accepted length and the sequence KL of one
verification step, for a tree of depth D with widths (w_1, ..., w_D) per depth.

The walk starts at the root (the verifier's row after the context) and at every node
applies the tree rule to that node's w_{d+1} children: it either accepts a child (and
continues at it) or rejects them all and emits the residual's token (and stops); after
an accepted child at depth D it emits the bonus token from the verifier's row there (q
itself: no divergence). For a node ν with rows (q_ν, p_ν) and the rule's exact node law
(``law.enumerate_node``: ``accepted`` [V], the mass at which each token is accepted):

    E[accepted](ν) = Σ_y accepted_ν(y) (1 + E[accepted](ν·y)),
    KL(ν)          = KL(e_ν ‖ q_ν) + Σ_y accepted_ν(y) KL(ν·y),

so E[accepted] = Σ_ν P(reach ν) over the non-root nodes, and the step's KL is
Σ_ν P(reach ν) KL(e_ν ‖ q_ν) over the nodes with children: a path's KL is the sum of its
nodes' expected KLs (the chain rule over the emitted tokens and the step's phase, so it
bounds the text's KL from above, as in the chain decoder's meter). A step emits
E[accepted] + 1 tokens, so over many steps the KL per token is KL / (E[accepted] + 1).

The rows come from a ``source``: ``source(prefix) -> (target, draft)``, the verifier's and
the draft's next-token laws after the context plus ``prefix`` (the tokens from the root).
Deterministic children are the draft's top-w (``top_children``: the first indices on
ties); sampled children enumerate their tuples, so a node's children are every token the
rule can accept there. Each node of the tree is evaluated once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cactus_theory.core import divergences, validate
from cactus_theory.core.trees.base import DETERMINISTIC, SAMPLED, Node, TreeRule
from cactus_theory.core.trees.law import enumerate_node
from cactus_theory.core.trees.registry import as_tree_rule

Array = np.ndarray
#: ``source(prefix) -> (target [V], draft [V])``.
Source = Callable[[tuple[int, ...]], tuple[Array, Array]]


def parse_widths(widths: object) -> tuple[int, ...]:
    """Widths per depth from ``"4,2,1"`` or a sequence of positive integers."""
    if isinstance(widths, str):
        items = [item.strip() for item in widths.split(",") if item.strip()]
        try:
            values = [int(item) for item in items]
        except ValueError:
            raise ValueError(f"widths: expected integers like '4,2,1', got {widths!r}") from None
    elif isinstance(widths, Sequence):
        values = list(widths)
    else:
        raise ValueError(f"widths: expected '4,2,1' or a sequence, got {widths!r}")
    if not values:
        raise ValueError("widths: a tree needs at least one depth")
    return tuple(validate.positive_int("widths", value) for value in values)


def top_children(draft: Array, width: int) -> list[int]:
    """The draft's top-``width`` tokens, most likely first (first indices on ties)."""
    order = np.argsort(-np.asarray(draft), kind="stable")
    return [int(token) for token in order[: min(width, order.size)]]


@dataclass(frozen=True)
class TreeStats:
    """One verification step of a whole tree.

    ``accepted_length``: E[accepted drafts]; ``tokens_per_step`` = accepted_length + 1;
    ``kl_per_step``: Σ_ν P(reach ν) KL(e_ν ‖ q_ν); ``kl_per_token`` = kl_per_step /
    tokens_per_step; ``reach`` [D]: P(the walk accepts a node at depth d), d = 1..D;
    ``nodes``: how many nodes were evaluated.
    """

    accepted_length: float
    tokens_per_step: float
    kl_per_step: float
    kl_per_token: float
    reach: tuple[float, ...]
    nodes: int


def tree_statistics(
    rule: TreeRule | str,
    source: Source,
    widths: object,
    scheme: str = DETERMINISTIC,
) -> TreeStats:
    """The exact ``TreeStats`` of ``rule`` on the tree of ``widths`` drafted by ``scheme``
    over ``source`` (module docstring)."""
    rule = as_tree_rule(rule)
    shape = parse_widths(widths)
    if scheme != DETERMINISTIC and scheme not in SAMPLED:
        raise ValueError(f"scheme: expected deterministic or one of {SAMPLED}, got {scheme!r}")
    reach = np.zeros(len(shape))
    evaluated = 0

    def visit(prefix: tuple[int, ...], chance: float) -> tuple[float, float]:
        """(E[accepted], KL) below the node at ``prefix``, reached with ``chance``."""
        nonlocal evaluated
        depth = len(prefix)
        if depth == len(shape):
            return 0.0, 0.0  # a leaf: the bonus token comes from q
        target, draft = source(prefix)
        width = shape[depth]
        if scheme == DETERMINISTIC:
            node = Node(target=target, draft=draft, children=top_children(draft, width))
        else:
            node = Node(target=target, draft=draft, k=width, scheme=scheme)
        exact = enumerate_node(rule, node)
        evaluated += 1
        emitted = exact.law / exact.law.sum()
        kl = float(divergences.rows("kl", emitted, node.target))
        length = 0.0
        for token in np.flatnonzero(exact.accepted > 0):
            mass = float(exact.accepted[token])
            reach[depth] += chance * mass
            below, below_kl = visit((*prefix, int(token)), chance * mass)
            length += mass * (1.0 + below)
            kl += mass * below_kl
        return length, kl

    length, kl = visit((), 1.0)
    tokens = length + 1.0
    return TreeStats(length, tokens, kl, kl / tokens, tuple(float(r) for r in reach), evaluated)


def predicted_length(acceptances: Sequence[float]) -> float:
    """E[accepted] of a tree whose depth-d nodes each accept with probability α_d
    independently of the path: Σ_d Π_{j <= d} α_j (the pool prediction for depths the
    pool does not observe)."""
    total, product = 0.0, 1.0
    for value in acceptances:
        product *= float(value)
        total += product
    return total
