"""SGLang's threshold acceptance (``speculative_accept_threshold_single`` t_s and
``speculative_accept_threshold_acc`` t_a), exactly.

sgl-kernel's ``TreeSpeculativeSamplingTargetOnly`` (``speculative_sampling.cuh``) treats the
drafted token n as a one-hot draft: for a chain of drafts (one candidate per depth) it

    accepts n  if q_n >= t_s,  else with probability  min(1, q_n / t_a);
    on rejection samples  (q − e_n)_+ / Σ (q − e_n)_+ = q without n, renormalised.

Both the acceptance and the recovery law depend on n, so this is a general-family rule
(``rules.Rule``: ``accept_probs`` and ``residuals_for``). At (t_s, t_a) = (1, 1), SGLang's
default, it is lossless for any draft p: a_n = q_n and the emitted law is
Σ_n p_n [q_n e_n + (1 − q_n) q_{−n}/(1 − q_n)] = q. Lowering either threshold accepts
more and moves the emitted law away from q, with no bound on how far.

Its emitted law has a closed form (``emitted_law``, O(V) instead of the general family's
O(V²) enumeration): with w_n = p_n (1 − a_n)/(1 − q_n), the rejected mass of branch n
spread over q without n,

    out_i = p_i a_i + q_i (Σ_n w_n − w_i)     (a branch with q_n = 1 is never rejected).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from cactus_theory import rules


def _unit(name: str, value: object, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: must be a number in [0, 1], got {value!r}")
    number = float(value)
    if not (0.0 < number <= 1.0 if positive else 0.0 <= number <= 1.0):
        bounds = "(0, 1]" if positive else "[0, 1]"
        raise ValueError(f"{name}: must lie in {bounds}, got {value!r}")
    return number


class Thresholds:
    """SGLang's two thresholds, as its chain and tree rules both take and declare them."""

    support_only: ClassVar[bool] = True
    array_api: ClassVar[bool] = True
    lossless_at: ClassVar[Mapping[str, Any]] = {"threshold_single": 1.0, "threshold_acc": 1.0}
    tunable: ClassVar[rules.Tunable] = rules.Tunable("threshold_acc", 1e-6, 1.0, increasing=False)

    def __init__(self, threshold_single: float = 1.0, threshold_acc: float = 1.0) -> None:
        self.threshold_single = _unit("threshold_single", threshold_single, positive=False)
        self.threshold_acc = _unit("threshold_acc", threshold_acc, positive=True)

    def params(self) -> dict[str, Any]:
        return {"threshold_single": self.threshold_single, "threshold_acc": self.threshold_acc}


class SGLangThreshold(Thresholds, rules.Rule):
    """Accept n iff q_n >= t_s, else with probability min(1, q_n / t_a); recover q without n."""

    name: ClassVar[str] = "sglang"

    @property
    def greedy_consistent(self) -> bool:
        """With a one-hot q, a token of q = 0 is accepted only when t_s = 0."""
        return self.threshold_single > 0

    def accept_probs(self, target_probs, draft_probs):
        xp = rules.namespace(target_probs, draft_probs)
        ratio = xp.minimum(target_probs / self.threshold_acc, xp.ones_like(target_probs))
        accept = xp.where(target_probs >= self.threshold_single, xp.ones_like(ratio), ratio)
        return xp.where(draft_probs > 0, accept, xp.zeros_like(accept))

    def emitted_law(self, target_probs, draft_probs):
        """[..., V]: Σ_n p_n (a_n e_n + (1 − a_n) r^n) in closed form (module docstring)."""
        xp = rules.namespace(target_probs, draft_probs)
        accept = self.accept_probs(target_probs, draft_probs)
        rejected = draft_probs * (1.0 - accept)  # p_n (1 − a_n)
        rest = 1.0 - target_probs  # the mass q without n
        safe = xp.where(rest > 0, rest, xp.ones_like(rest))
        spread = xp.where(rest > 0, rejected / safe, xp.zeros_like(rejected))
        total = xp.sum(spread, axis=-1, keepdims=True)
        # q_n = 1: r^n is q itself (e_n), so a rejected mass there stays at n
        kept = xp.where(rest > 0, xp.zeros_like(rejected), rejected)
        return draft_probs * accept + target_probs * (total - spread) + kept

    def residuals_for(self, target_probs, draft_probs, tokens):
        xp = rules.namespace(target_probs, draft_probs)
        drafted = rules.one_hot(tokens, target_probs.shape[-1], like=target_probs)
        without = target_probs * (1.0 - drafted)  # q with n removed
        mass = xp.sum(without, axis=-1, keepdims=True)
        has_mass = mass > 0
        # q = e_n leaves nothing: then rejection has probability 0 and r is q itself.
        return xp.where(
            has_mass, without / xp.where(has_mass, mass, xp.ones_like(mass)), target_probs
        )
