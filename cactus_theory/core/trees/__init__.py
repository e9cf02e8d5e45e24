"""Trees and multi-draft verification, exact (numpy, float64; array API where declared).

>>> from cactus_theory import trees
>>> node = trees.Node(target=[0.5, 0.3, 0.2], draft=[0.2, 0.5, 0.3], children=[1, 2])
>>> round(trees.node_acceptance(trees.make("walk"), node), 12)  # q(S) = 0.3 + 0.2
0.5

- ``base``: one node (``Node``), how its children are drafted (``proposals``), the contract
  of a tree rule (``TreeRule``: ``sibling_accepts``, ``final_residual``) and the decisions a
  uniform makes at a node (``decide``);
- ``registry``: ``register``, ``make``, ``parse``, ``names``, ``spec_of`` (the chain rules'
  registry with a kind of its own: the same plug-ins and specs);
- ``law``: the exact node law and acceptance by enumeration over drafted tuples
  (``node_law``, ``node_acceptance``, ``node_divergence``, ``node_law_rows``);
- ``sample``: the numpy node sampler from uniforms (``sample_node``, ``verify_node``);
- ``optimum``: the lossless optimum α* (``optimal_acceptance``: cut, sort or lp);
- ``frontier``: the constrained frontier α*_{K,δ} (``frontier_acceptance``);
- ``sequences``: a whole tree of depth D (``tree_statistics``: E[accepted], KL per step);
- ``rules``: the built-in tree rules (``walk``, ``rrs``, ``lift:SPEC``, ...).
"""

from cactus_theory.core.trees.base import (
    DETERMINISTIC,
    HUB,
    SAMPLED,
    SCHEMES,
    WITH_REPLACEMENT,
    WITHOUT_REPLACEMENT,
    Node,
    TreeRule,
    conditional_law,
    decide,
    end_probs,
    hub_token,
    proposals,
)
from cactus_theory.core.trees.registry import (
    TREES,
    as_tree_rule,
    make,
    names,
    parse,
    register,
    rule_class,
    spec_of,
)
from cactus_theory.core.trees.registry import _register_builtins as _builtins

_builtins()

from cactus_theory.core.trees.frontier import (  # noqa: E402
    core_base,
    frontier_acceptance,
    frontier_rows,
    lexicographic_base,
)
from cactus_theory.core.trees.law import (  # noqa: E402
    NodeLaw,
    closed_form,
    drafted_tuples,
    enumerate_node,
    node_acceptance,
    node_divergence,
    node_law,
    node_law_rows,
    tuple_law,
)
from cactus_theory.core.trees.optimum import optimal_acceptance, sorted_optimum  # noqa: E402
from cactus_theory.core.trees.rules import (  # noqa: E402
    CactusRRS,
    CactusTree,
    KSeq,
    LiftedRule,
    MedusaTypical,
    OptimalVerifier,
    RecursiveRejection,
    SpecHub,
    Walk,
    lift,
    rrs_acceptance,
)
from cactus_theory.core.trees.sample import (  # noqa: E402
    NodeSample,
    draft_children,
    sample_node,
    verify_node,
)
from cactus_theory.core.trees.sequences import (  # noqa: E402
    TreeStats,
    parse_widths,
    predicted_length,
    top_children,
    tree_statistics,
)


def __getattr__(attribute: str):
    """``NAMES``: every registered tree rule name, read when asked (plug-ins included)."""
    if attribute == "NAMES":
        return names()
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


__all__ = [
    "DETERMINISTIC",
    "HUB",
    "NAMES",
    "SAMPLED",
    "SCHEMES",
    "TREES",
    "WITHOUT_REPLACEMENT",
    "WITH_REPLACEMENT",
    "CactusRRS",
    "CactusTree",
    "KSeq",
    "LiftedRule",
    "MedusaTypical",
    "OptimalVerifier",
    "SpecHub",
    "Node",
    "NodeLaw",
    "NodeSample",
    "RecursiveRejection",
    "TreeRule",
    "TreeStats",
    "Walk",
    "as_tree_rule",
    "closed_form",
    "conditional_law",
    "core_base",
    "decide",
    "draft_children",
    "drafted_tuples",
    "end_probs",
    "frontier_acceptance",
    "frontier_rows",
    "enumerate_node",
    "hub_token",
    "lexicographic_base",
    "lift",
    "make",
    "names",
    "node_acceptance",
    "node_divergence",
    "node_law",
    "node_law_rows",
    "optimal_acceptance",
    "sorted_optimum",
    "tuple_law",
    "parse",
    "parse_widths",
    "predicted_length",
    "proposals",
    "register",
    "rrs_acceptance",
    "rule_class",
    "sample_node",
    "spec_of",
    "top_children",
    "tree_statistics",
    "verify_node",
]
