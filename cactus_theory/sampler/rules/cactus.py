"""Cactus and cactus-exact in torch (``cactus_theory.core.rules.cactus``).

Both raise the drafted n to γ_n and scale the rest of q by (1 − γ_n)/(1 − q_n); they differ
only in γ_n:

- ``cactus`` (paper, Cor. 5): γ_n = min(1, q_n + sqrt(2 δ q_n (1 − q_n))), in the compute
  dtype;
- ``cactus-exact``: γ*(q_n, δ), the exact root for the chosen divergence, solved in float64
  (``sampler.gamma``; B·k scalars) and cast back.
"""

from __future__ import annotations

import torch

from cactus_theory.sampler.gamma import exact_raised_mass
from cactus_theory.sampler.rules.base import TorchBranchRule

Tensor = torch.Tensor


class TorchCactus(TorchBranchRule):
    """γ_n = min(1, q_n + sqrt(2 δ q_n (1 − q_n)))."""

    def raised_mass(self, target_mass: Tensor, cap: Tensor | None = None) -> Tensor:
        spread = torch.sqrt(2.0 * self.rule.delta * target_mass * (1.0 - target_mass))
        raised = torch.clamp(target_mass + spread, max=1.0)
        return raised if cap is None else torch.minimum(raised, cap)


class TorchCactusExact(TorchBranchRule):
    """γ_n = γ*(q_n, δ) for the rule's divergence (float64 solve)."""

    def raised_mass(self, target_mass: Tensor, cap: Tensor | None = None) -> Tensor:
        raised = exact_raised_mass(target_mass, self.rule.delta, self.rule.divergence, cap)
        return raised.to(target_mass.dtype)
