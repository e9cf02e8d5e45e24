"""The tree-rule registry: the chain registry's machinery with a kind of its own (names,
typed specs, plug-ins that register both kinds, lift specs)."""

import textwrap

import numpy as np
import pytest

from cactus_theory import rules, trees
from cactus_theory.core.rules import registry


class Halved(trees.TreeRule):
    """Accept each child with probability a/2 (a test rule with typed parameters)."""

    name = "test-halved"
    array_api = True

    def __init__(self, scale: float = 0.5, repeats: int = 1, note: str = "x") -> None:
        self.scale, self.repeats, self.note = scale, repeats, note

    def params(self):
        return {"scale": self.scale, "repeats": self.repeats, "note": self.note}

    def sibling_accepts(self, target_probs, proposals, children):
        return self.scale * np.take_along_axis(target_probs, children, axis=-1)

    def final_residual(self, target_probs, proposals, children):
        return target_probs


@pytest.fixture
def clean():
    before = {id(kind): dict(kind.registry) for kind in registry.KINDS}
    yield
    for kind in registry.KINDS:
        for name in set(kind.registry) - set(before[id(kind)]):
            del kind.registry[name]


def test_builtins_are_registered_in_their_own_kind():
    assert trees.names()[:3] == ("walk", "rrs", "lift")
    assert "sglang-tree" in trees.NAMES  # the engines' tree rule, loaded at discovery
    assert "walk" not in rules.NAMES and "sps" not in trees.NAMES


def test_register_make_parse_and_spec_round_trip(clean):
    assert trees.register(Halved) is Halved
    rule = trees.parse("test-halved:scale=0.25,repeats=3,note=y")
    assert rule.params() == {"scale": 0.25, "repeats": 3, "note": "y"}
    assert isinstance(rule.params()["repeats"], int)
    assert trees.parse(trees.spec_of(rule)) == rule
    assert trees.make("test-halved", scale=0.1).scale == 0.1
    trees.register(Halved)  # again: nothing happens
    with pytest.raises(ValueError, match="^bogus: not a parameter of tree rule 'test-halved'"):
        trees.make("test-halved", bogus=1)
    with pytest.raises(ValueError, match="^repeats: expected an integer"):
        trees.parse("test-halved:repeats=x")


def test_each_kind_refuses_the_other(clean):
    with pytest.raises(ValueError, match=r"^cls: expected a subclass of trees.TreeRule"):
        trees.register(rules.SpS)
    with pytest.raises(ValueError, match=r"^cls: expected a subclass of rules.Rule"):
        rules.register(Halved)

    class Clash(Halved):
        name = "walk"

    with pytest.raises(ValueError, match="^name: tree rule 'walk' is already registered"):
        trees.register(Clash)


def test_lift_specs_carry_a_whole_chain_spec():
    rule = trees.parse("lift:sglang:threshold_single=0.5,threshold_acc=0.25")
    assert rule.chain == rules.make("sglang", threshold_single=0.5, threshold_acc=0.25)
    assert trees.spec_of(rule) == "lift:sglang:threshold_single=0.5,threshold_acc=0.25"
    assert trees.parse("lift") == trees.lift("sps")
    assert trees.make("lift", rule="cactus:delta=2") == trees.lift(rules.make("cactus", delta=2))
    with pytest.raises(ValueError, match="^name: unknown rule 'nope'"):
        trees.parse("lift:nope")


def test_a_plugin_module_registers_both_kinds(tmp_path, clean):
    module = tmp_path / "both_kinds.py"
    module.write_text(
        textwrap.dedent(
            """
            from cactus_theory import rules, trees

            class Half(rules.TargetRule):
                name = "test-plugin-chain"
                def target_law(self, target_probs, draft_probs):
                    return target_probs

            class HalfTree(trees.Walk):
                name = "test-plugin-tree"

            rules.register(Half)
            trees.register(HalfTree)
            """
        )
    )
    added = rules.load_modules([str(module)], argument="rules_module")
    assert set(added) == {"test-plugin-chain", "test-plugin-tree"}
    assert "test-plugin-tree" in trees.names() and "test-plugin-chain" in rules.names()
    registry.refresh()  # forgets plug-ins; the module is not in CACTUS_RULES_MODULES
    assert "test-plugin-tree" not in trees.names()
    rules.load_modules([str(module)], argument="rules_module")  # recorded: registered again
    assert "test-plugin-tree" in trees.names()
