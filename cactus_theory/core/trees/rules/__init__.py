"""The built-in tree rules, one concept per file (each docstring names the engine or paper
it follows):

- ``sequential``: a chain rule sibling by sibling: ``walk`` (EAGLE-2/3, SGLang at 1/1),
  ``rrs`` (SpecInfer; Sequoia / RSD without replacement) and ``lift:SPEC`` (any chain rule);
- ``spectr``: ``k-seq``, SpecTr's K-SEQ at its best division factor (i.i.d. children);
- ``spechub``: ``spechub``, SpecHub's verification of its hub pairs;
- ``optimal``: ``optimal``, a verifier attaining the lossless optimum α* (Khisti et al.);
- ``cactus``: ``cactus-tree`` and ``cactus-rrs``, Cactus's tilt toward the children;
- ``typical``: ``medusa-typical``, Medusa's typical acceptance on a node.

SGLang's threshold rule on trees (``sglang-tree``) is an engine's rule: it lives beside
SGLang's chain rule in ``cactus_theory.engines`` and loads with the engines.
"""

from cactus_theory.core.trees.rules.cactus import CactusRRS, CactusTree, set_tilt
from cactus_theory.core.trees.rules.optimal import OptimalVerifier
from cactus_theory.core.trees.rules.sequential import (
    LiftedRule,
    RecursiveRejection,
    Walk,
    lift,
    rrs_acceptance,
    sibling_walk,
)
from cactus_theory.core.trees.rules.spechub import SpecHub
from cactus_theory.core.trees.rules.spectr import KSeq, division_factor
from cactus_theory.core.trees.rules.typical import MedusaTypical

#: Registered when ``cactus_theory.core.trees`` is imported, in this order.
BUILTINS = (
    Walk,
    RecursiveRejection,
    LiftedRule,
    KSeq,
    SpecHub,
    OptimalVerifier,
    CactusTree,
    CactusRRS,
    MedusaTypical,
)

__all__ = [
    "BUILTINS",
    "CactusRRS",
    "CactusTree",
    "KSeq",
    "LiftedRule",
    "MedusaTypical",
    "OptimalVerifier",
    "RecursiveRejection",
    "SpecHub",
    "Walk",
    "division_factor",
    "lift",
    "rrs_acceptance",
    "set_tilt",
    "sibling_walk",
]
