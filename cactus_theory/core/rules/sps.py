"""Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): h = q, lossless.

Accept n with probability min(1, q_n/p_n); on rejection sample (q − p)_+ / Σ (q − p)_+.
The emitted token is distributed exactly as q, and the acceptance Σ_x min(p_x, q_x) =
1 − TV(p, q) is the largest any scheme whose output law is q can reach (maximal coupling).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from cactus_theory.core.rules.base import TargetRule


class SpS(TargetRule):
    """Lossless speculative sampling: the adjusted target is the verifier's q."""

    name: ClassVar[str] = "sps"
    support_only: ClassVar[bool] = True
    lossless_at: ClassVar[Mapping[str, Any]] = {}
    greedy_consistent: ClassVar[bool] = True

    def target_law(self, target_probs: np.ndarray, draft_probs: np.ndarray) -> np.ndarray:
        return target_probs
