"""The lossless optimum α*: the most any scheme that emits q exactly can accept at a node.

A lossless verifier is a coupling of the drafted tuple X (law P) and the emitted Y ~ q;
it accepts when Y is one of the drafts. Its best acceptance is a max-flow from tuples
(capacities P(x)) to tokens (capacities q(y)) along the edges y ∈ x, so by max-flow
min-cut (SpecTr's OT with membership cost; Khisti et al.'s canonical decomposition;
Hu et al.'s subset formulation):

    α* = 1 − max_B [ P(all drafts ∈ B) − q(B) ]       (B = ∅ gives 0).

Three computations, which must agree (proofs_check holds them to 1e-9):

- ``"cut"``: every B over the tokens the draft can propose (2^m subsets, m <= 22), with
  P(X ⊆ B) from the drafted tuples by a subset-sum (zeta) transform: any scheme;
- ``"sort"``: for K children drawn i.i.d. from p, P(X ⊆ B) = p(B)^K, and an optimal B is a
  prefix of the tokens sorted by q/p (exchange: a token y in an optimal B has q_y/p_y <=
  K p(B)^{K−1} <= q_z/p_z for every z outside), so α* = 1 − max_j (F_j^K − Q_j)_+ over
  the prefixes (F, Q cumulative p and q): O(V log V), usable at V = 50k, batched over
  rows (``sorted_optimum``);
- ``"lp"``: the coupling LP in cvxpy (``proofs_check.trees_lp``; V <= 6, K <= 3), which
  this module imports only when asked (the core never imports cvxpy).

Deterministic children S give α* = q(S) (the walk attains it); K = 1 gives 1 − TV(p, q).
``optimal_flow`` solves the max-flow itself (scipy's HiGHS LP on the sets of drafted
tokens), which is what the ``optimal`` verifier follows.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

from cactus_theory.core.trees.base import DETERMINISTIC, WITH_REPLACEMENT, Node
from cactus_theory.core.trees.law import tuple_law

Array = np.ndarray

METHODS = ("cut", "sort", "lp")
#: The most tokens the cut enumeration takes (2^22 subsets).
MAX_CUT_TOKENS = 22


def sorted_optimum(target: Array, draft: Array, width: int) -> Array:
    """[...]: α* for ``width`` children drawn i.i.d. from ``draft``, by the sorted-prefix
    scan (module docstring), for rows [..., V]."""
    target = np.asarray(target, dtype=np.float64)
    draft = np.asarray(draft, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(draft > 0, target / np.where(draft > 0, draft, 1.0), np.inf)
    order = np.argsort(ratio, axis=-1, kind="stable")
    covered = np.cumsum(np.take_along_axis(draft, order, -1), axis=-1)  # F_j
    spent = np.cumsum(np.take_along_axis(target, order, -1), axis=-1)  # Q_j
    gap = np.minimum(covered, 1.0) ** width - spent
    return 1.0 - np.maximum(gap.max(axis=-1), 0.0)


def _token_sets(tuples: Array, tokens: Array) -> Array:
    """[T] int64: each tuple's set of tokens as a bitmask over ``tokens`` (sorted ids)."""
    bits = np.left_shift(1, np.searchsorted(tokens, tuples)).astype(np.int64)
    return np.bitwise_or.reduce(bits, axis=-1)


def _subset_sums(values: Array, bits: int) -> Array:
    """The zeta transform: out[B] = Σ_{A ⊆ B} values[A] over ``bits``-bit masks."""
    out = values.copy()
    for bit in range(bits):
        step = 1 << bit
        view = out.reshape(-1, 2 * step)
        view[:, step:] += view[:, :step]
    return out


def subset_tables(
    target: Array, tuples: Array, chance: Array, limit: int, advice: str
) -> tuple[Array, Array, Array]:
    """(tokens [m], P(X ⊆ B) [2^m], q(B) [2^m]) over every subset B of the m draftable
    tokens (bitmasks over ``tokens``), for tuples [T, K] with probabilities [T]; a
    ValueError ending with ``advice`` when m > ``limit``."""
    tokens = np.unique(tuples)
    bits = tokens.size
    if bits > limit:
        raise ValueError(
            f"node: {bits} draftable tokens; this enumerates at most {limit} ({advice})"
        )
    inside = np.zeros(1 << bits)
    np.add.at(inside, _token_sets(tuples, tokens), chance)
    singles = np.zeros(1 << bits)
    singles[1 << np.arange(bits)] = np.asarray(target)[tokens]
    return tokens, _subset_sums(inside, bits), _subset_sums(singles, bits)


