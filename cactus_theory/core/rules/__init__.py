"""Every acceptance rule as exact numpy mathematics (float64).

>>> from cactus_theory import rules
>>> rule = rules.make("cactus", delta=0.5)
>>> rule.accept_prob(target=[0.5, 0.5], draft=[0.9, 0.1], token=0)
1.0

Rules, their parameters and where each is defined (q = target, p = draft, n = drafted):

- ``sps`` (``rules.sps``): h = q.
- ``cactus`` delta (``rules.cactus``): γ_n = min(1, q_n + √(2δ q_n(1−q_n))).
- ``cactus-exact`` delta, divergence="kl" (``rules.cactus``, ``gamma``): γ_n = γ*(q_n, δ).
- ``frontier`` delta (``rules.frontier``): h = clip(p, c_lo q, c_hi q) with KL(h‖q) = δ.
- ``pareto`` spread (``rules.pareto``): h = clip(p, c q, c e^κ q), the source-level frontier.
- ``interp`` alpha (``rules.baselines``): h = α p + (1−α) q.
- ``tas`` epsilon=0.09, alpha=√ε (``rules.baselines``): accept iff q_n > min(ε, α e^{−H(q)}).
- ``topk`` k (``rules.baselines``): accept iff q_n >= the k-th largest q.
- ``greedy`` (``rules.baselines``): accept iff n = argmax q.

Engines' relaxed rules (``cactus_theory.engines``, registered through ``register`` like any
plug-in): ``sglang`` threshold_single, threshold_acc; ``relaxed`` top_k, delta (TensorRT-LLM);
``relaxed-ratio`` top_k, ratio (vLLM proposals).

Your own rule: subclass ``TargetRule``, ``BranchRule``, ``DecisionRule`` or ``Rule`` (the
general family) and ``register`` it (``registry`` explains plug-ins and specs; docs/rules.md
walks through an example). ``NAMES`` is every registered name, plug-ins included.

Exact laws: ``cactus_theory.core.law``. Torch versions: ``cactus_theory.sampler.rules`` (one
file per file here; any other rule runs through its generic adapter). Tests:
``tests/core/test_rules_properties.py`` and the files named after each module; every
registered rule is checked by ``cactus_theory.testing`` in ``tests/testing/test_every_rule.py``.
"""

from __future__ import annotations

from cactus_theory.core.arrays import kth_largest, namespace
from cactus_theory.core.rules.base import (
    BranchRule,
    DecisionRule,
    Rule,
    TargetRule,
    Tunable,
    exact_family,
    gamma_is_elementwise,
    gsps_accept,
    gsps_residual,
    one_hot,
    take_at,
)
from cactus_theory.core.rules.baselines import Greedy, Interp, TopK, TypicalAcceptance
from cactus_theory.core.rules.cactus import Cactus, CactusExact
from cactus_theory.core.rules.frontier import Frontier, frontier_constants, frontier_target
from cactus_theory.core.rules.pareto import ParetoFrontier, pareto_target
from cactus_theory.core.rules.registry import (
    ENTRY_POINT_GROUP,
    ENV_MODULES,
    REGISTRY,
    discover,
    load_modules,
    make,
    names,
    parameter_types,
    parse,
    refresh,
    register,
    rule_class,
    spec_of,
)
from cactus_theory.core.rules.sps import SpS


def __getattr__(attribute: str):
    """``NAMES``: every registered rule name, read when asked (plug-ins included)."""
    if attribute == "NAMES":
        return names()
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


__all__ = [
    "ENTRY_POINT_GROUP",
    "ENV_MODULES",
    "NAMES",
    "REGISTRY",
    "BranchRule",
    "Cactus",
    "CactusExact",
    "DecisionRule",
    "Frontier",
    "Greedy",
    "Interp",
    "ParetoFrontier",
    "Rule",
    "SpS",
    "TargetRule",
    "TopK",
    "Tunable",
    "TypicalAcceptance",
    "discover",
    "exact_family",
    "frontier_constants",
    "frontier_target",
    "gamma_is_elementwise",
    "gsps_accept",
    "gsps_residual",
    "kth_largest",
    "load_modules",
    "make",
    "names",
    "namespace",
    "one_hot",
    "pareto_target",
    "parameter_types",
    "parse",
    "refresh",
    "register",
    "rule_class",
    "spec_of",
    "take_at",
]
