"""The built-in tree rules, one concept per file (each docstring names the engine or paper
it follows):

- ``sequential``: a chain rule sibling by sibling: ``walk`` (EAGLE-2/3, SGLang at 1/1),
  ``rrs`` (SpecInfer; Sequoia / RSD without replacement) and ``lift:SPEC`` (any chain rule).

SGLang's threshold rule on trees (``sglang-tree``) is an engine's rule: it lives beside
SGLang's chain rule in ``cactus_theory.engines`` and loads with the engines.
"""

from cactus_theory.core.trees.rules.sequential import (
    LiftedRule,
    RecursiveRejection,
    Walk,
    lift,
    rrs_acceptance,
    sibling_walk,
)

#: Registered when ``cactus_theory.core.trees`` is imported, in this order.
BUILTINS = (Walk, RecursiveRejection, LiftedRule)

__all__ = [
    "BUILTINS",
    "LiftedRule",
    "RecursiveRejection",
    "Walk",
    "lift",
    "rrs_acceptance",
    "sibling_walk",
]
