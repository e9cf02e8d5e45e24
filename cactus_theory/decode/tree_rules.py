"""Which tree rule a tree run walks with, and the checks a tree run needs before it starts.

``tree_rule(rule, scheme)``: a tree rule (``core.trees.base.TreeRule``) runs as given; a
chain rule (``rules.make`` / ``rules.parse`` or a spec string) runs as its sibling-by-
sibling lift, so chain and tree rules share one law engine (``core.trees``). The rule
must be defined for the drafting scheme.
"""

from __future__ import annotations

from cactus_theory.core.rules.base import Rule
from cactus_theory.core.trees.base import TreeRule
from cactus_theory.decode.checks import parse_rule


def tree_rule(rule: TreeRule | Rule | str, scheme: str) -> TreeRule:
    """The tree rule a tree run walks with (module docstring); ValueError naming ``rule``."""
    if isinstance(rule, str):
        rule = parse_rule(rule)
    if isinstance(rule, Rule):
        raise ValueError(
            f"rule: {rule.label} is a chain rule; lifting chain rules to trees needs "
            "cactus_theory.core.trees' lifting"
        )
    if not isinstance(rule, TreeRule):
        raise ValueError(f"rule: expected a rule or a tree rule, got {type(rule).__name__}")
    if scheme not in rule.schemes:
        raise ValueError(
            f"rule: {rule.label} is not defined for {scheme} children (it takes "
            f"{', '.join(rule.schemes)})"
        )
    return rule