def cut_optimum(target: Array, tuples: Array, chance: Array) -> float:
    """α* = 1 − max_B [P(X ⊆ B) − q(B)] by enumerating every B over the drafted tokens
    (tuples [T, K] with probabilities [T]; at most ``MAX_CUT_TOKENS`` distinct tokens)."""
    _, covered, spent = subset_tables(
        target, tuples, chance, MAX_CUT_TOKENS, "use method='sort' for i.i.d. children"
    )
    return float(1.0 - max(0.0, float((covered - spent).max())))


def optimal_acceptance(node: Node, method: str = "cut") -> float:
    """α* at ``node`` by ``method`` ("cut", "sort" or "lp"; module docstring). Deterministic
    children give q(S) by every method."""
    if not isinstance(node, Node):
        raise ValueError(f"node: expected a trees.Node, got {type(node).__name__}")
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    if method == "lp":
        # The LP needs cvxpy, which lives with the claims: imported by name, only here.
        solver = importlib.import_module("proofs_check.trees_lp")
        return float(solver.optimal_acceptance_lp(node))
    if node.scheme == DETERMINISTIC:
        return float(node.target[list(node.children)].sum())
    if method == "sort":
        if node.scheme != WITH_REPLACEMENT and node.k > 1:
            raise ValueError(
                f"method: 'sort' needs children drawn i.i.d. (with replacement), not "
                f"{node.scheme}; use 'cut'"
            )
        return float(sorted_optimum(node.target, node.draft, node.k))
    tuples, chance = tuple_law(node)
    return cut_optimum(node.target, tuples, chance)


@dataclass(frozen=True)
class Flow:
    """An optimal coupling of a node's drafted sets and q: ``sets`` [S] (bitmasks over
    ``tokens``), ``chance`` [S] (P of each set), ``accepted`` [S, V] (the mass each set
    sends to each of its tokens), ``inflow`` [V] (Σ over sets, <= q) and ``acceptance``."""

    tokens: Array
    sets: Array
    chance: Array
    accepted: Array
    inflow: Array
    acceptance: float


def optimal_flow(target: Array, tuples: Array, chance: Array) -> Flow:
    """The max-flow from drafted sets to tokens (module docstring), by scipy's HiGHS LP on
    the sets of drafted tokens, made exactly feasible afterwards (each set sends at most
    its probability, each token receives at most q), so a verifier following it is
    lossless whatever the solver's tolerance; its acceptance is α* to the LP's accuracy."""
    from scipy import optimize, sparse

    target = np.asarray(target, dtype=np.float64)
    tokens = np.unique(tuples)
    masks = _token_sets(tuples, tokens)
    sets, where = np.unique(masks, return_inverse=True)
    set_chance = np.bincount(where, weights=chance, minlength=sets.size)
    member = (sets[:, None] >> np.arange(tokens.size)[None, :]) & 1  # [S, m]
    edge_set, edge_token = np.nonzero(member)
    edges = edge_set.size
    rows = np.concatenate([edge_set, sets.size + edge_token])
    matrix = sparse.csr_matrix(
        (np.ones(2 * edges), (rows, np.concatenate([np.arange(edges)] * 2))),
        shape=(sets.size + tokens.size, edges),
    )
    bounds = np.concatenate([set_chance, target[tokens]])
    result = optimize.linprog(
        -np.ones(edges),
        A_ub=matrix,
        b_ub=bounds,
        bounds=(0, None),
        method="highs",
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    if result.status != 0:
        raise RuntimeError(f"the optimal flow's LP failed: {result.message}")
    value = np.maximum(result.x, 0.0)
    sent = np.bincount(edge_set, weights=value, minlength=sets.size)
    scale = np.where(sent > set_chance, set_chance / np.where(sent > 0, sent, 1.0), 1.0)
    value = value * scale[edge_set]
    received = np.bincount(edge_token, weights=value, minlength=tokens.size)
    room = target[tokens]
    scale = np.where(received > room, room / np.where(received > 0, received, 1.0), 1.0)
    value = value * scale[edge_token]
    accepted = np.zeros((sets.size, target.size))
    accepted[edge_set, tokens[edge_token]] = value
    inflow = accepted.sum(axis=0)
    return Flow(tokens, sets, set_chance, accepted, inflow, float(inflow.sum()))
