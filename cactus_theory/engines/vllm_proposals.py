"""The top-K-with-ratio relaxation proposed for vLLM V1 (``top_k`` K, ``ratio`` r), exactly.

Several pull requests to vLLM (vllm-project/vllm #21506, #22238, #43184, #45229; issue
#30248 asks for relaxed acceptance in V1) propose accepting a draft that is among the
verifier's top-K tokens and not much less likely than its top-1, none merged:

    A = {t in top-K(q) : q_t >= r · q_max};   accept n iff n ∈ A;   else emit argmax q.

For r <= 1 the verifier's argmax is always in A. Proposed for greedy (one-hot) drafts;
with a sampled draft n ~ p it is the decision rule above. Ties at the K-th place are all
kept, as in ``tensorrt_llm``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from cactus_theory import rules
from cactus_theory.engines.tensorrt_llm import _top_k, argmax_one_hot


class RelaxedRatio(rules.DecisionRule):
    """Accept n iff n is in top-K(q) and q_n >= r · q_max; recover argmax q."""

    name: ClassVar[str] = "relaxed-ratio"
    support_only: ClassVar[bool] = True
    array_api: ClassVar[bool] = True
    tunable: ClassVar[rules.Tunable] = rules.Tunable("ratio", 0.0, 1.0, increasing=False)

    def __init__(self, top_k: int, ratio: float) -> None:
        self.top_k = _top_k(top_k)
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 <= ratio <= 1:
            raise ValueError(f"ratio: must lie in [0, 1], got {ratio!r}")
        self.ratio = float(ratio)

    def params(self) -> dict[str, Any]:
        return {"top_k": self.top_k, "ratio": self.ratio}

    @property
    def greedy_consistent(self) -> bool:
        """With a one-hot q, a token of q = 0 passes q_t >= r · 1 only when r = 0."""
        return self.ratio > 0

    def accept_mask(self, target_probs):
        xp = rules.namespace(target_probs)
        largest = xp.max(target_probs, axis=-1, keepdims=True)  # [..., 1] q_max
        in_top_k = target_probs >= rules.kth_largest(target_probs, self.top_k)
        return in_top_k & (target_probs >= self.ratio * largest)

    def recovery(self, target_probs):
        return argmax_one_hot(target_probs)
