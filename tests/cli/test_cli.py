"""The ``cactus`` command line: dispatch, help text, errors and exit codes."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from cactus_theory.cli import dispatch as cli


def all_commands():
    for name, spec in cli.COMMANDS.items():
        if isinstance(spec, cli.Group):
            for member, command in spec.members.items():
                yield (name, member), command
        else:
            yield (name,), spec


@pytest.mark.parametrize(("words", "command"), list(all_commands()), ids=lambda x: str(x))
def test_every_command_module_exists_with_configure_and_run(words, command):
    module = importlib.import_module(command.module)
    assert callable(module.configure) and callable(module.run)
    parser = cli.build_parser(list(words))
    # --help of each command works and exits 0.
    with pytest.raises(SystemExit) as stop:
        parser.parse_args([*words, "--help"])
    assert stop.value.code == 0


def test_the_cli_package_lists_every_command_with_its_module():
    """``cactus_theory.cli``'s docstring names each command and the module that holds it,
    so a reader finds the half of the CLI that lives in paper_figs, proofs_check and sims."""
    import cactus_theory.cli

    lines = cactus_theory.cli.__doc__.splitlines()
    for words, command in all_commands():
        entry = f"``cactus {' '.join(words)}``: ``{command.module}``"
        assert any(line.startswith(f"- {entry}") for line in lines), entry
    listed = [line for line in lines if line.startswith("- ``cactus ")]
    assert len(listed) == len(list(all_commands()))  # and nothing that is not a command


def test_top_level_help_lists_every_command():
    result = subprocess.run(
        [sys.executable, "-m", "cactus_theory.cli", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0
    for name in cli.COMMANDS:
        assert name in result.stdout


def test_bench_law_runs_and_writes_json(tmp_path, capsys):
    path = tmp_path / "law.json"
    code = cli.main(
        [
            "bench",
            "law",
            "--batch",
            "200",
            "--vocab",
            "8",
            "--repeats",
            "1",
            "--reference-batch",
            "3",
            "--rule",
            "cactus:delta=0.5",
            "--rule",
            "frontier:delta=0.1",
            "--json",
            str(path),
        ]
    )
    assert code == 0
    rows = json.loads(path.read_text())["rows"]
    assert [row["rule"] for row in rows] == ["cactus(δ=0.5)", "frontier(δ=0.1)"]
    assert all(row["max_abs_disagreement"] < 1e-12 for row in rows)
    assert "instances/s" in capsys.readouterr().out


def test_bad_input_is_a_clean_error_with_exit_code_2(capsys):
    code = cli.main(["bench", "law", "--rule", "cactus:delta=-1", "--batch", "10"])
    assert code == 2
    assert "delta: must be >= 0" in capsys.readouterr().err
