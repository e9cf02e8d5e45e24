"""``cactus bench decode`` and ``cactus bench sampler`` end to end on the tiny saved pair
(``tiny_pair``, ``conftest.py``)."""

import json

import pytest

from cactus_theory.cli import dispatch as cli

pytestmark = pytest.mark.usefixtures("one_torch_thread", "private_cache")


def test_bench_decode_table(checkpoints, capsys, tmp_path):
    output = tmp_path / "decode.json"
    args = [
        "bench",
        "decode",
        "--json",
        str(output),
        "--verifier",
        checkpoints["verifier"],
        "--draft",
        checkpoints["draft"],
        "--prompts",
        checkpoints["prompts"],
        "--max-new-tokens",
        "4",
        "--rule",
        "sps",
        "--rule",
        "cactus:delta=1.0",
        "-k",
        "2",
        "3",
        "--repeats",
        "2",
    ]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "autoregressive" in out and out.count("cactus(δ=1.0)") == 2 and "speed-up" in out
    assert "median of 2 interleaved rounds" in out
    # Two rounds give no 95% interval: no speed-up at all, "-" in both columns, and why.
    assert "no speed-up given: 2 interleaved rounds" in out and "x [" not in out
    # Every round reseeds: the same tokens in each round on CPU, so AL is exact.
    table = json.loads(output.read_text())
    rows = table["rows"]
    assert len(rows) == 5 and all(row["rounds_agree"] for row in rows)
    assert "at least 6" in table["speedup_note"]
    for row in rows:
        assert row["speedup"] is None and "speedup_low" not in row
        assert "speedup_coverage" not in row
    assert cli.main([*args[:-2], "--repeats", "0"]) == 2
    assert "repeats" in capsys.readouterr().err


def test_the_speedup_interval_is_the_order_statistic_interval_of_the_median():
    """Exact: the largest j with P(Binomial(R, 1/2) < j) <= 0.025 gives [s_(j), s_(R+1-j)]
    (R = 6: j = 1, coverage 1 - 2/64; R = 10: j = 2, coverage 1 - 2 * 11/1024); below six
    rounds the range, with coverage 1 - 2^(1-R)."""
    from cactus_theory.real.decode_table import median_interval

    assert median_interval([3.0, 1.0, 2.0, 6.0, 5.0, 4.0]) == (3.5, 1.0, 6.0, 1 - 2 / 64)
    ten = [float(value) for value in range(10, 0, -1)]
    assert median_interval(ten) == (5.5, 2.0, 9.0, 1 - 22 / 1024)
    assert median_interval([1.0, 2.0, 4.0]) == (2.0, 1.0, 4.0, 0.75)
    assert median_interval([1.5]) == (1.5, 1.5, 1.5, 0.0)


def test_bench_sampler_small(capsys, tmp_path):
    output = tmp_path / "s.json"
    args = [
        "bench",
        "sampler",
        "--batch",
        "3",
        "-k",
        "2",
        "--vocab",
        "50",
        "--repeats",
        "1",
        "--json",
        str(output),
    ]
    assert cli.main(args) == 0
    rows = json.loads(output.read_text())["rows"]
    assert [row["rule"] for row in rows] == [
        "sps",
        "cactus(δ=1.0)",
        "cactus-exact(δ=0.5)",
        "frontier(δ=1.0)",
    ]
    assert all(row["dense_over_ours"] > 0 and row["ours_over_floor"] > 0 for row in rows)
    assert rows[1]["ours_over_cactus"] == 1.0
    assert cli.main(["bench", "sampler", "--vocab", "1"]) == 2


def test_bench_sampler_workloads_side_by_side(capsys, tmp_path):
    output = tmp_path / "w.json"
    args = ["bench", "sampler", "--workload", "2x2x50", "--workload", "1x3x5000"]
    args += ["--rule", "sps", "--rule", "cactus:delta=1.0", "--rule", "frontier:delta=0.2"]
    assert cli.main([*args, "--repeats", "1", "--json", str(output)]) == 0
    out = capsys.readouterr().out
    assert "summary (one run)" in out and "ours/cactus" in out
    payload = json.loads(output.read_text())
    assert [(w["batch"], w["k"], w["vocab"]) for w in payload["workloads"]] == [
        (2, 2, 50),
        (1, 3, 5000),
    ]
    rows = payload["rows"]
    assert [row["workload"] for row in rows] == ["2x2x50"] * 3 + ["1x3x5000"] * 3
    assert all(row["ours_over_cactus"] > 0 for row in rows)
    assert cli.main(["bench", "sampler", "--workload", "64x10"]) == 2
    assert "workload" in capsys.readouterr().err


