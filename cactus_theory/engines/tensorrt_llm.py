"""TensorRT-LLM's relaxed acceptance for MTP (``relaxed_topk`` K, ``relaxed_delta`` δ), exactly.

TensorRT-LLM (``_torch/speculative/mtp.py``, ``mtpRelaxedAcceptanceKernel``) takes the
verifier's top-K probabilities at each draft position and accepts the drafted n iff it is
the top-1 token or one of the top-K whose probability is within δ of the top-1's:

    A = {argmax q} ∪ {t in top-K(q) : q_t >= q_max − δ};   accept n iff n ∈ A;
    on rejection emit argmax q (the "golden token").

Modular MAX and AMD ATOM copy it (ATOM hard-codes K = 8, δ = 0.5); TensorRT-LLM's
published DeepSeek-R1 setting is K = 10, δ = 0.6, applied inside thinking spans. The
engines run it on greedy (one-hot) drafts; with a sampled draft n ~ p it is the decision
rule above, whose emitted law is p on A plus P(n ∉ A) at argmax q.

Ties: the engine's top-K keeps an arbitrary subset of tokens tied at the K-th place; here
every token tied with the K-th largest probability belongs to top-K (a deterministic rule),
and argmax q is the first index of the largest probability.
"""

from __future__ import annotations

from typing import Any, ClassVar

from cactus_theory import rules


def argmax_one_hot(target_probs):
    """e_{argmax q} per row (first index on ties), in the rows' namespace and dtype."""
    xp = rules.namespace(target_probs)
    return rules.one_hot(
        xp.argmax(target_probs, axis=-1), target_probs.shape[-1], like=target_probs
    )


def _top_k(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"top_k: must be an integer >= 1, got {value!r}")
    return value


class RelaxedTopK(rules.DecisionRule):
    """Accept n iff n = argmax q or (n in top-K(q) and q_n >= q_max − δ); recover argmax q."""

    name: ClassVar[str] = "relaxed"
    support_only: ClassVar[bool] = True
    array_api: ClassVar[bool] = True
    tunable: ClassVar[rules.Tunable] = rules.Tunable("delta", 0.0, 1.0)

    def __init__(self, top_k: int = 10, delta: float = 0.6) -> None:
        self.top_k = _top_k(top_k)
        if isinstance(delta, bool) or not isinstance(delta, int | float) or not delta >= 0:
            raise ValueError(f"delta: must be a number >= 0, got {delta!r}")
        self.delta = float(delta)

    def params(self) -> dict[str, Any]:
        return {"top_k": self.top_k, "delta": self.delta}

    @property
    def greedy_consistent(self) -> bool:
        """With a one-hot q, a token of q = 0 is within δ of the top-1 only when δ >= 1."""
        return self.delta < 1.0

    def accept_mask(self, target_probs):
        xp = rules.namespace(target_probs)
        largest = xp.max(target_probs, axis=-1, keepdims=True)  # [..., 1] q_max
        near_top = (target_probs >= rules.kth_largest(target_probs, self.top_k)) & (
            target_probs >= largest - self.delta
        )
        return near_top | (argmax_one_hot(target_probs) > 0)

    def recovery(self, target_probs):
        return argmax_one_hot(target_probs)
