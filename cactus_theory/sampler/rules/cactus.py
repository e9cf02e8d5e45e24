"""Cactus and cactus-exact in torch (``cactus_theory.core.rules.cactus``).

Both raise the drafted n to γ_n and scale the rest of q by (1 − γ_n)/(1 − q_n); they differ
only in γ_n:

- ``cactus`` (paper, Cor. 5): γ_n = min(1, q_n + sqrt(2 δ q_n (1 − q_n))), in the compute
  dtype;
- ``cactus-exact``: γ*(q_n, δ), the exact root for the chosen divergence, solved in float64
  and cast back: on CPU, for up to ``NUMPY_GAMMA_ELEMENTS`` valid masses (the B·k drafted
  q_n of a verify step), by the numpy reference ``core.gamma`` itself (the same roots, and
  a few µs per numpy call against ~10 µs per torch call on so few scalars); otherwise by
  ``sampler.gamma`` in torch.
"""

from __future__ import annotations

import torch

from cactus_theory.core import gamma as reference_gamma
from cactus_theory.sampler.gamma import exact_raised_mass
from cactus_theory.sampler.rules.base import TorchBranchRule

Tensor = torch.Tensor

#: Up to this many masses on CPU, cactus-exact solves γ* with the numpy reference.
NUMPY_GAMMA_ELEMENTS = 1 << 14


class TorchCactus(TorchBranchRule):
    """γ_n = min(1, q_n + sqrt(2 δ q_n (1 − q_n)))."""

    def raised_mass(self, target_mass: Tensor, cap: Tensor | None = None) -> Tensor:
        spread = torch.sqrt(2.0 * self.rule.delta * target_mass * (1.0 - target_mass))
        raised = torch.clamp(target_mass + spread, max=1.0)
        return raised if cap is None else torch.minimum(raised, cap)


class TorchCactusExact(TorchBranchRule):
    """γ_n = γ*(q_n, δ) for the rule's divergence (float64 solve)."""

    def raised_mass(self, target_mass: Tensor, cap: Tensor | None = None) -> Tensor:
        if _numpy_solvable(target_mass, cap):
            raised = torch.from_numpy(
                reference_gamma.exact_raised_mass(
                    target_mass.to(torch.float64).numpy(),
                    self.rule.delta,
                    self.rule.divergence,
                    None if cap is None else cap.to(torch.float64).numpy(),
                )
            ).reshape(target_mass.shape)
        else:
            raised = exact_raised_mass(target_mass, self.rule.delta, self.rule.divergence, cap)
        return raised.to(target_mass.dtype)


def _numpy_solvable(target_mass: Tensor, cap: Tensor | None) -> bool:
    """Whether the numpy reference can take these masses: few, on CPU, and valid (finite,
    in [0, 1]; unchecked garbage goes to the torch path, which never raises)."""
    if target_mass.device.type != "cpu" or target_mass.numel() > NUMPY_GAMMA_ELEMENTS:
        return False
    if cap is not None and cap.shape != target_mass.shape:
        return False
    values = target_mass if cap is None else torch.cat([target_mass.reshape(-1), cap.reshape(-1)])
    return bool(((values >= 0) & (values <= 1)).all().item())
