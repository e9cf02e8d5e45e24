"""SGLang's threshold rule on trees, exactly as sgl-kernel's
``TreeSpeculativeSamplingTargetOnly`` (``csrc/speculative/speculative_sampling.cuh``;
Python ``tree_speculative_sampling_target_only``) verifies one node.

The kernel draws one coin u per node (``uniform_samples`` at the node's index) and walks
the node's children in order, keeping ``prob_acc``, the running sum of the verifier's
probabilities q(x_1) + ... + q(x_i) at the node (not renormalised). Child i is accepted,
and the walk moves to it, as soon as

    u <= prob_acc / threshold_acc   or   q(x_i) >= threshold_single;

a rejected child is removed (its ``draft_probs`` entry is set to q(x_i), which is zero
otherwise: SGLang's target-only mode passes an all-zero draft). When every child is
rejected, the node emits a draw from relu(q − draft_probs), that is q without the rejected
children, renormalised, with a second uniform (``uniform_samples_for_final_sampling``).
``threshold_acc`` is capped below at 1e-9 by the kernel.

In the tree-rule contract (``trees.base``) this is the cumulative

    C_i = 1                                  if q(x_j) >= t_s for some j <= i,
    C_i = min(1, (q(x_1) + ... + q(x_i)) / t_a)   otherwise,

so a_i = (C_i − C_{i−1}) / (1 − C_{i−1}), and the final residual is q without the
children. With one uniform per node, ours accepts child i iff C_{i−1} <= u < C_i; the
kernel's ``<=`` differs only on the boundary u = C_i (probability 0).

At (t_s, t_a) = (1, 1) (SGLang's default) C_i = q(x_1) + ... + q(x_i): the lossless walk,
for any distinct children. The kernel assumes distinct siblings (the draft's top-K); with
a repeated child, prob_acc counts its mass twice and the rule is no longer lossless, so
this rule is defined for deterministic children and children drawn without replacement.
Below (1, 1) a node emits e(S) = min(1, q(S)/t_a) on its children S (more when a child
reaches t_s): the same two-level tilt as Cactus-tree, with one global t_a instead of a
per-node budget, so its KL per node depends on q(S): at t_a = 0.5 and one child,
kl_bin(min(1, 2 q(S)) ‖ q(S)) = 0.105 nats at q(S) = 0.9 and 0.044 at q(S) = 0.1 (when
the cap binds with several children, the mass within S moves to the first ones and the
KL is larger).
"""

from __future__ import annotations

from typing import ClassVar

from cactus_theory import rules, trees
from cactus_theory.engines.sglang import Thresholds

#: The smallest threshold_acc the kernel uses (``fmaxf(threshold_acc, 1e-9f)``).
KERNEL_MIN_ACC = 1e-9


class SGLangTree(Thresholds, trees.TreeRule):
    """SGLang's tree kernel: one coin per node against the running sum of the children's q
    over t_a, or q(x_i) >= t_s; the remainder without the children when all fail."""

    name: ClassVar[str] = "sglang-tree"
    schemes: ClassVar[tuple[str, ...]] = (trees.DETERMINISTIC, trees.WITHOUT_REPLACEMENT)

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.threshold_single == 1.0 and self.threshold_acc == 1.0

    def cumulative(self, target_probs, children):
        """[..., K]: C_i (module docstring) for children [..., K] of rows q [..., V]."""
        xp = rules.namespace(target_probs)
        masses = xp.take_along_axis(target_probs, children, axis=-1)  # [..., K] q(x_i)
        ratio = xp.cumulative_sum(masses, axis=-1) / max(self.threshold_acc, KERNEL_MIN_ACC)
        single = xp.cumulative_sum(
            xp.astype(masses >= self.threshold_single, masses.dtype), axis=-1
        )
        ones = xp.ones_like(ratio)
        return xp.where(single > 0, ones, xp.minimum(ratio, ones))

    def sibling_accepts(self, target_probs, proposals, children):
        xp = rules.namespace(target_probs)
        cumulative = self.cumulative(target_probs, children)
        before = xp.concat([xp.zeros_like(cumulative[..., :1]), cumulative[..., :-1]], axis=-1)
        room = 1.0 - before
        open_ = room > 0
        return xp.where(
            open_, (cumulative - before) / xp.where(open_, room, xp.ones_like(room)), 0.0 * room
        )

    def final_residual(self, target_probs, proposals, children):
        xp = rules.namespace(target_probs)
        drafted = xp.sum(
            rules.one_hot(children, target_probs.shape[-1], like=target_probs), axis=-2
        )
        without = xp.where(drafted > 0, xp.zeros_like(target_probs), target_probs)
        mass = xp.sum(without, axis=-1, keepdims=True)
        has_mass = mass > 0
        # Children holding all of q: every walk accepts, and r is q itself (never sampled).
        return xp.where(
            has_mass, without / xp.where(has_mass, mass, xp.ones_like(mass)), target_probs
        )

    def closed_form_law(self, target_probs, draft_probs, width, scheme):
        return target_probs if self.lossless else None
