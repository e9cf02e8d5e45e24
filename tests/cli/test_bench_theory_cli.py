"""``cactus bench theory`` and ``cactus bench pool`` end to end on tiny random checkpoints.

A tiny Llama verifier and a perturbed copy as its draft, with a character-level ChatML
tokenizer, are saved with ``save_pretrained`` into a temporary folder and loaded back by
path, as users do; ``CACTUS_CACHE`` points at a temporary folder.
"""

import json

import pytest
import torch
import torch_tiny_models as tiny

from cactus_theory.cli import bench_pool
from cactus_theory.cli import dispatch as cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    tokenizer = tiny.chatml_tokenizer()
    verifier = tiny.llama(seed=0, vocab=99, dtype=torch.float32, init=0.2)
    draft = tiny.perturbed(verifier, scale=0.3)
    for name, model in (("verifier", verifier), ("draft", draft)):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    prompts = root / "prompts.txt"
    prompts.write_text("Hi\nWhat is 2+2?\nName a colour.\nSpell cat\n")
    other = root / "other.txt"
    other.write_text("Say yes\nCount to three\nabc\nWhy?\n")
    return {
        "verifier": str(root / "verifier"),
        "draft": str(root / "draft"),
        "prompts": str(prompts),
        "other": str(other),
    }


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("CACTUS_CACHE", str(folder))
    return folder


def theory_args(checkpoints, *extra):
    return [
        "bench",
        "theory",
        "--verifier",
        checkpoints["verifier"],
        "--draft",
        checkpoints["draft"],
        "--num-prompts",
        "4",
        "--max-new-tokens",
        "12",
        "--batch-size",
        "2",
        *extra,
    ]


def test_bench_theory_writes_rows_and_caches(checkpoints, cache, capsys, tmp_path):
    out = tmp_path / "theory.json"
    arguments = theory_args(
        checkpoints,
        "--dataset",
        checkpoints["prompts"],
        "--dataset",
        checkpoints["other"],
        "--rule",
        "sps",
        "--rule",
        "cactus:delta=1",
        "-k",
        "2",
        "--json",
        str(out),
    )
    assert cli.main(arguments) == 0
    printed = capsys.readouterr().out
    assert "pool α" in printed and "measured α₁" in printed and "α sim." in printed
    result = json.loads(out.read_text())
    assert [(row["dataset"], row["rule"]) for row in result["rows"]] == [
        (checkpoints["prompts"], "sps"),
        (checkpoints["prompts"], "cactus:delta=1.0"),
        (checkpoints["other"], "sps"),
        (checkpoints["other"], "cactus:delta=1.0"),
    ]
    for row in result["rows"]:
        assert row["k"] == 2 and row["prompts"] == 4
        assert 0 <= row["pool_alpha"] <= 1 and 0 <= row["measured_alpha"] <= 1
        assert len(row["alpha_by_position"]) == 2
        assert row["measured_al"] <= 2
        assert 0 <= row["pool_alpha_simulated_starts"] <= 1
    assert result["settings"]["num_prompts"] == 4
    decodes = sorted(cache.glob("theory/decode-*/batch-*.npz"))
    assert len(decodes) == 4 * 2  # 2 datasets x 2 rules x 2 batches
    assert list(cache.glob("theory/pools/pool-*/shard-*.npz"))
    # a rerun reads everything back and prints the same rows
    stamps = [path.stat().st_mtime_ns for path in decodes]
    assert cli.main(arguments) == 0
    assert [path.stat().st_mtime_ns for path in decodes] == stamps
    assert json.loads(out.read_text())["rows"] == result["rows"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-k", "0"], "k: must be"),
        (["--num-prompts", "0"], "num_prompts: must be"),
        (["--rule", "nonsense"], "nonsense"),
        (["--dataset", "X", "--dataset", "X"], "dataset: named twice"),
        (["--dataset", "no-such-set"], "dataset:"),
        (["--temperature", "0"], "temperature:"),
    ],
)
def test_bench_theory_errors_are_one_line(checkpoints, cache, capsys, extra, message):
    assert cli.main(theory_args(checkpoints, *extra)) == 2
    error = capsys.readouterr().err
    assert error.startswith("cactus bench theory: error:") and message in error
    assert len(error.strip().splitlines()) == 1


