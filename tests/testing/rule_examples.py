"""Rules the kit's tests share (users' rules written as users write them)."""

import numpy as np

from cactus_theory import rules


class EntropyGamma(rules.BranchRule):
    """γ_n = min(1, q_n + H(q)/4): reads the whole row, written (as users did) in
    ``raised_mass`` on what it is given."""

    name = "test-entropy-gamma"

    def raised_mass(self, target_mass, cap=None):
        logs = np.log(np.where(target_mass > 0, target_mass, 1.0))
        entropy = -np.sum(target_mass * logs, axis=-1, keepdims=True)
        raised = np.minimum(1.0, target_mass + entropy / 4)
        return raised if cap is None else np.minimum(raised, cap)
