"""Sweeps: tidy CSVs, per-cell cache, and resume after an interruption."""

import csv

import pytest

from sims import sweep, sweep_csv


def _files(folder):
    return {name: (folder / name).read_bytes() for name in sweep_csv.OUTPUT_FILES}


def test_resume_after_interruption_equals_an_uninterrupted_run(tmp_path):
    config = sweep.TINY
    first_calls = []

    def interrupted(cell, config_, sources):
        if len(first_calls) == 9:
            raise KeyboardInterrupt  # as if the user pressed Ctrl-C mid-sweep
        first_calls.append(cell)
        return sweep.compute_cell(cell, config_, sources)

    with pytest.raises(KeyboardInterrupt):
        sweep.run(config, tmp_path / "resumed", progress=False, compute=interrupted)
    saved = list((tmp_path / "resumed" / "cells").rglob("*.json"))
    assert len(saved) == 9

    second_calls = []

    def counting(cell, config_, sources):
        second_calls.append(cell)
        return sweep.compute_cell(cell, config_, sources)

    resumed = sweep.run(config, tmp_path / "resumed", progress=False, compute=counting)
    assert not set(first_calls) & set(second_calls)  # no finished cell recomputed
    assert len(second_calls) == len(resumed.cells) - 9
    assert resumed.computed == len(second_calls)

    straight = sweep.run(config, tmp_path / "straight", progress=False)
    assert straight.computed == len(straight.cells)
    assert _files(tmp_path / "resumed") == _files(tmp_path / "straight")

    # A third run computes nothing and writes the same files again.
    again = sweep.run(config, tmp_path / "resumed", progress=False, compute=counting)
    assert again.computed == 0
    assert _files(tmp_path / "resumed") == _files(tmp_path / "straight")


def test_csvs_are_tidy(tmp_path):
    result = sweep.run(sweep.TINY, tmp_path, progress=False)
    with open(result.paths["decoding"]) as handle:
        rows = list(csv.DictReader(handle))
    decode_cells = [cell for cell, _ in result.cells if cell.kind == "decode"]
    assert len(rows) == len(decode_cells)  # one row per cell
    for row in rows:
        assert row["seed"] == "0" and row["source_settings"].startswith("{")
        if row["rule"] == "sps" and row["group"] == "grid":
            assert float(row["rej_change_vs_sps_pct"]) == 0.0
        assert float(row["tokens_per_call"]) == pytest.approx(float(row["al"]) + 1)
    with open(result.paths["tradeoff"]) as handle:
        tradeoff = list(csv.DictReader(handle))
    assert {row["name"] for row in tradeoff} >= {
        "sps",
        "tas",
        "topk",
        "cactus",
        "cactus-exact",
        "frontier",
        "interp",
        "pareto",
    }
    groups = {row["group"] for row in rows}
    assert groups == {"grid", "matched"}


def test_a_damaged_cell_is_recomputed(tmp_path):
    sweep.run(sweep.TINY, tmp_path, progress=False)
    victim = sorted((tmp_path / "cells" / "tradeoff").glob("*.json"))[0]
    victim.write_text("{not json")
    result = sweep.run(sweep.TINY, tmp_path, progress=False)
    assert result.computed == 1


@pytest.mark.parametrize(
    ("changes", "argument"),
    [
        ({"synthetic": (), "text": ()}, "sources"),
        ({"budgets": (0.5, -0.1)}, "budgets"),
        ({"curve_budgets": (-1.0,)}, "curve_budgets"),
        ({"ks": (0,)}, "ks"),
        ({"ks": ()}, "ks"),
        ({"alphas": (1.5,)}, "alphas"),
        ({"seed": -1}, "seed"),
        ({"text_length": 0}, "text_length"),
    ],
)
def test_bad_settings_are_named(changes, argument):
    from dataclasses import replace

    with pytest.raises(ValueError, match=f"^{argument}"):
        replace(sweep.TINY, **changes)


def test_unwritable_output_folder_is_named(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="^out: cannot write"):
        sweep.run(sweep.TINY, blocker / "report", progress=False)
