"""docs/trees.md and the README's trees section run as written: every Python block, and the
``cactus check`` command on the page."""

import re
from pathlib import Path

from cactus_theory.cli import dispatch

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "trees.md"


def blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", path.read_text(), flags=re.S)


def readme_tree_blocks() -> list[str]:
    """The README's Python blocks that use trees (its section on trees)."""
    return [block for block in blocks(ROOT / "README.md", "python") if "trees" in block]


def test_every_python_block_of_the_page_and_the_readme_runs(capsys):
    assert readme_tree_blocks(), "the README has a trees section with code"
    for block in blocks(DOC, "python") + readme_tree_blocks():
        exec(compile(block, str(DOC), "exec"), {})
    assert "check_rule(half-walk): passed" in capsys.readouterr().out


def test_the_check_command_on_the_page_passes(capsys):
    (command,) = [line for line in blocks(DOC, "bash")[0].splitlines() if "cactus check" in line]
    assert dispatch.main(command.split()[1:]) == 0
    out = capsys.readouterr().out
    assert "check_rule(walk): passed" in out
    assert "check_rule(sglang-tree:threshold_single=1.0,threshold_acc=0.5): passed" in out
