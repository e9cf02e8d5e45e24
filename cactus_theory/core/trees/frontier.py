"""The constrained frontier of multi-draft verification: the most any scheme accepts at a node
when what it emits stays within δ of q,

    α*_{K,δ} = max P(accept some child)  subject to  D(e ‖ q) <= δ,  e the emitted law.

For a fixed emitted law e the best acceptance is the lossless optimum against e,
α*(e) = 1 − max_B [P(X ⊆ B) − e(B)], and α*(e) = max_{s ∈ core} Σ_y min(s(y), e(y)), where
the core is the set of laws of one token chosen among the drafted ones (s(T) <= P(X meets
T) for every T: the base polytope of the coverage function h(T) = P(X ∩ T ≠ ∅)). So

    α*_{K,δ} = max_{s ∈ core} A(s),   A(s) = max_{D(e‖q) <= δ} Σ min(s, e),

and A is the single-draft frontier with s as the draft (``rules.frontier``:
e = clip(s, c_lo q, c_hi q)). What is exact here:

- deterministic children S: the core is {e_S-supported laws}, and the two-level tilt of q
  (e(S) = s, kl_bin(s ‖ q(S)) = δ, ``rules.cactus.set_tilt``) is optimal (Jensen): α = the
  exact root s (KL) or min(1, q(S) + δ) (TV);
- TV, any scheme: α*_{K,δ} = min(1, α* + δ) (every e within δ has α*(e) <= α* + δ; moving δ
  of the optimal coupling's rejected mass onto drafted tokens attains it);
- KL, sampled children: A(s_q) with s_q the lexicographically optimal base of the core
  for the weights q (Fujishige): it gives α*(q) exactly at δ = 0, it is attained (its e is
  within δ and α*(e) >= Σ min(s_q, e)), so it is a lower bound that is exact at δ = 0; that
  it is the optimum for every δ is held against cvxpy in proofs_check (claim
  ``tree-frontier-exact``), not proven. For i.i.d. children h(T) = 1 − (1 − p(T))^K
  depends on p(T) only, its tight sets are prefixes of the tokens sorted by q/p (the
  exchange argument of ``optimum``), and s_q is q scaled per class by the slopes of the
  lower convex hull of the points (q(prefix), h(prefix)): O(V log V) per row
  (``lexicographic_base``). Other schemes use the same decomposition over all subsets of
  the draftable tokens (m <= 16).
"""

from __future__ import annotations

import numpy as np

from cactus_theory.core import gamma, validate
from cactus_theory.core.rules.frontier import frontier_target
from cactus_theory.core.trees.base import DETERMINISTIC, WITH_REPLACEMENT, Node
from cactus_theory.core.trees.law import tuple_law
from cactus_theory.core.trees.optimum import optimal_acceptance, subset_tables

Array = np.ndarray

DIVERGENCES = ("kl", "tv")
#: The most draftable tokens the general decomposition enumerates (2^16 subsets).
MAX_SUBSET_TOKENS = 16


def lower_hull(x: Array, y: Array) -> list[int]:
    """The indices of the lower convex hull of the points (x_j, y_j), x non-decreasing
    (Andrew's monotone chain; a point on a chord is dropped, so classes are maximal)."""
    hull = [0]
    for j in range(1, x.size):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (y[b] - y[a]) * (x[j] - x[a]) >= (y[j] - y[a]) * (x[b] - x[a]):
                hull.pop()  # b is on or above the chord a -> j
            else:
                break
        hull.append(j)
    return hull


