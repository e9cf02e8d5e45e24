"""Medusa's typical acceptance on trees (Cai et al., "Medusa: Simple LLM Inference
Acceleration Framework with Multiple Decoding Heads", ICML 2024; ``evaluate_posterior``
and ``get_typical_one_token`` in FasterDecoding/Medusa, ``medusa/model/utils.py``).

At a node with verifier row q, Medusa's threshold is

    τ = min(ε, α · exp(−H)),   H = −Σ q log(q + 1e−5)   (Medusa smooths the entropy),

with ``posterior_threshold`` ε = 0.09 and ``posterior_alpha`` α = 0.3 (the defaults of
Medusa's generate; vLLM's typical acceptance uses the same pair). A child x passes iff
q(x) > τ. Medusa keeps, among the candidate paths, the one with the longest passing prefix
and breaks ties by likelihood; at one node this is the passing child with the largest
q(x) (the first on ties), accepted with probability 1 (a deterministic rule). When no
child passes, the next token is Medusa's typical sample: q without the tokens below τ,
renormalised (q(x) < τ removed). Deeper, Medusa's choice also looks at the children's
own subtrees; this node-level rule is exact for one level and for paths whose deeper
levels do not decide between siblings.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from cactus_theory.core import validate
from cactus_theory.core.arrays import namespace
from cactus_theory.core.rules.base import one_hot
from cactus_theory.core.trees.base import TreeRule

Array = np.ndarray

#: Medusa adds this inside the log of its entropy.
ENTROPY_SMOOTHING = 1e-5


def typical_threshold(target_probs: Array, epsilon: float, alpha: float) -> Array:
    """[..., 1]: τ = min(ε, α exp(−H)), H = −Σ q log(q + 1e−5) (Medusa's entropy)."""
    xp = namespace(target_probs)
    entropy = -xp.sum(target_probs * xp.log(target_probs + ENTROPY_SMOOTHING), axis=-1)
    bound = alpha * xp.exp(-entropy)[..., None]
    return xp.minimum(bound, epsilon * xp.ones_like(bound))


class MedusaTypical(TreeRule):
    """Accept the most likely child with q(x) > τ; else sample q on {q >= τ}."""

    name: ClassVar[str] = "medusa-typical"
    array_api: ClassVar[bool] = True
    support_only: ClassVar[bool] = True

    def __init__(self, posterior_threshold: float = 0.09, posterior_alpha: float = 0.3) -> None:
        self.posterior_threshold = validate.unit_interval(
            "posterior_threshold", posterior_threshold
        )
        self.posterior_alpha = validate.nonnegative("posterior_alpha", posterior_alpha)

    def params(self) -> dict[str, Any]:
        return {
            "posterior_threshold": self.posterior_threshold,
            "posterior_alpha": self.posterior_alpha,
        }

    def _threshold(self, target_probs: Array) -> Array:
        return typical_threshold(target_probs, self.posterior_threshold, self.posterior_alpha)

    def sibling_accepts(self, target_probs, proposals, children):
        xp = namespace(target_probs)
        masses = xp.take_along_axis(target_probs, children, axis=-1)  # [..., K] q(x_i)
        passing = masses > self._threshold(target_probs)
        score = xp.where(passing, masses, -xp.ones_like(masses))
        best = xp.argmax(score, axis=-1)  # the first largest passing q
        chosen = one_hot(best, children.shape[-1], like=masses)  # [..., K]
        any_pass = xp.any(passing, axis=-1, keepdims=True)
        return xp.where(any_pass, chosen, xp.zeros_like(chosen))

    def final_residual(self, target_probs, proposals, children):
        xp = namespace(target_probs)
        kept = xp.where(
            target_probs >= self._threshold(target_probs), target_probs, xp.zeros_like(target_probs)
        )
        mass = xp.sum(kept, axis=-1, keepdims=True)
        top = one_hot(xp.argmax(target_probs, axis=-1), target_probs.shape[-1], like=target_probs)
        # τ <= max q whenever α <= 1; a larger α could remove every token: keep the top one.
        return xp.where(mass > 0, kept / xp.where(mass > 0, mass, xp.ones_like(mass)), top)
