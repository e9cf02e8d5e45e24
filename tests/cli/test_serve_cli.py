"""``cactus serve`` where vLLM may be missing: the command it would run, and one-line
errors (the server itself is tested in tests/vllm/test_vllm_server.py, in vLLM's
environment)."""

import pytest

from cactus_theory.cli import dispatch as cli


def vllm_installed() -> bool:
    try:
        from vllm import LLM  # noqa: F401
    except ImportError:
        return False
    return True


def test_print_command_needs_no_vllm(capsys):
    assert cli.main(["serve", "/tmp", "/tmp", "--rule", "sps", "--print-command"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("CACTUS_VLLM_RULE=sps ")
    assert "-m vllm.entrypoints.openai.api_server --model /tmp" in out


def test_bad_arguments_are_one_line_errors(capsys):
    assert cli.main(["serve", "/tmp", "/tmp", "--rule", "frontier:delta=-1"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("cactus serve: error: delta") and "\n" not in error
    assert cli.main(["serve", "/no/such/model", "/tmp"]) == 2
    assert "verifier: no such folder" in capsys.readouterr().err


@pytest.mark.skipif(vllm_installed(), reason="vLLM is installed")
def test_without_vllm_the_error_is_one_line(capsys):
    assert cli.main(["serve", "/tmp", "/tmp"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("cactus serve: error: vllm: not installed")
    assert "\n" not in error
