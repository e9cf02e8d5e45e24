"""``cactus decode --tree`` and ``cactus bench decode --tree`` end to end, on the tiny saved
checkpoints of ``tiny_pair`` (the fixtures in ``conftest``)."""

import json

import pytest
from tiny_pair import decode_args

from cactus_theory.cli import dispatch as cli

pytestmark = pytest.mark.usefixtures("one_torch_thread", "private_cache")


def test_decode_with_a_tree_prints_its_acceptance_by_depth_and_rank(checkpoints, capsys, tmp_path):
    summary = tmp_path / "tree.json"
    args = decode_args(
        checkpoints, "--rule", "walk", "--tree", "3,2", "--json", str(summary), "--quiet"
    )
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "tree 3,2 (deterministic children)" in out and "α by depth [" in out
    assert "α by rank [" in out and "draft forwards per step" in out
    data = json.loads(summary.read_text())
    assert data["tree"] == "3,2" and data["k"] is None and data["rule"] == "walk"
    assert data["speculative"]["kl_per_token"] == pytest.approx(0.0, abs=1e-12)
    assert data["speculative"]["tokens"] == data["baseline"]["tokens"] == 18
    reached = data["speculative"]["tree_reached_by_depth_rank"]
    # every root the walk reached had 3 children (a row's last step drafts none)
    assert reached[0][0] == reached[0][1] == reached[0][2] > 0


def test_decode_a_chain_rule_on_a_tree_is_its_lift(checkpoints, capsys, tmp_path):
    summary = tmp_path / "lift.json"
    args = decode_args(
        checkpoints, "--rule", "cactus", "--delta", "1", "--tree", "dynamic:4,depth=2,top=2",
        "--json", str(summary), "--quiet", "--no-baseline",
    )  # fmt: skip
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "rule cactus(δ=1.0), tree dynamic:4,depth=2,top=2" in out
    assert json.loads(summary.read_text())["speculative"]["kl_per_token"] > 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--rule", "walk"], "rule: 'walk' is a tree rule; give --tree"),
        (["--tree", "4,0"], "tree: every width must be a positive integer"),
        (["--tree", "dynamic:4", "--children", "with-replacement"], "children: a dynamic tree"),
        (["--tree", "3", "--children", "hub"], "children: the hub scheme"),
        (
            ["--tree", "2,2", "--children", "with-replacement", "--rule", "cactus:delta=1"],
            "divergence: the exact law of lift(cactus(δ=1.0)) with with-replacement children",
        ),
    ],
)
def test_tree_errors_are_one_line(checkpoints, capsys, extra, message):
    assert cli.main(decode_args(checkpoints, *extra, "--quiet")) == 2
    assert message in capsys.readouterr().err


def test_bench_decode_puts_trees_beside_chains(checkpoints, capsys, tmp_path):
    output = tmp_path / "bench.json"
    args = [
        "bench", "decode", "--json", str(output), "--verifier", checkpoints["verifier"],
        "--draft", checkpoints["draft"], "--prompts", checkpoints["prompts"],
        "--max-new-tokens", "4", "--rule", "sps", "-k", "2", "--tree", "2,1", "--tree",
        "dynamic:3,depth=2,top=2", "--repeats", "1",
    ]  # fmt: skip
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "dynamic:3,depth=2,top=2" in out and "tree rows:" in out
    rows = json.loads(output.read_text())["rows"]
    assert [row["tree"] for row in rows] == [None, None, "2,1", "dynamic:3,depth=2,top=2"]
    tree_row = rows[2]
    assert tree_row["nodes_per_step"] <= 4 and len(tree_row["alpha_by_rank"]) == 2
    assert tree_row["kl_per_token"] == pytest.approx(0.0, abs=1e-12)


def test_tree_auto_prints_its_choice_and_decodes_with_it(checkpoints, capsys, tmp_path):
    summary = tmp_path / "auto.json"
    args = decode_args(
        checkpoints, "--rule", "sps", "--tree", "auto:6", "--json", str(summary), "--quiet",
        "--no-baseline",
    )  # fmt: skip
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "tree auto: parents:" in out and "verify forward ms by nodes" in out
    assert "calibrated on the run's first prompts (the pair has none)" in out
    data = json.loads(summary.read_text())
    assert data["tree"].startswith("parents:") and data["tree_choice"]["nodes"] <= 6
