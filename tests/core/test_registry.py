"""The rule registry: register, discovery (bundled, entry points, CACTUS_RULES_MODULES,
--rules-module), typed specs, and what a spec may never do (import code)."""

import importlib.metadata
import sys
import textwrap
import warnings

import numpy as np
import pytest

from cactus_theory import law, rules
from cactus_theory.core.rules import registry

BUILTINS = ("sps", "cactus", "cactus-exact", "frontier", "pareto", "interp", "tas", "topk")
ENGINES = ("sglang", "relaxed", "relaxed-ratio")


class Doubling(rules.TargetRule):
    """h = q: a registered test rule (lossless) with typed parameters of every kind."""

    name = "test-doubling"

    def __init__(self, width: int = 2, scale: float = 1.0, mode: str = "a", flag: bool = False):
        self.width, self.scale, self.mode, self.flag = width, scale, mode, flag

    def params(self):
        return {"width": self.width, "scale": self.scale, "mode": self.mode, "flag": self.flag}

    def target_law(self, target_probs, draft_probs):
        return target_probs


@pytest.fixture
def clean_registry():
    """Registry state restored after the test (names a test adds are removed)."""
    before = dict(registry.REGISTRY)
    yield
    for name in set(registry.REGISTRY) - set(before):
        del registry.REGISTRY[name]


def test_builtins_and_engines_are_registered():
    assert set(BUILTINS + ("greedy",) + ENGINES) <= set(rules.NAMES)
    assert rules.NAMES[:9] == BUILTINS + ("greedy",)


def test_register_makes_a_rule_known_everywhere(clean_registry):
    assert "test-doubling" not in rules.NAMES
    assert rules.register(Doubling) is Doubling
    assert "test-doubling" in rules.NAMES  # NAMES is read from the registry, never stale
    rule = rules.parse("test-doubling:width=3,scale=2,mode=b,flag=true")
    assert rule.params() == {"width": 3, "scale": 2.0, "mode": "b", "flag": True}
    assert isinstance(rule.params()["width"], int)  # parse honours the declared types
    assert rules.parse(rules.spec_of(rule)) == rule
    assert rules.make("test-doubling", width=5).width == 5
    rules.register(Doubling)  # the same class again: nothing happens


def test_register_refuses_what_it_cannot_serve(clean_registry):
    class Taken(rules.TargetRule):
        name = "cactus"

        def target_law(self, target_probs, draft_probs):
            return target_probs

    with pytest.raises(ValueError, match="^name: rule 'cactus' is already registered"):
        rules.register(Taken)

    class Abstract(rules.BranchRule.__base__):  # Rule itself: abstract methods missing
        name = "test-abstract"

    with pytest.raises(ValueError, match="^cls: Abstract is abstract"):
        rules.register(Abstract)

    class Splat(Doubling):
        name = "test-splat"

        def __init__(self, *args):
            pass

    with pytest.raises(ValueError, match="^cls: Splat.__init__ takes \\*args"):
        rules.register(Splat)

    class BadName(Doubling):
        name = "has:colon"

    with pytest.raises(ValueError, match="^cls: BadName.name"):
        rules.register(BadName)
    with pytest.raises(ValueError, match="^cls: expected a subclass of rules.Rule"):
        rules.register(int)


def test_typed_parse_errors_name_the_parameter(clean_registry):
    rules.register(Doubling)
    with pytest.raises(ValueError, match="^width: expected an integer"):
        rules.parse("test-doubling:width=2.5")
    with pytest.raises(ValueError, match="^flag: expected true or false"):
        rules.parse("test-doubling:flag=maybe")
    with pytest.raises(ValueError, match="^top_k: expected an integer"):
        rules.parse("relaxed:top_k=1.5")
    assert rules.parse("relaxed:top_k=3,delta=0.2").top_k == 3


@pytest.mark.parametrize(
    "spec", ["os", "os:system=1", "cactus_theory.engines.sglang", "subprocess.run", "../x"]
)
def test_a_spec_never_imports_code(spec):
    """Names are looked up in the registry only: a module name is an unknown rule."""
    loaded = set(sys.modules)
    with pytest.raises(ValueError, match="^(name: unknown rule|spec:)"):
        rules.parse(spec)
    assert set(sys.modules) == loaded


