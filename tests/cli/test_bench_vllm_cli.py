"""``cactus bench vllm`` where vLLM is not installed: a one-line error, exit status 2
(the run itself is tested in tests/vllm/test_vllm_bench.py, in vLLM's environment)."""

import pytest

from cactus_theory.cli import dispatch as cli


def test_bad_flags_are_refused_before_vllm_is_needed(capsys):
    assert cli.main(["bench", "vllm", "--verifier", "v"]) == 2
    assert "verifier" in capsys.readouterr().err
    assert cli.main(["bench", "vllm", "--temperature", "0"]) == 2


def vllm_installed() -> bool:
    try:
        from vllm import LLM  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(vllm_installed(), reason="vLLM is installed")
def test_without_vllm_the_error_is_one_line(capsys):
    assert cli.main(["bench", "vllm"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("cactus bench vllm: error: vllm: not installed")
    assert "\n" not in error
