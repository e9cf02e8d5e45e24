"""SpecTr's K-SEQ (Sun et al., "SpecTr: Fast Speculative Decoding via Optimal Transport",
NeurIPS 2023, Algorithm "K-SEQ"), for K children drawn i.i.d. from the draft p.

With a division factor ρ >= 1 and β(ρ) = Σ_x min(q(x)/ρ, p(x)), every child is tried in
turn with the same acceptance

    a_i = min(1, q(x_i) / (ρ p(x_i)))

and when all K fail the node emits

    r ∝ q − min(q/ρ, p) · (1 − (1 − β)^K) / β.

Each step accepts with probability β whatever came before, so the accepted mass at x is
min(q(x)/ρ, p(x)) (1 − (1 − β)^K)/β and the node emits q exactly whenever r >= 0, i.e.
(1 − (1 − β)^K)/β <= ρ. The acceptance 1 − (1 − β(ρ))^K falls with ρ, and
(1 − (1 − β)^K)/(ρβ) falls with ρ (ρβ(ρ) = Σ min(q, ρp) rises), so the best valid ρ is the
root ρ* in [1, K] of 1 − (1 − β(ρ))^K = ρ β(ρ) (``division_factor``: bisection, finishing
on the valid side). SpecTr proves the acceptance at ρ* is at least (1 − 1/e) times the
optimum α* (checked in proofs_check). K = 1 gives ρ* = 1: speculative sampling.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from cactus_theory.core.arrays import namespace
from cactus_theory.core.rules.base import gsps_accept
from cactus_theory.core.trees.base import WITH_REPLACEMENT, TreeRule

Array = np.ndarray

#: Bisection steps for ρ* on [1, K] (the bracket shrinks below float64 spacing).
BISECTION_STEPS = 64


def overlap(target_probs: Array, draft_probs: Array, rho: Array) -> Array:
    """[...]: β(ρ) = Σ min(q/ρ, p) for ``rho`` [..., 1]."""
    xp = namespace(target_probs, draft_probs)
    return xp.sum(xp.minimum(target_probs / rho, draft_probs), axis=-1)


def division_factor(target_probs: Array, draft_probs: Array, width: int) -> Array:
    """[..., 1]: ρ*, the smallest ρ in [1, K] with 1 − (1 − β(ρ))^K <= ρ β(ρ) (module
    docstring), by bisection; the upper end of the bracket, so the residual is a law."""
    xp = namespace(target_probs, draft_probs)
    low = xp.ones_like(target_probs[..., :1])
    high = width * xp.ones_like(low)
    for _ in range(BISECTION_STEPS):
        middle = 0.5 * (low + high)
        beta = overlap(target_probs, draft_probs, middle)[..., None]
        valid = 1.0 - (1.0 - beta) ** width <= middle * beta
        high = xp.where(valid, middle, high)
        low = xp.where(valid, low, middle)
    return high


class KSeq(TreeRule):
    """K-SEQ at its best division factor ρ* (module docstring): lossless, with
    acceptance 1 − (1 − β(ρ*))^K."""

    name: ClassVar[str] = "k-seq"
    lossless: ClassVar[bool] = True
    lossless_at: ClassVar[Mapping[str, Any]] = {}
    schemes: ClassVar[tuple[str, ...]] = (WITH_REPLACEMENT,)
    array_api: ClassVar[bool] = True
    support_only: ClassVar[bool] = True

    def sibling_accepts(self, target_probs, proposals, children):
        draft = proposals[..., 0, :]  # [..., V] p
        rho = division_factor(target_probs, draft, children.shape[-1])
        xp = namespace(target_probs)
        return xp.take_along_axis(gsps_accept(target_probs / rho, draft), children, axis=-1)

    def final_residual(self, target_probs, proposals, children):
        xp = namespace(target_probs)
        draft, width = proposals[..., 0, :], children.shape[-1]
        rho = division_factor(target_probs, draft, width)
        beta = overlap(target_probs, draft, rho)[..., None]
        positive = beta > 0
        safe = xp.where(positive, beta, xp.ones_like(beta))
        gain = xp.where(positive, (1.0 - (1.0 - beta) ** width) / safe, xp.zeros_like(beta))
        excess = target_probs - xp.minimum(target_probs / rho, draft) * gain
        excess = xp.maximum(excess, xp.zeros_like(excess))
        mass = xp.sum(excess, axis=-1, keepdims=True)
        has_mass = mass > 0
        safe_mass = xp.where(has_mass, mass, xp.ones_like(mass))
        return xp.where(has_mass, excess / safe_mass, target_probs)

    def closed_form_law(self, target_probs, draft_probs, width, scheme):
        return target_probs

    def closed_form_acceptance(self, target_probs, draft_probs, width, scheme):
        rho = division_factor(target_probs, draft_probs, width)
        return 1.0 - (1.0 - overlap(target_probs, draft_probs, rho)) ** width