def write_module(folder, name, body):
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


RULE_MODULE = """
    from cactus_theory import rules

    class Local(rules.DecisionRule):
        name = "{name}"

        def accept_mask(self, target_probs):
            return target_probs > 0.5

        def recovery(self, target_probs):
            return target_probs

    rules.register(Local)
"""


def test_load_modules_by_path_and_by_name(tmp_path, monkeypatch, clean_registry):
    path = write_module(tmp_path, "local_rules_a", RULE_MODULE.format(name="test-local-a"))
    assert rules.load_modules([str(path)]) == ["test-local-a"]
    write_module(tmp_path, "local_rules_b", RULE_MODULE.format(name="test-local-b"))
    monkeypatch.chdir(tmp_path)  # the console script's cwd is not on sys.path
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert rules.load_modules(["local_rules_b"]) == ["test-local-b"]
    with pytest.raises(ValueError, match="^rules_module: could not import rules module 'nope'"):
        rules.load_modules(["nope"])
    broken = write_module(tmp_path, "broken_rules", "raise RuntimeError('boom')\n")
    with pytest.raises(ValueError, match="RuntimeError: boom"):
        rules.load_modules([str(broken)])


def test_load_modules_exports_to_child_processes(tmp_path, monkeypatch, clean_registry):
    monkeypatch.delenv(rules.ENV_MODULES, raising=False)
    path = write_module(tmp_path, "exported_rules", RULE_MODULE.format(name="test-exported"))
    rules.load_modules([str(path)], export=True)
    import os

    assert os.environ[rules.ENV_MODULES] == str(path.resolve())


def test_discovery_reads_the_environment_and_entry_points(tmp_path, monkeypatch, clean_registry):
    path = write_module(tmp_path, "env_rules", RULE_MODULE.format(name="test-env"))
    monkeypatch.setenv(rules.ENV_MODULES, str(path))

    class EntryPoint:
        def __init__(self, name, load):
            self.name, self.value, self.load = name, f"pkg:{name}", load

    def entry_points(group):
        assert group == rules.ENTRY_POINT_GROUP
        return [
            EntryPoint("doubling", lambda: Doubling),
            EntryPoint("broken", lambda: (_ for _ in ()).throw(ImportError("no such pkg"))),
            EntryPoint("clash", lambda: type("Clash", (Doubling,), {"name": "cactus"})),
        ]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rules.refresh()
    assert {"test-env", "test-doubling"} <= set(rules.NAMES)
    assert set(ENGINES) <= set(rules.NAMES)
    messages = [str(item.message) for item in caught]
    assert any("broken" in text and "no such pkg" in text for text in messages)
    # A plug-in never shadows a registered name: the clash warns, cactus stays cactus.
    assert any("clash" in text and "already registered" in text for text in messages)
    assert type(rules.make("cactus", delta=1.0)).__module__ == "cactus_theory.core.rules.cactus"
    monkeypatch.undo()
    rules.refresh()
    assert "test-env" not in rules.NAMES and "sglang" in rules.NAMES


def test_with_params_keeps_the_rest_and_names_unknown_keys():
    rule = rules.parse("tas:epsilon=0.2,alpha=0.1")
    assert rule.with_params(epsilon=0.3).params() == {"epsilon": 0.3, "alpha": 0.1}
    with pytest.raises(ValueError, match="^delta: not a parameter of rule 'tas'"):
        rule.with_params(delta=1.0)


