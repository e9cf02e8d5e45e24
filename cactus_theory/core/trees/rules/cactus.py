"""Cactus on trees (new here): tilt the verifier's row toward the drafted children within a
KL budget δ, then verify the children against the tilt.

For the children's set S (their distinct tokens), the tilt that maximises e(S) subject to
KL(e ‖ q) <= δ raises S to a mass s and scales both sides of q (Jensen: for a fixed e(S),
proportional spreading on each side minimises KL):

    e(x) = q(x) · s / q(S)  on S,     e(x) = q(x) · (1 − s)/(1 − q(S))  off S,

    KL(e ‖ q) = kl_bin(s ‖ q(S)) = s log(s/q(S)) + (1 − s) log((1 − s)/(1 − q(S))).

So s is Cactus's γ with q_n replaced by q(S): the exact root of kl_bin(s ‖ q(S)) = δ
(``exact=True``, ``core.gamma.exact_raised_mass``; s = 1 once −log q(S) <= δ) or the
paper's second-order closed form s = min(1, q(S) + sqrt(2 δ q(S)(1 − q(S))))
(``exact=False``, Corollary 5 with q_n -> q(S); it can overshoot δ).

- ``cactus-tree``: the lossless walk against e (one-hot proposals: accept child i with
  e'(x_i), e' = e without the rejected siblings). For deterministic children it emits e
  exactly and accepts e(S) = s, which is the constrained frontier (no scheme emitting a
  law within δ of q accepts more: trees.frontier). For sampled children S is random and
  the node emits the mixture E_S[e_S], whose KL is at most δ (convexity).
- ``cactus-rrs``: recursive rejection sampling against e with the true proposals
  (a_1 = min(1, e(x_1)/p(x_1)), then residuals), for sampled children. With one child it
  is Cactus (cactus-exact with ``exact=True``) itself: h^n = e for S = {n}.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from cactus_theory.core import gamma, validate
from cactus_theory.core.arrays import device, is_numpy, namespace, to_numpy
from cactus_theory.core.rules.base import Tunable, one_hot
from cactus_theory.core.rules.sps import SpS
from cactus_theory.core.trees.base import TreeRule
from cactus_theory.core.trees.rules.sequential import one_hot_proposals, sibling_walk

Array = np.ndarray

#: δ is the budget; 0 is the lossless walk (or RRS).
DELTA = Tunable("delta", 0.0, 1e4, log=True)
_SPS = SpS()


def children_mask(children: Array, like: Array) -> Array:
    """[..., V] bool: the tokens among ``children`` [..., K] (their set S)."""
    xp = namespace(like)
    return xp.sum(one_hot(children, like.shape[-1], like=like), axis=-2) > 0


def raised_set_mass(mass: Array, delta: float, exact: bool, divergence: str = "kl") -> Array:
    """s for q(S) = ``mass`` [..., 1] (module docstring): the exact root of the binary
    divergence (numpy roots; a torch input is solved on the CPU and moved back) or the
    second-order closed form (KL only)."""
    xp = namespace(mass)
    # A sum of masses can round a hair above 1 (or below 0 after a subtraction).
    mass = xp.clip(mass, 0.0, 1.0)
    if not exact:
        return xp.minimum(xp.ones_like(mass), mass + xp.sqrt(2.0 * delta * mass * (1.0 - mass)))
    values = to_numpy(mass)
    raised = gamma.exact_raised_mass(values, delta, divergence)
    if is_numpy(mass):
        return raised
    return xp.asarray(raised, dtype=mass.dtype, device=device(mass))


def set_tilt(target_probs: Array, inside: Array, raised: Array) -> Array:
    """[..., V]: e = q·s/q(S) on S and q·(1 − s)/(1 − q(S)) off S, for the set ``inside``
    [..., V] (bool) and its raised mass s = ``raised`` [..., 1] (e = q where q(S) is 0 or 1)."""
    xp = namespace(target_probs)
    zero = xp.zeros_like(target_probs)
    mass = xp.sum(xp.where(inside, target_probs, zero), axis=-1, keepdims=True)  # q(S)
    rest = xp.sum(xp.where(inside, zero, target_probs), axis=-1, keepdims=True)  # 1 − q(S)
    ones = xp.ones_like(mass)
    up = xp.where(mass > 0, raised / xp.where(mass > 0, mass, ones), ones)
    down = xp.where(rest > 0, (1.0 - raised) / xp.where(rest > 0, rest, ones), ones)
    proper = (mass > 0) & (rest > 0)
    scale = xp.where(inside, up, down)
    return xp.where(proper, target_probs * scale, target_probs)


class _Tilted(TreeRule):
    """Shared parameters and tilt of cactus-tree and cactus-rrs."""

    lossless_at: ClassVar[Mapping[str, Any]] = {"delta": 0.0}
    tunable: ClassVar[Tunable] = DELTA
    array_api: ClassVar[bool] = True
    support_only: ClassVar[bool] = True

    def __init__(self, delta: float, exact: bool = True) -> None:
        self.delta = validate.nonnegative("delta", delta)
        if not isinstance(exact, bool):
            raise ValueError(f"exact: must be true or false, got {exact!r}")
        self.exact = exact

    def params(self) -> dict[str, Any]:
        return {"delta": self.delta, "exact": self.exact}

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.delta == 0.0

    def tilt(self, target_probs: Array, children: Array) -> Array:
        """[..., V]: e for the children's set (module docstring)."""
        xp = namespace(target_probs)
        inside = children_mask(children, target_probs)
        zero = xp.zeros_like(target_probs)
        mass = xp.sum(xp.where(inside, target_probs, zero), axis=-1, keepdims=True)
        return set_tilt(target_probs, inside, raised_set_mass(mass, self.delta, self.exact))


class CactusTree(_Tilted):
    """The walk against the tilt e toward the children (module docstring); for
    deterministic children it accepts s and emits e: the frontier at δ (``exact``)."""

    name: ClassVar[str] = "cactus-tree"

    def sibling_accepts(self, target_probs, proposals, children):
        hot = one_hot_proposals(children, target_probs)
        return sibling_walk(_SPS, self.tilt(target_probs, children), hot, children)[0]

    def final_residual(self, target_probs, proposals, children):
        hot = one_hot_proposals(children, target_probs)
        return sibling_walk(_SPS, self.tilt(target_probs, children), hot, children)[1]


class CactusRRS(_Tilted):
    """Recursive rejection sampling against the tilt e toward the children (module
    docstring): Cactus for K sampled drafts."""

    name: ClassVar[str] = "cactus-rrs"

    def sibling_accepts(self, target_probs, proposals, children):
        return sibling_walk(_SPS, self.tilt(target_probs, children), proposals, children)[0]

    def final_residual(self, target_probs, proposals, children):
        return sibling_walk(_SPS, self.tilt(target_probs, children), proposals, children)[1]
