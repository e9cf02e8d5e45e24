"""``cactus bench vllm`` end to end on its default tiny pair (small settings)."""

import json

import pytest

pytest.importorskip(
    "vllm.v1.sample.rejection_sampler",
    reason="vLLM is not installed here (scripts/test.sh runs tests/vllm)",
)

from cactus_theory.cli import dispatch as cli  # noqa: E402


def test_bench_vllm_prints_and_writes_the_table(tmp_path, capsys):
    path = tmp_path / "bench.json"
    words = ["bench", "vllm", "--tiny", "--rule", "cactus:delta=1.0", "--num-prompts", "4"]
    words += ["--max-new-tokens", "16", "--repeats", "1", "--json", str(path)]
    assert cli.main(words) == 0
    table = json.loads(path.read_text())
    rows = {row["rule"]: row for row in table["rows"]}
    assert set(rows) == {"vllm", "cactus:delta=1.0"}
    assert rows["vllm"]["kl_per_token"] is None and rows["vllm"]["speedup"] == 1.0
    assert rows["cactus:delta=1.0"]["kl_per_token"] > 0
    assert rows["cactus:delta=1.0"]["accepted_length"] > rows["vllm"]["accepted_length"]
    assert "tiny random pair" in table["pair"]
    assert "cactus:delta=1.0" in capsys.readouterr().out
