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

Exact laws: ``cactus_theory.core.law``. Torch versions: ``cactus_theory.sampler.rules`` (one
file per file here). Tests: ``tests/core/test_rules_properties.py`` and the files named
after each module.
"""

from __future__ import annotations

import inspect
from typing import Any

from cactus_theory.core.rules.base import (
    BranchRule,
    DecisionRule,
    Rule,
    TargetRule,
    gsps_accept,
    gsps_residual,
)
from cactus_theory.core.rules.baselines import Greedy, Interp, TopK, TypicalAcceptance
from cactus_theory.core.rules.cactus import Cactus, CactusExact
from cactus_theory.core.rules.frontier import Frontier, frontier_constants, frontier_target
from cactus_theory.core.rules.pareto import ParetoFrontier, pareto_target
from cactus_theory.core.rules.sps import SpS

REGISTRY: dict[str, type[Rule]] = {
    cls.name: cls
    for cls in (
        SpS,
        Cactus,
        CactusExact,
        Frontier,
        ParetoFrontier,
        Interp,
        TypicalAcceptance,
        TopK,
        Greedy,
    )
}
NAMES: tuple[str, ...] = tuple(REGISTRY)


def make(name: str, **params: Any) -> Rule:
    """Create the rule ``name`` with its parameters, e.g. ``make("cactus", delta=0.5)``.

    Raises ``ValueError`` for an unknown name, an unknown or missing parameter, or a bad
    value (δ < 0, α outside [0, 1], k < 1, ...).
    """
    if name not in REGISTRY:
        raise ValueError(f"name: unknown rule {name!r}; choose one of {NAMES}")
    cls = REGISTRY[name]
    named = {
        key: parameter
        for key, parameter in inspect.signature(cls.__init__).parameters.items()
        if key != "self" and parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    }
    accepted = list(named)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(
            f"{unknown[0]}: not a parameter of rule {name!r} (it takes {accepted or 'none'})"
        )
    missing = [
        key
        for key, parameter in named.items()
        if parameter.default is inspect.Parameter.empty and key not in params
    ]
    if missing:
        raise ValueError(f"{missing[0]}: rule {name!r} needs this parameter")
    return cls(**params)


def parse(spec: str) -> Rule:
    """A rule from ``name`` or ``name:key=value,...``, e.g. ``parse("cactus-exact:delta=0.5")``.

    The inverse of ``spec_of``. Numbers are parsed as float, except ``k`` (int);
    ``divergence`` stays a string. A key given twice is an error, not "last one wins".
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"spec: expected 'name' or 'name:key=value,...', got {spec!r}")
    name, _, rest = spec.partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"spec: expected key=value in {spec!r}, got {item!r}")
        if key in params:
            raise ValueError(f"{key}: given twice in {spec!r}")
        if key == "divergence":
            params[key] = value.strip()
            continue
        try:
            params[key] = int(value) if key == "k" else float(value)
        except ValueError:
            raise ValueError(f"{key}: expected a number in {spec!r}, got {value!r}") from None
    return make(name.strip(), **params)


def spec_of(rule: Rule) -> str:
    """The string ``parse`` accepts for ``rule``, e.g. ``"cactus:delta=0.5"``."""
    params = rule.params()
    if not params:
        return rule.name
    return rule.name + ":" + ",".join(f"{key}={value}" for key, value in params.items())


__all__ = [
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
    "TypicalAcceptance",
    "frontier_constants",
    "frontier_target",
    "gsps_accept",
    "gsps_residual",
    "make",
    "pareto_target",
    "parse",
    "spec_of",
]
