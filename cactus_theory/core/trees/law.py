"""The exact law of the token a node emits, and its acceptance, by enumeration over the
drafted tuples (numpy, float64).

For a node (q, p, K children drafted by a scheme) and a tree rule (``sibling_accepts`` a_i,
``final_residual`` r), with P(x) = Π_i π_i(x_i) the probability of the drafted tuple x:

    law        = Σ_x P(x) e(· | x),   e(· | x) = Σ_i P_i(x) e_{x_i} + Π_j (1 − a_j(x)) r(x)
    acceptance = Σ_x P(x) [1 − Π_j (1 − a_j(x))]

(``base.conditional_law``). The tuples are: the one drafted tuple (deterministic
children); all m^K ordered tuples of the draft's support of size m (with replacement);
the m!/(m − K)! ordered tuples of distinct tokens (without replacement); the 2(m − 1)
pairs (x, a), (a, x) around the hub a (SpecHub). They are evaluated in batches of
``CHUNK_ELEMENTS`` (tuple, child, token) entries, each batch in one call of the rule's
methods. A rule declaring ``support_only`` is evaluated on rows packed to the tokens where
q or p is positive (and the children), which changes nothing for it and makes V small.

``node_law_rows`` computes the same for many deterministic nodes at once (one tuple per
row), which is what real pools with top-K children need. ``closed_form`` uses a rule's
closed forms (``TreeRule.closed_form_law`` / ``closed_form_acceptance``) where it declares
them, for vocabularies where enumeration is impossible; ``cactus_theory.testing`` holds
them to the enumeration.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from cactus_theory.core import divergences
from cactus_theory.core.trees.base import (
    DETERMINISTIC,
    HUB,
    WITH_REPLACEMENT,
    WITHOUT_REPLACEMENT,
    Node,
    TreeRule,
    end_probs,
    hub_token,
    proposals,
)
from cactus_theory.core.trees.registry import as_tree_rule

Array = np.ndarray

#: (tuple, child, token) entries evaluated per call of the rule's methods.
CHUNK_ELEMENTS = 1 << 21
#: The most drafted tuples a node may be enumerated over (larger nodes: closed forms).
MAX_TUPLES = 4_000_000


@dataclass(frozen=True)
class NodeLaw:
    """The exact behaviour of a rule at one node.

    ``law`` [V]: the law of the emitted token; ``accepted`` [V]: its part from accepted
    children (law − accepted is P(every child rejected) times the residual's law);
    ``acceptance``: P(some child accepted) = Σ accepted; ``ends`` [K+1]: P(the node ends
    at child i) for i < K, then P(every child rejected); ``tuples``: how many drafted
    tuples were enumerated.
    """

    law: Array
    accepted: Array
    acceptance: float
    ends: Array
    tuples: int


def check_scheme(rule: TreeRule, scheme: str) -> None:
    """ValueError naming the rule when it is not defined for ``scheme`` (``rule.schemes``)."""
    if scheme not in rule.schemes:
        raise ValueError(
            f"node: tree rule {rule.name!r} is defined for {', '.join(rule.schemes)} "
            f"children, not {scheme}"
        )


def drafted_tuples(node: Node, support: Array | None = None) -> Array:
    """[T, K] int64: every tuple of children the node's scheme can draft (ids in the
    node's vocabulary); ``support`` overrides the draft's support (packed rows)."""
    if node.scheme == DETERMINISTIC:
        return np.asarray([node.children], dtype=np.int64)
    return scheme_tuples(node.draft, node.k, node.scheme, support)


def scheme_tuples(draft: Array, width: int, scheme: str, support: Array | None = None) -> Array:
    """[T, K] int64: every tuple ``scheme`` can draft with ``width`` children from the
    draft row [V] (sampled schemes; ``support`` defaults to the tokens with p > 0)."""
    tokens = np.flatnonzero(draft > 0) if support is None else np.asarray(support)
    size = tokens.size
    if scheme == WITH_REPLACEMENT:
        count = size**width
        _guard(count, scheme, width, size)
        grid = np.stack(np.unravel_index(np.arange(count), (size,) * width), axis=-1)
        return tokens[grid]
    if scheme == WITHOUT_REPLACEMENT:
        _guard(math.perm(size, width), scheme, width, size)
        picks = np.fromiter(
            itertools.chain.from_iterable(itertools.permutations(range(size), width)),
            dtype=np.int64,
        )
        return tokens[picks.reshape(-1, width)]
    if scheme == HUB:
        hub = int(hub_token(draft))
        others = tokens[tokens != hub]
        pairs = [np.stack([others, np.full_like(others, hub)], -1)]
        pairs.append(np.stack([np.full_like(others, hub), others], -1))
        return np.concatenate(pairs).astype(np.int64)
    raise ValueError(f"scheme: expected a sampled scheme, got {scheme!r}")


def tuple_probabilities(draft: Array, tuples: Array, scheme: str) -> Array:
    """[T]: P(x) = Π_i π_i(x_i) for tuples [T, K] drafted by ``scheme`` from ``draft`` [V]."""
    shape = (tuples.shape[0], draft.shape[-1])
    rows = proposals(np.broadcast_to(draft, shape), tuples, scheme)
    return np.prod(np.take_along_axis(rows, tuples[..., None], -1)[..., 0], axis=-1)


def tuple_law(node: Node) -> tuple[Array, Array]:
    """(tuples [T, K], probabilities [T]): every tuple the node can draft (on its full
    vocabulary) with P(x) = Π_i π_i(x_i); the probabilities sum to 1."""
    tuples = drafted_tuples(node)
    return tuples, tuple_probabilities(node.draft, tuples, node.scheme)


def _guard(count: int, scheme: str, width: int, size: int) -> None:
    if count > MAX_TUPLES:
        raise ValueError(
            f"node: {count} drafted tuples ({scheme}, k={width}, draft support {size}) are "
            f"too many to enumerate (at most {MAX_TUPLES}); use a smaller support (top-k) "
            "or trees.closed_form"
        )


def _packed(rule: TreeRule, node: Node) -> tuple[Node, Array | None]:
    """The node restricted to the tokens where q or p is positive (and its children) when
    the rule declares ``support_only``, with the kept ids; else the node itself."""
    keep = (node.target > 0) | (node.draft > 0)
    if node.children is not None:
        keep[list(node.children)] = True
    if not getattr(rule, "support_only", False) or keep.all():
        return node, None
    ids = np.flatnonzero(keep)
    where = {int(token): index for index, token in enumerate(ids)}
    packed = object.__new__(Node)
    for field, value in (
        ("target", node.target[ids]),
        ("draft", node.draft[ids]),
        ("children", None if node.children is None else tuple(where[c] for c in node.children)),
        ("k", node.k),
        ("scheme", node.scheme),
    ):
        object.__setattr__(packed, field, value)
    return packed, ids


def enumerate_node(rule: TreeRule | str, node: Node) -> NodeLaw:
    """The exact ``NodeLaw`` of ``rule`` at ``node`` by enumeration (module docstring)."""
    rule = as_tree_rule(rule)
    if not isinstance(node, Node):
        raise ValueError(f"node: expected a trees.Node, got {type(node).__name__}")
    check_scheme(rule, node.scheme)
    packed, ids = _packed(rule, node)
    tuples = drafted_tuples(packed)
    vocab, width = packed.vocab_size, packed.k
    accepted = np.zeros(vocab)
    rejected = np.zeros(vocab)
    ends = np.zeros(width + 1)
    per_chunk = max(1, CHUNK_ELEMENTS // (width * vocab))
    for start in range(0, tuples.shape[0], per_chunk):
        children = tuples[start : start + per_chunk]  # [T, K]
        count = children.shape[0]
        target = np.broadcast_to(packed.target, (count, vocab))
        draft = np.broadcast_to(packed.draft, (count, vocab))
        rows = proposals(draft, children, packed.scheme)  # [T, K, V]
        chance = np.prod(np.take_along_axis(rows, children[..., None], -1)[..., 0], axis=-1)
        accepts = np.asarray(rule.sibling_accepts(target, rows, children), dtype=np.float64)
        residual = np.asarray(rule.final_residual(target, rows, children), dtype=np.float64)
        outcome = end_probs(accepts)  # [T, K+1]
        ends += chance @ outcome
        np.add.at(accepted, children.reshape(-1), (chance[:, None] * outcome[:, :-1]).reshape(-1))
        rejected += (chance * outcome[:, -1]) @ _normalised(np.broadcast_to(residual, target.shape))
    if ids is not None:
        accepted, rejected = (_unpack(a, ids, node.vocab_size) for a in (accepted, rejected))
    return NodeLaw(accepted + rejected, accepted, float(1.0 - ends[-1]), ends, int(tuples.shape[0]))


def _normalised(rows: Array) -> Array:
    """Rows divided by their sums (all-zero rows stay zero: they carry no probability)."""
    total = rows.sum(axis=-1, keepdims=True)
    return np.where(total > 0, rows / np.where(total > 0, total, 1.0), 0.0)


def _unpack(values: Array, ids: Array, vocab: int) -> Array:
    full = np.zeros(values.shape[:-1] + (vocab,))
    full[..., ids] = values
    return full


def node_law(rule: TreeRule | str, node: Node) -> Array:
    """[V]: the exact law of the token ``rule`` emits at ``node``."""
    return enumerate_node(rule, node).law


def node_acceptance(rule: TreeRule | str, node: Node) -> float:
    """P(some child of ``node`` is accepted) under ``rule``, exactly."""
    return enumerate_node(rule, node).acceptance


def node_divergence(rule: TreeRule | str, node: Node, divergence: str = "kl") -> float:
    """D(node law ‖ q): how far what the node emits is from the verifier's row."""
    law = node_law(rule, node)
    return float(divergences.rows(divergence, law / law.sum(), node.target))


def node_law_rows(
    rule: TreeRule | str, target: Array, draft: Array, children: Array
) -> tuple[Array, Array]:
    """(law [N, V], acceptance [N]) for N deterministic nodes at once: rows of q and p
    [N, V] (validated float64), children [N, K] (distinct ids per row). One tuple per
    row, so this is the enumeration itself, batched over rows."""
    rule = as_tree_rule(rule)
    check_scheme(rule, DETERMINISTIC)
    target = np.asarray(target, dtype=np.float64)
    draft = np.asarray(draft, dtype=np.float64)
    children = np.asarray(children, dtype=np.int64)
    count, vocab = target.shape
    law = np.empty((count, vocab))
    acceptance = np.empty(count)
    per_chunk = max(1, CHUNK_ELEMENTS // (children.shape[-1] * vocab))
    for start in range(0, count, per_chunk):
        rows = slice(start, start + per_chunk)
        ids = children[rows]
        hot = proposals(draft[rows], ids, DETERMINISTIC)
        accepts = np.asarray(rule.sibling_accepts(target[rows], hot, ids), dtype=np.float64)
        residual = np.asarray(rule.final_residual(target[rows], hot, ids), dtype=np.float64)
        outcome = end_probs(accepts)
        part = outcome[:, -1:] * _normalised(np.broadcast_to(residual, target[rows].shape))
        np.add.at(part, (np.arange(ids.shape[0])[:, None], ids), outcome[:, :-1])
        law[rows] = part
        acceptance[rows] = 1.0 - outcome[:, -1]
    return law, acceptance


def closed_form(
    rule: TreeRule | str, target: Array, draft: Array, width: int, scheme: str
) -> tuple[Array | None, Array | None]:
    """(law [..., V] or None, acceptance [...] or None): the rule's declared closed forms
    for rows of (q, p) with ``width`` children drafted by ``scheme`` (None: not known in
    closed form; enumerate instead)."""
    rule = as_tree_rule(rule)
    check_scheme(rule, scheme)
    law = rule.closed_form_law(target, draft, width, scheme)
    acceptance = rule.closed_form_acceptance(target, draft, width, scheme)
    return (
        None if law is None else np.asarray(law, dtype=np.float64),
        None if acceptance is None else np.asarray(acceptance, dtype=np.float64),
    )