def test_family_subclasses_that_override_derived_methods_take_the_general_path():
    """A TargetRule whose accept_probs is its own: the law sums its own methods."""

    class Halved(rules.TargetRule):
        name = "test-halved"

        def target_law(self, target_probs, draft_probs):
            return target_probs

        def accept_probs(self, target_probs, draft_probs):
            return 0.5 * super().accept_probs(target_probs, draft_probs)

    rule = Halved()
    assert rules.exact_family(rule) == "general"
    assert rules.exact_family(rules.make("sps")) == "target"
    target, draft = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.2, 0.6])
    np.testing.assert_allclose(
        law.output_law(rule, target, draft),
        law.output_law_enumerated(rule, target, draft),
        atol=1e-15,
    )
    # Negative control: the target family's closed form (= h = q) is not this rule's law.
    assert (
        np.abs(law.target_rule_law(target, draft) - law.output_law(rule, target, draft)).max()
        > 0.01
    )


def test_a_rule_with_parameters_and_no_params_is_refused(clean_registry):
    """Without params() every instance would be equal: one spec, label and hash."""

    class NoParams(rules.TargetRule):
        name = "test-no-params"

        def __init__(self, beta: float = 0.3) -> None:
            self.beta = beta

        def target_law(self, target_probs, draft_probs):
            return target_probs

    with pytest.raises(ValueError, match=r"^cls: NoParams.__init__ takes parameters \(beta\)"):
        rules.register(NoParams)
    with pytest.raises(ValueError, match=r"define params\(\)"):
        rules.register(NoParams)
    assert "test-no-params" not in registry.REGISTRY

    class NoParamsAtAll(rules.TargetRule):  # nothing to declare: accepted
        name = "test-no-params-at-all"

        def target_law(self, target_probs, draft_probs):
            return target_probs

    rules.register(NoParamsAtAll)


def test_make_converts_strings_as_parse_does(clean_registry):
    rules.register(Doubling)
    made = rules.make("test-doubling", width="3", scale=" 2 ", mode="b", flag="true")
    assert made == rules.parse("test-doubling:width=3,scale=2,mode=b,flag=true")
    assert made.params() == {"width": 3, "scale": 2.0, "mode": "b", "flag": True}
    assert rules.make("cactus", delta="0.5") == rules.make("cactus", delta=0.5)
    with pytest.raises(ValueError, match="^width: expected an integer, got '2.5'"):
        rules.make("test-doubling", width="2.5")
    with pytest.raises(ValueError, match="^delta: expected a number, got 'half'"):
        rules.make("cactus", delta="half")
    # parse still names the spec the value came from
    with pytest.raises(ValueError, match="^delta: expected a number in 'cactus:delta=x'"):
        rules.parse("cactus:delta=x")


def test_a_rules_file_imports_a_module_beside_it(tmp_path, monkeypatch, clean_registry):
    """``--rules-module path/to/file.py`` runs the file with its folder on sys.path (and
    so does a child process reading CACTUS_RULES_MODULES); sys.path is restored."""
    folder = tmp_path / "mine"
    folder.mkdir()
    write_module(folder, "rule_helpers", "THRESHOLD = 0.5\n")
    header = "from cactus_theory import rules"
    body = RULE_MODULE.format(name="test-beside").replace(
        header, header + "\n    import rule_helpers"
    )
    path = write_module(folder, "beside_rules", body.replace("0.5", "rule_helpers.THRESHOLD"))
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    assert rules.load_modules([str(path)]) == ["test-beside"]
    assert sys.path == before
    # a child process finds the file through the environment, from another folder
    import os
    import subprocess
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    child = subprocess.run(
        [sys.executable, "-c", "from cactus_theory import rules; print(rules.names()[-1])"],
        env={**os.environ, rules.ENV_MODULES: str(path), "PYTHONPATH": root},
        cwd=os.path.dirname(root), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert child.stdout.strip() == "test-beside", child.stderr[-2000:]


def test_an_unknown_rule_suggests_names_and_how_to_add_ones_own():
    with pytest.raises(ValueError) as caught:
        rules.parse("cactus-exakt:delta=1")
    message = str(caught.value)
    assert message.startswith("name: unknown rule 'cactus-exakt' (did you mean 'cactus-exact'")
    assert "--rules-module path/to/file.py" in message and rules.ENV_MODULES in message
    assert "registered: sps, cactus, cactus-exact" in message
    with pytest.raises(ValueError, match=r"^name: unknown rule 'zzz'; registered: "):
        rules.parse("zzz")
