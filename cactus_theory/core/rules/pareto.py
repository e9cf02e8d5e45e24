"""The ``pareto`` rule: the Pareto frontier of a *source* (acceptance vs emitted-law KL,
averaged over contexts).

``frontier(δ)`` is optimal context by context: no scheme whose emitted law is within δ of
q in that context accepts more. Over a source, though, what a reader compares is the
*average* acceptance E_c[A_c] against the *average* emitted KL E_c[K_c], and a fixed δ
in every context is not the best way to spend an average budget. The source-level frontier
maximises E_c[Σ_x min(p_x, h_x)] − λ E_c[KL(h‖q)] context by context (Lagrange), and its
KKT conditions give the same clip family as ``frontier``, with the cap ratio fixed instead
of the budget:

    h = clip(p, c q, c e^κ q),  κ = 1/λ >= 0,  c set by Σ h = 1,

(subgradient 1 − λ(log(h_x/q_x) + 1) + μ = 0 where h_x < p_x, and −λ(log(h_x/q_x)+1) + μ = 0
where h_x > p_x, so c_hi / c_lo = e^{1/λ}). κ = 0 is SpS (h = q); κ → ∞ tends to h = p
on the support of q. For every κ the point (E[KL], E[acceptance]) lies on the upper concave
envelope of what any scheme can reach, so for any rule with averages (K, A):

    A <= A*(κ) + (K − K*(κ)) / κ          (supporting line with slope λ = 1/κ).

Since h does not depend on the drafted token, the emitted law is h exactly
(generalised SpS), so this is also a rule one can decode with: ``ParetoFrontier(spread=κ)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from cactus_theory.core import roots, validate
from cactus_theory.core.rules.base import TargetRule, Tunable

Array = np.ndarray


class ParetoFrontier(TargetRule):
    """h = clip(p, c q, c e^κ q) with Σ h = 1: the source-level acceptance–KL frontier."""

    name: ClassVar[str] = "pareto"
    support_only: ClassVar[bool] = True
    lossless_at: ClassVar[Mapping[str, Any]] = {"spread": 0.0}
    tunable: ClassVar[Tunable] = Tunable("spread", 0.0, 700.0, log=True)
    greedy_consistent: ClassVar[bool] = True

    def __init__(self, spread: float) -> None:
        self.spread = validate.nonnegative("spread", spread)

    def params(self) -> dict[str, Any]:
        return {"spread": self.spread}

    def target_law(self, target_probs: Array, draft_probs: Array) -> Array:
        return pareto_target(target_probs, draft_probs, self.spread)


def pareto_target(target_probs: Array, draft_probs: Array, spread: float) -> Array:
    """h = clip(p, c q, c e^κ q) / Σ, with c in (0, 1] the root of Σ clip(...) = 1 per row.

    Σ_x clip(p_x, c q_x, c e^κ q_x) is continuous and increasing in c, 0 at c = 0 and
    >= Σ q = 1 at c = 1, so the root is bracketed; ``roots.feasible_root`` returns the side
    with Σ <= 1, and the final division makes each row sum to 1.
    """
    if spread == 0:
        return target_probs
    ratio = np.exp(min(spread, 700.0))
    shape = target_probs.shape
    target_rows = target_probs.reshape(-1, shape[-1])
    draft_rows = draft_probs.reshape(-1, shape[-1])

    def excess(scale: Array, row: Array) -> Array:
        index = row.astype(np.intp)
        low = scale[:, None] * target_rows[index]
        return np.clip(draft_rows[index], low, ratio * low).sum(axis=-1) - 1.0

    every = np.arange(target_rows.shape[0], dtype=np.float64)
    scale = np.ones(target_rows.shape[0])
    todo = excess(scale, every) > 0
    if np.any(todo):
        count = int(todo.sum())
        scale[todo] = roots.feasible_root(
            excess, np.zeros(count), np.ones(count), args=(every[todo],)
        )
    low = scale[:, None] * target_rows
    adjusted = np.clip(draft_rows, low, ratio * low)
    adjusted = adjusted / adjusted.sum(axis=-1, keepdims=True)
    return adjusted.reshape(shape)
