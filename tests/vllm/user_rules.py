"""A user's rule for the vLLM tests, in a module of its own (what ``--rules-module`` and
``cactus_llm(rules_modules=...)`` load in every process of the engine and the server).

``test-boost``: a branch rule written with numpy alone, γ_n = min(1, factor · q_n), with
no declared properties (so it runs on the generic torch adapter, on whole rows)."""

import numpy as np

from cactus_theory import rules


class Boost(rules.BranchRule):
    name = "test-boost"

    def __init__(self, factor: float = 2.0) -> None:
        self.factor = float(factor)

    def params(self):
        return {"factor": self.factor}

    def raised_mass(self, target_mass, cap=None):
        raised = np.minimum(1.0, self.factor * target_mass)
        return raised if cap is None else np.minimum(raised, cap)


rules.register(Boost)
