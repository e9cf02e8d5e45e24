"""Interpolation, typical acceptance, top-k and greedy in torch
(``cactus_theory.core.rules.baselines``).

- ``interp``: h = α p + (1 − α) q (generalised SpS; decided from q_n, p_n);
- ``tas``: accept iff q_n > min(ε, α exp(−H(q))) (exact entropy), recover argmax q;
- ``topk``: accept iff q_n >= the k-th largest q (ties kept), recover q on that set;
- ``greedy``: accept iff n = argmax q, recover argmax q.
"""

from __future__ import annotations

import torch

from cactus_theory.sampler.rules.base import TorchDecisionRule, TorchTargetRule, one_hot_argmax

Tensor = torch.Tensor


class TorchInterp(TorchTargetRule):
    """h = α p + (1 − α) q."""

    def target_law(self, target_probs, draft_probs, state):
        alpha = self.rule.alpha
        return alpha * draft_probs + (1.0 - alpha) * target_probs


class TorchTypicalAcceptance(TorchDecisionRule):
    """Accept n iff q_n > min(ε, α exp(−H(q)))."""

    def threshold(self, target_probs: Tensor) -> Tensor:
        """min(ε, α exp(−H(q))) per row [...] of rows [..., V]."""
        entropy = -torch.special.xlogy(target_probs, target_probs).sum(dim=-1)
        return torch.clamp(self.rule.alpha * torch.exp(-entropy), max=self.rule.epsilon)

    def accept_mask(self, target_probs, draft_ids, target_at):
        return target_at > self.threshold(target_probs)

    def accept_rows(self, target_probs):
        return target_probs > self.threshold(target_probs)[..., None]

    def recovery(self, target_row):
        return one_hot_argmax(target_row)


def kth_largest(target_probs: Tensor, k: int) -> Tensor:
    """The k-th largest value of each row [..., V] -> [...] (the minimum when k >= V)."""
    return torch.topk(target_probs, min(k, target_probs.shape[-1]), dim=-1).values[..., -1]


class TorchTopK(TorchDecisionRule):
    """Accept n iff q_n >= the k-th largest q; recover q restricted to that set."""

    def accept_mask(self, target_probs, draft_ids, target_at):
        return target_at >= kth_largest(target_probs, self.rule.k)

    def accept_rows(self, target_probs):
        return target_probs >= kth_largest(target_probs, self.rule.k)[..., None]

    def recovery(self, target_row):
        kept = target_row >= kth_largest(target_row, self.rule.k)[:, None]  # [R, V]
        return torch.where(kept, target_row, torch.zeros_like(target_row))


class TorchGreedy(TorchDecisionRule):
    """Accept n iff n = argmax q (first index on ties); recover argmax q."""

    def accept_mask(self, target_probs, draft_ids, target_at):
        return torch.argmax(target_probs, dim=-1) == draft_ids

    def accept_rows(self, target_probs):
        return one_hot_argmax(target_probs) > 0

    def recovery(self, target_row):
        return one_hot_argmax(target_row)
