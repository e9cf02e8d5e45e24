"""Every rule of ``cactus_theory.core.rules`` in torch, one file per numpy rule file.

``for_rule(rule)`` returns the torch adapter of a numpy rule (``rules.make`` /
``rules.parse``); ``sampler.verify`` and the decoder call only that. The protocol every
adapter follows is in ``base``. Numpy class (``core/rules/``) -> adapter (``sampler/rules/``):

- ``sps.SpS`` -> ``sps.TorchSpS``
- ``cactus.Cactus``, ``cactus.CactusExact`` -> ``cactus.TorchCactus``, ``cactus.TorchCactusExact``
- ``frontier.Frontier`` -> ``frontier.TorchFrontier`` (with the batched frontier solve)
- ``pareto.ParetoFrontier`` -> ``pareto.TorchPareto``
- ``baselines.Interp``, ``TypicalAcceptance``, ``TopK``, ``Greedy`` -> ``baselines.TorchInterp``,
  ``TorchTypicalAcceptance``, ``TorchTopK``, ``TorchGreedy``
"""

from __future__ import annotations

from cactus_theory.core import rules
from cactus_theory.core.rules.base import Rule
from cactus_theory.sampler.rules.base import (
    TorchBranchRule,
    TorchDecisionRule,
    TorchRule,
    TorchTargetRule,
    gsps_accept,
    gsps_residual,
)
from cactus_theory.sampler.rules.baselines import (
    TorchGreedy,
    TorchInterp,
    TorchTopK,
    TorchTypicalAcceptance,
)
from cactus_theory.sampler.rules.cactus import TorchCactus, TorchCactusExact
from cactus_theory.sampler.rules.frontier import TorchFrontier, frontier_constants, frontier_target
from cactus_theory.sampler.rules.pareto import TorchPareto
from cactus_theory.sampler.rules.sps import TorchSpS

#: The torch adapter of each numpy rule class.
ADAPTERS: dict[type[Rule], type[TorchRule]] = {
    rules.SpS: TorchSpS,
    rules.Cactus: TorchCactus,
    rules.CactusExact: TorchCactusExact,
    rules.Frontier: TorchFrontier,
    rules.ParetoFrontier: TorchPareto,
    rules.Interp: TorchInterp,
    rules.TypicalAcceptance: TorchTypicalAcceptance,
    rules.TopK: TorchTopK,
    rules.Greedy: TorchGreedy,
}


def for_rule(rule: object) -> TorchRule:
    """The torch adapter of a rule made by ``rules.make`` / ``rules.parse``."""
    if not isinstance(rule, Rule):
        raise ValueError(
            f"rule: expected a rule from rules.make(...) or rules.parse(...), got "
            f"{type(rule).__name__}"
        )
    adapter = ADAPTERS.get(type(rule))
    if adapter is None:
        raise ValueError(f"rule: no torch version of {rule!r}")
    return adapter(rule)


__all__ = [
    "ADAPTERS",
    "TorchBranchRule",
    "TorchDecisionRule",
    "TorchRule",
    "TorchTargetRule",
    "for_rule",
    "frontier_constants",
    "frontier_target",
    "gsps_accept",
    "gsps_residual",
]