def lexicographic_base(target: Array, draft: Array, width: int) -> Array:
    """[V]: the lexicographically optimal base s_q of the core of ``width`` i.i.d. draws
    from ``draft`` for the weights ``target`` (module docstring): on each class (a segment
    of the hull) s_q = Δh · q / q(class), the class's share of the coverage in proportion
    to q; a class of tokens with q = 0 shares it in proportion to p."""
    target = np.asarray(target, dtype=np.float64)
    draft = np.asarray(draft, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(draft > 0, target / np.where(draft > 0, draft, 1.0), np.inf)
    order = np.argsort(-ratio, kind="stable")
    covered = np.concatenate([[0.0], np.cumsum(target[order])])
    drafted = np.minimum(np.concatenate([[0.0], np.cumsum(draft[order])]), 1.0)
    coverage = 1.0 - (1.0 - drafted) ** width  # h(prefix) = 1 − (1 − p(prefix))^K
    base = np.zeros_like(target)
    hull = lower_hull(covered, coverage)
    for a, b in zip(hull[:-1], hull[1:], strict=True):
        members = order[a:b]
        share = coverage[b] - coverage[a]
        weights = target[members] if target[members].sum() > 0 else draft[members]
        if weights.sum() > 0:
            base[members] = share * weights / weights.sum()
    return base


def _general_base(target: Array, tuples: Array, chance: Array) -> Array:
    """The lexicographically optimal base for any tuple law, by Fujishige's decomposition
    over every subset of the draftable tokens: repeatedly the largest T minimising
    h'(T)/q(T) for the contracted coverage h'(T) = h(T ∪ done) − h(done)."""
    tokens, within, mass = subset_tables(
        target, tuples, chance, MAX_SUBSET_TOKENS, "use top-k rows, or children with replacement"
    )  # P(X ⊆ B), q(B)
    bits = tokens.size
    full = (1 << bits) - 1
    coverage = 1.0 - within[full ^ np.arange(1 << bits)]  # h(T) = 1 − P(X ⊆ T^c)
    base = np.zeros_like(target)
    done = 0
    masks = np.arange(1 << bits)
    while done != full:
        free = (masks & done) == 0
        candidates = masks[free & (masks != 0)]
        union = candidates | done
        gain = coverage[union] - coverage[done]
        weight = mass[union] - mass[done]
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = np.where(weight > 0, gain / np.where(weight > 0, weight, 1.0), np.inf)
        best = slope.min()
        if not np.isfinite(best):  # only tokens with q = 0 are left
            rest = candidates[np.argmax(candidates)]
            members = tokens[((rest >> np.arange(bits)) & 1) > 0]
            share = np.bincount(tuples.reshape(-1), minlength=target.size)[members]
            base[members] = (1.0 - coverage[done]) * share / share.sum()
            break
        ties = candidates[np.abs(slope - best) <= 1e-15 * max(1.0, abs(best))]
        chosen = np.bitwise_or.reduce(ties)  # the largest minimiser (minimisers are a lattice)
        members = tokens[((chosen >> np.arange(bits)) & 1) > 0]
        share = coverage[done | int(chosen)] - coverage[done]
        base[members] = share * target[members] / target[members].sum()
        done |= int(chosen)
    return base


def core_base(node: Node) -> Array:
    """[V]: the lexicographically optimal base s_q of the node's core (module docstring)."""
    if node.scheme == DETERMINISTIC:
        raise ValueError("node: deterministic children have the closed-form frontier")
    if node.scheme == WITH_REPLACEMENT or node.k == 1:
        return lexicographic_base(node.target, node.draft, node.k)
    tuples, chance = tuple_law(node)
    return _general_base(node.target, tuples, chance)


def frontier_acceptance(node: Node, delta: float, divergence: str = "kl") -> float:
    """α*_{K,δ}: the most any scheme accepts at ``node`` emitting a law within ``delta`` of q
    in KL or TV (module docstring: exact for deterministic children and for TV; for KL
    with sampled children the attained value A(s_q), checked against cvxpy)."""
    if not isinstance(node, Node):
        raise ValueError(f"node: expected a trees.Node, got {type(node).__name__}")
    budget = validate.nonnegative("delta", delta)
    if divergence not in DIVERGENCES:
        raise ValueError(f"divergence: expected one of {DIVERGENCES}, got {divergence!r}")
    if node.scheme == DETERMINISTIC:
        mass = min(1.0, float(node.target[list(node.children)].sum()))  # rounding above 1
        if divergence == "tv":
            return min(1.0, mass + budget)
        return float(gamma.exact_raised_mass(np.asarray(mass), budget, "kl"))
    if divergence == "tv":
        method = "sort" if node.scheme == WITH_REPLACEMENT else "cut"
        return min(1.0, optimal_acceptance(node, method=method) + budget)
    base = core_base(node)
    tilt = frontier_target(node.target, base, budget)
    return float(np.minimum(base, tilt).sum())


def frontier_rows(target: Array, draft: Array, width: int, delta: object) -> Array:
    """[N]: α*_{K,δ} (KL) for N nodes with ``width`` children drawn i.i.d. from each draft
    row (rows [N, V] validated; ``delta`` one budget or one per row)."""
    target = np.asarray(target, dtype=np.float64)
    draft = np.asarray(draft, dtype=np.float64)
    budget = np.broadcast_to(np.asarray(delta, dtype=np.float64), target.shape[:-1])
    bases = np.stack([lexicographic_base(t, d, width) for t, d in zip(target, draft, strict=True)])
    tilt = frontier_target(target, bases, np.where(np.isfinite(budget), budget, 0.0))
    values = np.minimum(bases, tilt).sum(axis=-1)
    return np.where(np.isfinite(budget), values, 1.0)
