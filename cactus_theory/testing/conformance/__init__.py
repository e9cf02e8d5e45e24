"""The conformance suite: what an engine's verify step really emits, against the rule it
claims.

``conform(verify_fn, rule="sps", ...)`` (also ``cactus_theory.testing.conform``) runs
every property on one engine and returns a ``ConformReport``; ``Adapter`` wraps an
engine's verify function with its conventions; ``adapters`` holds the adapters of the
engines this project checks (``cactus conform ENGINE``); ``planted`` holds samplers with
planted defects the suite must catch. Modules: ``adapter`` (the signature), ``reference``
(the claimed rule's decisions for injected randomness), ``cases`` (drawn blocks and law
cases), ``exact`` and ``laws`` (the two kinds of property), ``stats`` (chi-square and its
power), ``report``, ``harness``.
"""

from cactus_theory.testing.conformance.adapter import Adapter, ExtraCheck
from cactus_theory.testing.conformance.harness import LEVEL, PROPERTIES, conform
from cactus_theory.testing.conformance.reference import (
    EXPONENTIAL_RACE,
    INVERSE_CDF,
    Uniforms,
)
from cactus_theory.testing.conformance.report import (
    NOT_APPLICABLE,
    ConformReport,
    PropertyResult,
)

__all__ = [
    "EXPONENTIAL_RACE",
    "INVERSE_CDF",
    "LEVEL",
    "NOT_APPLICABLE",
    "PROPERTIES",
    "Adapter",
    "ConformReport",
    "ExtraCheck",
    "PropertyResult",
    "Uniforms",
    "conform",
]
