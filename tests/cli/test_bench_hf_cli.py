"""``cactus bench hf`` end to end on a tiny saved pair (no timed assertions): its tables,
the greedy check that every config emits plain generate()'s tokens, the measurement of
how often transformers applies the processors to the assistant, and clean argument errors.
"""

import json

import pytest
from tiny_pair import save_model

from cactus_theory.cli import dispatch as cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    import torch_tiny_models as tiny

    root = tmp_path_factory.mktemp("hf-pair")
    tokenizer = tiny.chatml_tokenizer()
    prompts = root / "prompts.jsonl"
    prompts.write_text('"Say hi."\n"Count to three."\n"Name a colour."\n')
    return [
        "--verifier",
        save_model(root / "verifier", tokenizer, len(tokenizer), 0, 2),
        "--draft",
        save_model(root / "draft", tokenizer, len(tokenizer), 1, 1),
        "--prompts",
        str(prompts),
    ]


def test_a_small_run_gives_both_tables(pair, capsys, tmp_path):
    out = tmp_path / "bench.json"
    arguments = ["--repeats", "2", "--num-prompts", "3", "--max-new-tokens", "5"]
    arguments += ["--batch-size", "2", "--dtype", "float32", "-k", "2", "--json", str(out)]
    assert cli.main(["bench", "hf", *pair, *arguments]) == 0
    printed = capsys.readouterr().out
    assert "custom, T=0.6, top-k 20, top-p 0.95" in printed
    assert "custom, greedy" in printed
    assert "greedy: every config emitted the plain generate() tokens" in printed
    result = json.loads(out.read_text())
    tables = {table["setting"]: table for table in result["tables"]}
    assert set(tables) == {"sampled", "greedy"}
    for table in tables.values():
        labels = [row["config"] for row in table["rows"]]
        assert labels == ["plain", "theirs", "sps", "sps hf", "cactus δ=1 hf", "sps hf b2"]
        for row in table["rows"]:
            assert 0.0 <= row["acceptance_length"] <= 2.0
            assert row["rounds_agree"]  # reseeded: every round emits the same tokens
            assert row["tokens"] == 15  # 3 prompts x 5 tokens (the tiny pair never emits EOS)
        assert "standalone: sps / theirs" in table["comparisons"]
        assert "standalone: sps hf / sps (generate() / direct)" in table["comparisons"]
    assert tables["greedy"]["greedy_differs"] == []
    # How often the assistant's draft law went through the processors: exactly one count
    # reproduces it (transformers 5.17-5.25 apply them twice).
    applied = result["assistant_processors"]["custom"]
    assert min(applied.values()) < 1e-6 < max(applied.values())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--repeats", "0"], "repeats: must be >= 1"),
        (["--num-prompts", "0"], "num-prompts: must be >= 1"),
        (["-k", "0"], "k: must be >= 1"),
        (["--threads", "0"], "threads: must be >= 1"),
    ],
)
def test_argument_errors_are_one_line(pair, capsys, extra, message):
    assert cli.main(["bench", "hf", *pair, *extra]) == 2
    error = capsys.readouterr().err.strip()
    assert error == f"cactus bench hf: error: {message}, got 0"


def test_a_partial_custom_pair_is_an_error(pair, capsys):
    assert cli.main(["bench", "hf", *pair[:2]]) == 2
    assert "give --verifier, --draft and --prompts together" in capsys.readouterr().err
