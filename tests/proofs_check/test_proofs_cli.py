"""`cactus check` / `python -m proofs_check`, the cache, the benchmark, negative controls."""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cactus_theory.cli import dispatch as cactus_cli
from cactus_theory.core import gamma
from cactus_theory.core.rules import frontier as frontier_module
from proofs_check import checks_budgets, checks_exact, claims, cli, report, runner

ROOT = Path(__file__).resolve().parents[2]


def test_module_entry_point_writes_json_markdown_and_readme(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        "# x\n\n## What we verified (proofs_check/)\n\n"
        "<!-- proofs_check: generated from the claims report -->\n\n## Next\n",
        encoding="utf-8",
    )
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    command = [
        sys.executable,
        "-m",
        "proofs_check",
        "--quick",
        "--no-progress",
        "--only",
        "cor6",
        "overshoot",
        "--json",
        str(out_json),
        "--markdown",
        str(out_md),
        "--update-markdown",
        str(readme),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "cor6.sharp" in done.stdout and "claims hold" in done.stdout
    result = json.loads(out_json.read_text(encoding="utf-8"))
    assert [row["id"] for row in result["claims"]] == ["cor6", "cor6.sharp", "overshoot"]
    assert "log(1 + 2δ)/δ" in out_md.read_text(encoding="utf-8")
    text = readme.read_text(encoding="utf-8")
    assert report.BLOCK_BEGIN in text and text.endswith("## Next\n")
    # Regenerating replaces the block instead of adding a second one.
    report.update_markdown(readme, "replaced")
    text = readme.read_text(encoding="utf-8")
    assert text.count(report.BLOCK_BEGIN) == 1 and "replaced" in text and "cor6.sharp" not in text


def test_dispatcher_routes_check_and_bench(capsys):
    assert cactus_cli.main(["check", "--list"]) == 0
    assert "branch-kl" in capsys.readouterr().out
    code = cactus_cli.main(
        [
            "bench",
            "solvers",
            "--instances",
            "20",
            "--cvxpy-instances",
            "2",
            "--cold-instances",
            "1",
            "--vocab",
            "3",
            "--repeats",
            "1",
        ]
    )
    output = capsys.readouterr().out
    assert code == 0 and "speed ratio" in output and "frontier" in output


@pytest.mark.parametrize(
    "argv, name",
    [
        (["check", "--only", "nonsense"], "only"),
        (["check", "--seed", "-1"], "seed"),
        (["bench", "solvers", "--instances", "0"], "instances"),
        (["bench", "solvers", "--instances", "5", "--cvxpy-instances", "9"], "cvxpy-instances"),
        (["bench", "solvers", "--delta", "0"], "delta"),
        (["check", "--from-json", "/nonexistent/result.json"], "from-json"),
        (["check", "--json", "/proc/version/r.json"], "json"),
        (["check", "--markdown", "/proc/version/r.md"], "markdown"),
        (["check", "--json", "/"], "json"),
        (["check", "--update-markdown", "/nonexistent/README.md"], "update_markdown"),
        (["bench", "solvers", "--json", "/proc/version/r.json"], "json"),
        (["bench", "law", "--json", "/proc/version/r.json"], "json"),
    ],
)
def test_bad_arguments_are_clean_errors_naming_the_argument(argv, name, capsys):
    """Exit status 2 (never 1, which means a guarantee failed), one line naming the
    argument, and at once: output paths are checked before any check runs."""
    started = time.perf_counter()
    assert cactus_cli.main(argv) == 2
    assert f"error: {name}" in capsys.readouterr().err
    assert time.perf_counter() - started < 5


def test_the_interrupt_message_is_true_to_the_caching_mode():
    from proofs_check import cli as proofs_cli

    quick = argparse.Namespace(quick=True, cache_dir=None)
    cached = argparse.Namespace(quick=True, cache_dir="somewhere")
    full = argparse.Namespace(quick=False, cache_dir=None)
    assert "nothing was cached" in proofs_cli.interrupted_message(quick)
    assert "rerun resumes" in proofs_cli.interrupted_message(cached)
    assert "rerun resumes" in proofs_cli.interrupted_message(full)


def test_a_saved_result_renders_without_rerunning(tmp_path, capsys):
    saved = {
        "claims": [claims.row("x", "a statement", "paper", True, 3, 0.5)],
        "curves": {},
        "mode": "full",
        "seed": 0,
    }
    path = tmp_path / "saved.json"
    report.write_json(saved, path)
    markdown = tmp_path / "out.md"
    assert cactus_cli.main(["check", "--from-json", str(path), "--markdown", str(markdown)]) == 0
    assert "1/1 claims hold (full run, seed 0)" in capsys.readouterr().out
    assert "`x`" in markdown.read_text(encoding="utf-8")


def test_readme_without_markers_and_bad_owner_are_value_errors(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# nothing to replace\n", encoding="utf-8")
    with pytest.raises(ValueError, match="^update_markdown"):
        report.update_markdown(readme, "text")
    with pytest.raises(ValueError, match="^owner"):
        claims.row("x", "s", "theirs", True, 1, 0.0)


def test_run_rejects_a_bad_seed():
    with pytest.raises(ValueError, match="^seed"):
        runner.run(seed=-3, progress=False)


def test_finished_checks_are_cached_and_reused(tmp_path, monkeypatch):
    first = runner.run(quick=True, progress=False, cache_dir=str(tmp_path), only=("cor6",))
    files = list(tmp_path.rglob("cor6.json"))
    assert len(files) == 1

    def must_not_run(context):
        raise AssertionError("a cached check ran again")

    registry = [(name, must_not_run) for name, _ in claims.checks()]
    monkeypatch.setattr(claims, "checks", lambda: registry)
    again = runner.run(quick=True, progress=False, cache_dir=str(tmp_path), only=("cor6",))
    assert again["claims"] == first["claims"]


def test_exit_code_is_one_only_when_our_guarantee_fails(monkeypatch, capsys):
    def fake(owner):
        def check(context):
            return {
                "rows": [claims.row("x", "a statement", owner, False, 1, 1.0, {"target": [1.0]})]
            }

        return [("fake", check)]

    args = cli_args()
    monkeypatch.setattr(claims, "checks", lambda: fake("paper"))
    assert cli.run(args) == 0  # a failing paper claim is a finding
    monkeypatch.setattr(claims, "checks", lambda: fake("ours"))
    assert cli.run(args) == 1
    assert "OUR GUARANTEES THAT FAIL: x" in capsys.readouterr().out


def cli_args(**overrides):
    parser = __import__("argparse").ArgumentParser()
    cli.configure(parser)
    args = parser.parse_args(["--quick", "--no-progress"])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


# --- negative controls: a wrong solver must be caught ---------------------------------------


def test_a_solver_that_raises_too_high_is_caught(monkeypatch):
    original = gamma.exact_raised_mass

    def too_high(target_mass, delta, divergence="kl", cap=None):
        raised = np.minimum(1.0, original(target_mass, delta, divergence) * (1 + 1e-3) + 1e-6)
        return raised if cap is None else np.minimum(raised, cap)

    monkeypatch.setattr(gamma, "exact_raised_mass", too_high)
    rows = {row["id"]: row for row in checks_exact.branch_check("tv")(claims.Context())["rows"]}
    assert rows["ours.gamma.tv"]["verdict"] == "fails"
    assert rows["ours.gamma.tv"]["counterexample"]["target"]


def test_a_frontier_that_ignores_the_budget_is_caught(monkeypatch):
    monkeypatch.setattr(
        frontier_module, "frontier_target", lambda target, draft, delta: draft.copy()
    )
    found = checks_budgets.check_frontier_budget(claims.Context())["rows"][0]
    assert found["verdict"] == "fails"
    assert found["counterexample"]["kl_emitted"] > found["counterexample"]["delta"]
