"""The tree-rule registry: the chain rules' registry (``core.rules.registry``) with a kind of
its own, so names, typed specs, plug-ins and their discovery work exactly as for chain
rules.

- ``register(cls)``: add a ``TreeRule`` subclass under ``cls.name`` (the same checks as
  ``rules.register``: a concrete class, a valid name, named parameters, no clash);
- ``make(name, **params)``, ``parse("name:key=value,...")``, ``spec_of(rule)``, ``names()``;
- plug-ins: the same discovery as chain rules (the entry-point group ``cactus_theory.rules``,
  ``CACTUS_RULES_MODULES``, ``--rules-module``): a plug-in module may register chain rules
  and tree rules, and an entry point may name a ``TreeRule`` subclass;
- ``lift``: the spec ``"lift:SPEC"`` lifts the chain rule ``SPEC`` sibling by sibling
  (``core.trees.rules.lift``), e.g. ``parse("lift:cactus:delta=0.5")``.

Built-in tree rules (``BUILTINS``) are registered when this module is imported; the
engines' tree rules (SGLang's ``sglang-tree``) load with the engines at discovery.
"""

from __future__ import annotations

from typing import Any

from cactus_theory.core.rules import registry as _registry
from cactus_theory.core.trees.base import TreeRule

#: The kind the tree rules are registered under.
TREES = _registry.add_kind(_registry.Kind("tree rule", TreeRule, "trees.TreeRule"))


def register(cls: type[TreeRule], *, provider: str | None = None) -> type[TreeRule]:
    """Add the tree rule class ``cls`` under ``cls.name``; returns ``cls`` (a decorator).
    ValueError as for ``rules.register``."""
    return _registry.register(cls, provider=provider, kind=TREES)


def names() -> tuple[str, ...]:
    """Every registered tree rule name (built-ins first), after discovery."""
    return _registry.names(TREES)


def rule_class(name: str) -> type[TreeRule]:
    """The tree rule class registered as ``name`` (ValueError listing the names)."""
    return _registry.rule_class(name, TREES)


def make(name: str, **params: Any) -> TreeRule:
    """The tree rule ``name`` with its parameters, e.g. ``make("cactus-tree", delta=1.0)``."""
    return _registry.make_kind(TREES, name, params)


def parse(spec: str) -> TreeRule:
    """A tree rule from ``name`` or ``name:key=value,...`` (``"lift:SPEC"`` lifts a chain
    rule); values are converted to their parameters' declared types."""
    return _registry.parse_kind(TREES, spec)


def spec_of(rule: TreeRule) -> str:
    """The string ``parse`` accepts for ``rule``."""
    if not isinstance(rule, TreeRule):
        raise ValueError(f"rule: expected a tree rule, got {type(rule).__name__}")
    return _registry.spec_of(rule)  # type: ignore[arg-type]


def as_tree_rule(rule: object) -> TreeRule:
    """``rule`` itself, or the tree rule a spec string names (ValueError otherwise)."""
    if isinstance(rule, str):
        return parse(rule)
    if not isinstance(rule, TreeRule):
        raise ValueError(
            f"rule: expected a tree rule from trees.make(...) or a spec, got {type(rule).__name__}"
        )
    return rule


def _register_builtins() -> None:
    from cactus_theory.core.trees.rules import BUILTINS

    for cls in BUILTINS:
        register(cls)
    TREES.builtin.update(TREES.registry)
