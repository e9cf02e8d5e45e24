"""SpS in torch (``cactus_theory.core.rules.sps``): h = q, a = min(1, q_n/p_n), residual
(q − p)_+. Lossless: the emitted token is distributed exactly as q."""

from __future__ import annotations

from cactus_theory.sampler.rules.base import TorchTargetRule


class TorchSpS(TorchTargetRule):
    """h = q."""

    def target_law(self, target_probs, draft_probs, state):
        return target_probs