def bench_args(checkpoints, output, *extra):
    return [
        "bench", "decode", "--json", str(output), "--verifier", checkpoints["verifier"],
        "--draft", checkpoints["draft"], "--prompts", checkpoints["prompts"],
        "--max-new-tokens", "4", "--rule", "sps", "--rule", "cactus:delta=1.0",
        "--dtype", "float32", *extra,
    ]  # fmt: skip


def test_bench_decode_rows_carry_alpha_by_position_steps_and_verify_cost(
    checkpoints, capsys, tmp_path
):
    """Six rounds: a speed-up with its 95% interval; each row's counts agree with each
    other (α_j n_j integral, Σ_j α_j n_j = AL × steps, pooled α = Σ accepted / Σ reached,
    steps = verifier calls at batch 1)."""
    output = tmp_path / "d.json"
    assert cli.main(bench_args(checkpoints, output, "-k", "3", "--repeats", "6")) == 0
    out = capsys.readouterr().out
    assert "no speed-up given" not in out and "α1" in out and " v " in out
    table = json.loads(output.read_text())
    assert "speedup_note" not in table
    baseline, *rows = table["rows"]
    assert baseline["speedup"] == 1.0 and "speedup_low" not in baseline  # not a measurement
    assert baseline["steps"] == 0 and baseline["alpha_by_position"] == []
    for row in rows:
        assert row["speedup_low"] <= row["speedup"] <= row["speedup_high"]
        assert row["speedup_coverage"] == 1 - 2 / 64
        assert f"{row['speedup']:.2f}x [{row['speedup_low']:.2f}, " in out
        reached, alphas = row["reached_by_position"], row["alpha_by_position"]
        assert len(reached) == len(alphas) == 3
        taken = [round(a * n) if n else 0 for a, n in zip(alphas, reached, strict=True)]
        for alpha, n, count in zip(alphas, reached, taken, strict=True):
            assert (alpha is None) == (n == 0)
            assert n == 0 or alpha * n == pytest.approx(count, abs=1e-9)
        assert row["steps"] == row["verifier_calls"] >= reached[0] > 0  # batch 1
        assert sum(taken) == round(row["acceptance_length"] * row["steps"])
        assert row["alpha"] == pytest.approx(sum(taken) / sum(reached), rel=1e-12)
        assert row["verify_cost"] > 0 and row["cost_ratio"] > 0


def test_bench_decode_across_batch_sizes(checkpoints, capsys, tmp_path):
    """--batch-sizes 1 2: every config at both sizes, each against its own baseline, and
    over batch 1's; the batch-1 baseline is the reference (1 by definition)."""
    output = tmp_path / "b.json"
    args = bench_args(checkpoints, output, "-k", "2", "--repeats", "6", "--batch-sizes", "1", "2")
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "batches 1 2" in out and "vs b1" in out
    table = json.loads(output.read_text())
    rows = table["rows"]
    assert [(row["label"], row["batch_size"]) for row in rows] == [
        (label, size) for size in (1, 2) for label in ("autoregressive", "sps", "cactus(δ=1.0)")
    ]
    assert table["reference_batch_size"] == 1
    assert rows[0]["speedup_over_reference"] == rows[3]["speedup"] == 1.0
    for row in rows[1:3] + rows[4:]:
        assert row["speedup_over_reference_low"] <= row["speedup_over_reference"]
        assert row["speedup_over_reference"] <= row["speedup_over_reference_high"]
    assert rows[1]["speedup"] == rows[1]["speedup_over_reference"]  # batch 1: one baseline
    for row in rows[4:]:  # three prompts at batch 2: a pair, then one alone
        assert row["steps"] >= row["verifier_calls"]
    assert cli.main([*args[:-2], "2", "0"]) == 2
    assert "batch_sizes: every batch size must be >= 1" in capsys.readouterr().err
    assert cli.main([*args[:-2], "2", "2"]) == 2
    assert "batch_sizes: given twice in (2, 2)" in capsys.readouterr().err
