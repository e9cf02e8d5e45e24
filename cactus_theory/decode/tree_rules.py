"""Which tree rule a tree run walks with.

``tree_rule(rule, scheme)``: a tree rule (``trees.make`` / ``trees.parse``: ``walk``,
``rrs``, ``sglang-tree``, a registered plug-in) runs as given; a chain rule (``rules.make``
/ ``rules.parse``) runs as its sibling-by-sibling lift (``trees.lift``), so chain and tree
rules share one law engine: lifted SpS is the lossless walk for deterministic children and
recursive rejection sampling for sampled ones. A spec string names a tree rule when its
name is a registered tree rule, else a chain rule. The rule must be defined for the
drafting scheme.
"""

from __future__ import annotations

from cactus_theory.core import trees
from cactus_theory.core.rules.base import Rule
from cactus_theory.core.trees.base import TreeRule
from cactus_theory.decode.checks import parse_rule


def tree_rule(rule: TreeRule | Rule | str, scheme: str) -> TreeRule:
    """The tree rule a tree run walks with (module docstring); ValueError naming ``rule``."""
    if isinstance(rule, str):
        name = rule.partition(":")[0].strip()
        if name in trees.names():
            try:
                rule = trees.parse(rule)
            except ValueError as error:
                raise ValueError(f"rule: {error}") from None
        else:
            rule = parse_rule(rule)
    if isinstance(rule, Rule):
        rule = trees.lift(rule)
    if not isinstance(rule, TreeRule):
        raise ValueError(f"rule: expected a rule, a tree rule or a spec, got {type(rule).__name__}")
    if scheme not in rule.schemes:
        raise ValueError(
            f"rule: {rule.label} is not defined for {scheme} children (it takes "
            f"{', '.join(rule.schemes)})"
        )
    return rule
