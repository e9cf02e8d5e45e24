"""A minimal deterministic walk for the tree tests until the registry's rules land
(TEST HELPER ONLY; replaced by ``trees.make("walk")``)."""

from cactus_theory.core.arrays import namespace
from cactus_theory.core.rules.base import one_hot
from cactus_theory.core.trees.base import DETERMINISTIC, TreeRule


class HelperWalk(TreeRule):
    name = "helper-walk"
    lossless = True
    schemes = (DETERMINISTIC,)
    array_api = True

    def sibling_accepts(self, target_probs, proposals, children):
        xp = namespace(target_probs)
        picked = xp.take_along_axis(target_probs, children, axis=-1)  # [..., K]
        before = xp.cumulative_sum(picked, axis=-1) - picked
        rest = 1.0 - before
        safe = xp.where(rest > 0, rest, xp.ones_like(rest))
        return xp.where(rest > 1e-300, xp.clip(picked / safe, 0.0, 1.0), xp.zeros_like(rest))

    def final_residual(self, target_probs, proposals, children):
        xp = namespace(target_probs)
        drafted = xp.sum(one_hot(children, target_probs.shape[-1], like=target_probs), axis=-2)
        kept = xp.where(drafted > 0, xp.zeros_like(target_probs), target_probs)
        mass = xp.sum(kept, axis=-1, keepdims=True)
        return kept / xp.where(mass > 0, mass, xp.ones_like(mass))
