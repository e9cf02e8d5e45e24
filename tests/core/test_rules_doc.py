"""docs/rules.md runs as written: its rule module, every Python block, and its
``cactus check`` command (the worked example of "Write your own rule")."""

import re
import sys
from pathlib import Path

import pytest

from cactus_theory import rules
from cactus_theory.cli import dispatch

DOC = Path(__file__).resolve().parents[2] / "docs" / "rules.md"


def blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.fixture
def my_rules(tmp_path, monkeypatch):
    """The page's first block saved as my_rules.py, importable, the registry restored."""
    (tmp_path / "my_rules.py").write_text(blocks("python")[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    rules.REGISTRY.pop("scaled-cactus", None)
    for name in [name for name in sys.modules if name == "my_rules"]:
        del sys.modules[name]


def test_the_example_rule_is_at_most_30_lines_of_code():
    code = [
        line
        for line in blocks("python")[0].splitlines()
        if line.strip() and not line.strip().startswith(("#", '"""'))
    ]
    assert len(code) <= 30, len(code)


def test_every_python_block_runs(my_rules):
    namespace: dict = {}
    for block in blocks("python")[1:]:  # the first is my_rules.py, imported by the second
        if "@parametrize_with_rule_checks" in block:
            block += "\nfor params in test_scaled_cactus.pytestmark[0].args[1][:3]:\n"
            block += "    params[1](params[0])\n"
        exec(compile(block, str(DOC), "exec"), namespace)
    assert "scaled-cactus" in rules.NAMES
    assert namespace["report"].passed


def test_the_check_command_on_the_page_passes(my_rules, capsys):
    (command,) = [line for line in blocks("bash")[0].splitlines() if "cactus check" in line]
    arguments = command.split()[1:] + ["--examples", "15"]
    rules.REGISTRY.pop("scaled-cactus", None)  # the command loads the module itself
    sys.modules.pop("my_rules", None)
    assert dispatch.main(arguments) == 0, capsys.readouterr().out
    assert "check_rule(scaled-cactus:delta=1.0): passed" in capsys.readouterr().out