def test_bench_pool_times_both_dtypes_and_the_statistics(checkpoints, cache, capsys, tmp_path):
    out = tmp_path / "pool.json"
    arguments = [
        "bench",
        "pool",
        "--verifier",
        checkpoints["verifier"],
        "--draft",
        checkpoints["draft"],
        "--dataset",
        checkpoints["prompts"],
        "--rounds",
        "2",
        "--num-prompts",
        "2",
        "--max-new-tokens",
        "6",
        "--stats-positions",
        "5",
        "--json",
        str(out),
    ]
    assert cli.main([*arguments, "--no-stats"]) == 0
    result = json.loads(out.read_text())
    assert set(result["builds"]) == {"float32", "bfloat16"}
    assert all(len(builds) == 2 for builds in result["builds"].values())
    ratio = result["summary"]["bfloat16"]["total_ratio"]
    assert ratio["low"] <= ratio["median"] <= ratio["high"]
    assert "stats" not in result
    # the arithmetic: 2 FLOPs per parameter per token read, context tokens per position
    compute = result["compute"]
    per_position = 2 * compute["parameters"] / 1e9 * result["context_tokens_per_position"]
    rate = result["summary"]["float32"]["generation"]
    assert compute["gflops"]["float32"]["generation"] == pytest.approx(rate * per_position)
    assert compute["needed_for_1000"] == pytest.approx(2000 * per_position)
    assert "bfloat16 / float32" in capsys.readouterr().out

    with_stats = [*arguments, "--stats-dataset", checkpoints["other"], "--dtype", "float32"]
    assert cli.main(with_stats) == 0
    stats = json.loads(out.read_text())["stats"]
    assert [row["rule"] for row in stats["rules"]] == bench_pool.stats_rules()
    assert len(stats["rules"]) == 20 and stats["positions"] == 5 and stats["pool_built_now"]
    assert cli.main(with_stats) == 0
    again = json.loads(out.read_text())["stats"]
    assert not again["pool_built_now"]  # read back from the cache
    assert [row["acceptance"] for row in again["rules"]] == [
        row["acceptance"] for row in stats["rules"]
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--rounds", "0"], "rounds: must be"),
        (["--dtype", "float32", "float32"], "dtype: named twice"),
        (["--stats-positions", "0"], "stats_positions: must be"),
        (["--verifier", "x"], "verifier: give both"),
    ],
)
def test_bench_pool_errors_are_one_line(cache, capsys, extra, message):
    assert cli.main(["bench", "pool", *extra]) == 2
    error = capsys.readouterr().err
    assert error.startswith("cactus bench pool: error:") and message in error


def test_a_single_round_prints_no_degenerate_interval():
    one = {"median": 1.3, "low": 1.3, "high": 1.3, "coverage": 0.0}
    row = {f"{part}_ratio": one for part, _ in bench_pool.PARTS}
    assert "[" not in bench_pool.ratio_text(row) and "no interval" in bench_pool.ratio_text(row)
    six = {"median": 1.3, "low": 1.1, "high": 1.5, "coverage": 0.969}
    row = {f"{part}_ratio": six for part, _ in bench_pool.PARTS}
    assert "total 1.30x [1.10, 1.50]" in bench_pool.ratio_text(row)


def test_bench_theory_compares_whole_trees(checkpoints, cache, capsys, tmp_path):
    """``--tree``: the whole tree's exact E[accepted] on the pool and at the decoder's step
    starts against the tree decoder's measured AL; cached, and tree rules are accepted."""
    out = tmp_path / "trees.json"
    arguments = theory_args(
        checkpoints, "--dataset", checkpoints["prompts"], "--rule", "walk", "--rule",
        "cactus:delta=1", "--tree", "3,1", "--no-chains", "--json", str(out),
    )  # fmt: skip
    assert cli.main(arguments) == 0
    printed = capsys.readouterr().out
    assert "pool E[L]" in printed and "E starts" in printed
    rows = json.loads(out.read_text())["tree_rows"]
    assert [(row["rule"], row["tree"]) for row in rows] == [
        ("walk", "3,1"),
        ("cactus:delta=1", "3,1"),
    ]
    for row in rows:
        assert 0 < row["pool_accepted"] <= 2 and 0 <= row["measured_al"] <= 2
        assert 0 < row["accepted_step_starts"] <= 2 and row["noise_se"] > 0
        assert abs(row["starts_z"]) < 4  # the decoder's AL is E[L] at its step starts, up to noise
    assert len(list(cache.glob("theory/trees/*.npz"))) == 2 * 3  # decode, starts, pool per rule
    assert cli.main([*arguments[:-2], "--tree", "dynamic:4"]) == 2
    assert "the comparison needs a static tree" in capsys.readouterr().err
