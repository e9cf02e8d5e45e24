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

Every other rule (a user's, an engine's, or a subclass of a built-in: its adapter is looked
up by exact class) runs through ``general``: ``TorchMassBranch`` for a branch rule that
declares γ from q_n alone, ``TorchGeneral`` otherwise (the rule's own methods on rows).
``register_adapter(rule_class, adapter_class)`` adds a hand-written torch half for speed;
``cactus_theory.testing.check_rule`` checks it against the numpy rule.
"""

from __future__ import annotations

from cactus_theory.core import rules
from cactus_theory.core.rules.base import Rule, gamma_is_elementwise
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
from cactus_theory.sampler.rules.general import TorchGeneral, TorchMassBranch
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


def register_adapter(rule_class: type[Rule], adapter_class: type[TorchRule]) -> None:
    """Use ``adapter_class`` (a ``TorchRule`` subclass, the protocol in ``base``) as the
    torch half of exactly ``rule_class``. ValueError for a class that is not a rule or an
    adapter, or when ``rule_class`` already has a different adapter."""
    if not (isinstance(rule_class, type) and issubclass(rule_class, Rule)):
        raise ValueError(f"rule_class: expected a subclass of rules.Rule, got {rule_class!r}")
    if not (isinstance(adapter_class, type) and issubclass(adapter_class, TorchRule)):
        raise ValueError(f"adapter_class: expected a TorchRule subclass, got {adapter_class!r}")
    existing = ADAPTERS.get(rule_class)
    if existing is not None and existing is not adapter_class:
        raise ValueError(
            f"rule_class: {rule_class.__name__} already has the torch adapter {existing.__name__}"
        )
    ADAPTERS[rule_class] = adapter_class


def generic_adapter(rule: Rule) -> TorchRule:
    """The adapter a rule with no torch half of its own runs through (``general``)."""
    return TorchMassBranch(rule) if gamma_is_elementwise(rule) else TorchGeneral(rule)


def for_rule(rule: object) -> TorchRule:
    """The torch adapter of a rule made by ``rules.make`` / ``rules.parse`` (or any
    ``rules.Rule`` instance): its registered torch half, else the generic one."""
    if not isinstance(rule, Rule):
        raise ValueError(
            f"rule: expected a rule from rules.make(...) or rules.parse(...), got "
            f"{type(rule).__name__}"
        )
    adapter = ADAPTERS.get(type(rule))
    return generic_adapter(rule) if adapter is None else adapter(rule)


__all__ = [
    "ADAPTERS",
    "TorchBranchRule",
    "TorchDecisionRule",
    "TorchRule",
    "TorchGeneral",
    "TorchMassBranch",
    "TorchTargetRule",
    "for_rule",
    "generic_adapter",
    "frontier_constants",
    "frontier_target",
    "gsps_accept",
    "gsps_residual",
    "register_adapter",
]
