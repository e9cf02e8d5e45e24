"""Baselines: interpolation, typical acceptance (TAS), top-k and greedy acceptance.

- ``interp``: generalised SpS against h = α p + (1 − α) q (n-independent, so the emitted
  law is h); acceptance α + (1 − α)(1 − TV(p, q)).
- ``tas`` (typical acceptance; Medusa, vLLM): accept n iff q_n > min(ε, α exp(−H(q))),
  with H(q) = −Σ q log q in nats and α = sqrt(ε) unless given (vLLM defaults ε = 0.09,
  α = 0.3). On rejection emit argmax q (first index on ties). vLLM computes H with
  log(q + 1e−5); we use the exact entropy.
- ``topk``: accept n iff q_n >= the k-th largest value of q (ties all count as top-k). On
  rejection sample q restricted to that set and renormalised, so the emitted token is
  always in the verifier's top-k. (The Cactus reference code samples (1[top-k] − p)_+
  instead; acceptance is identical.)
- ``greedy``: accept n iff n = argmax q (first index on ties); on rejection emit argmax q.
  The emitted token is argmax q whatever the draft.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from scipy import special

from cactus_theory.core import validate
from cactus_theory.core.rules.base import DecisionRule, TargetRule, Tunable, one_hot


class Interp(TargetRule):
    """h = α p + (1 − α) q."""

    name: ClassVar[str] = "interp"
    support_only: ClassVar[bool] = True
    lossless_at: ClassVar[Mapping[str, Any]] = {"alpha": 0.0}
    tunable: ClassVar[Tunable] = Tunable("alpha", 0.0, 1.0)

    def __init__(self, alpha: float) -> None:
        self.alpha = validate.unit_interval("alpha", alpha)

    def params(self) -> dict[str, Any]:
        return {"alpha": self.alpha}

    def target_law(self, target_probs: np.ndarray, draft_probs: np.ndarray) -> np.ndarray:
        return self.alpha * draft_probs + (1.0 - self.alpha) * target_probs


def entropy(target_probs: np.ndarray) -> np.ndarray:
    """H(q) = −Σ q log q (nats), with 0 log 0 = 0."""
    return special.entr(target_probs).sum(axis=-1)


class TypicalAcceptance(DecisionRule):
    """Accept n iff q_n > min(ε, α exp(−H(q))); recover argmax q."""

    name: ClassVar[str] = "tas"
    support_only: ClassVar[bool] = True
    greedy_consistent: ClassVar[bool] = True

    def __init__(self, epsilon: float = 0.09, alpha: float | None = None) -> None:
        self.epsilon = validate.positive("epsilon", epsilon)
        self.alpha = math.sqrt(self.epsilon) if alpha is None else validate.positive("alpha", alpha)

    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "alpha": self.alpha}

    def threshold(self, target_probs: np.ndarray) -> np.ndarray:
        """min(ε, α exp(−H(q))) per row."""
        return np.minimum(self.epsilon, self.alpha * np.exp(-entropy(target_probs)))

    def accept_mask(self, target_probs: np.ndarray) -> np.ndarray:
        return target_probs > self.threshold(target_probs)[..., None]

    def recovery(self, target_probs: np.ndarray) -> np.ndarray:
        return one_hot(np.argmax(target_probs, axis=-1), target_probs.shape[-1])


def top_k_threshold(target_probs: np.ndarray, k: int) -> np.ndarray:
    """The k-th largest value of each row (the whole row's minimum when k >= V)."""
    kth = min(k, target_probs.shape[-1])
    return -np.partition(-target_probs, kth - 1, axis=-1)[..., kth - 1]


class TopK(DecisionRule):
    """Accept n iff q_n >= k-th largest q; recover q restricted to the top-k set."""

    name: ClassVar[str] = "topk"
    support_only: ClassVar[bool] = True

    def __init__(self, k: int) -> None:
        self.k = validate.positive_int("k", k)

    def params(self) -> dict[str, Any]:
        return {"k": self.k}

    @property
    def greedy_consistent(self) -> bool:  # type: ignore[override]
        """k = 1 only: with a one-hot target every other token ties for the k-th place."""
        return self.k == 1

    def accept_mask(self, target_probs: np.ndarray) -> np.ndarray:
        return target_probs >= top_k_threshold(target_probs, self.k)[..., None]

    def recovery(self, target_probs: np.ndarray) -> np.ndarray:
        kept = np.where(self.accept_mask(target_probs), target_probs, 0.0)
        return kept / kept.sum(axis=-1, keepdims=True)


class Greedy(DecisionRule):
    """Accept n iff n = argmax q; recover argmax q."""

    name: ClassVar[str] = "greedy"
    support_only: ClassVar[bool] = True
    greedy_consistent: ClassVar[bool] = True

    def accept_mask(self, target_probs: np.ndarray) -> np.ndarray:
        return one_hot(np.argmax(target_probs, axis=-1), target_probs.shape[-1]).astype(bool)

    def recovery(self, target_probs: np.ndarray) -> np.ndarray:
        return one_hot(np.argmax(target_probs, axis=-1), target_probs.shape[-1])
