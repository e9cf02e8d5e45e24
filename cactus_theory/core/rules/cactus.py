"""Cactus (Hao & Mou, ICLR 2026): raise the drafted token within a divergence budget.

For the drafted n, h maximises h_n subject to D(h‖q) <= δ. The optimum raises n to γ_n
and scales the rest of q by (1 − γ_n)/(1 − q_n) (see ``cactus_theory.gamma``); the verify
step is then generalised SpS against this h, which depends on n.

- ``cactus``: the paper's closed form (Corollary 5), second-order in KL:
  γ_n = min(1, q_n + sqrt(2 δ q_n (1 − q_n))). It can exceed the KL budget per branch.
- ``cactus-exact``: the exact γ*(q_n, δ) for the chosen divergence (default KL), so
  D(h^n‖q) <= δ holds in every branch. The emitted law (a mixture over n) is neither h nor q.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from cactus_theory.core import divergences, gamma, validate
from cactus_theory.core.rules.base import BranchRule, Tunable

#: What cactus and cactus-exact declare: δ is their budget, 0 is SpS.
DELTA = Tunable("delta", 0.0, 1e4, log=True)


class Cactus(BranchRule):
    """The paper's closed form: γ_n = min(1, q_n + sqrt(2 δ q_n (1 − q_n)))."""

    name: ClassVar[str] = "cactus"
    gamma_from_mass: ClassVar[bool] = True
    support_only: ClassVar[bool] = True
    lossless_at: ClassVar[Mapping[str, Any]] = {"delta": 0.0}
    tunable: ClassVar[Tunable] = DELTA
    greedy_consistent: ClassVar[bool] = True

    def __init__(self, delta: float) -> None:
        self.delta = validate.nonnegative("delta", delta)

    def params(self) -> dict[str, Any]:
        return {"delta": self.delta}

    def raised_mass(self, target_mass: np.ndarray, cap: np.ndarray | None = None) -> np.ndarray:
        raised = np.minimum(
            1.0, target_mass + np.sqrt(2.0 * self.delta * target_mass * (1.0 - target_mass))
        )
        return raised if cap is None else np.minimum(raised, cap)


class CactusExact(BranchRule):
    """γ_n = γ*(q_n, δ), the exact largest mass within budget δ of ``divergence``."""

    name: ClassVar[str] = "cactus-exact"
    gamma_from_mass: ClassVar[bool] = True
    support_only: ClassVar[bool] = True
    lossless_at: ClassVar[Mapping[str, Any]] = {"delta": 0.0}
    tunable: ClassVar[Tunable] = DELTA

    def __init__(self, delta: float, divergence: str = "kl") -> None:
        self.delta = validate.nonnegative("delta", delta)
        self.divergence = divergences.check_name(divergence)

    @property
    def greedy_consistent(self) -> bool:  # type: ignore[override]
        """KL and χ² give γ = 0 where q_n = 0 (infinite divergence otherwise); TV, Hellinger,
        JS and reverse KL can lift a token the verifier excludes."""
        return self.divergence in ("kl", "chi2")

    def params(self) -> dict[str, Any]:
        if self.divergence == "kl":
            return {"delta": self.delta}
        return {"delta": self.delta, "divergence": self.divergence}

    def raised_mass(self, target_mass: np.ndarray, cap: np.ndarray | None = None) -> np.ndarray:
        return gamma.exact_raised_mass(target_mass, self.delta, self.divergence, cap=cap)
