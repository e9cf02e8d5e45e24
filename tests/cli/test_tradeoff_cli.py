"""``cactus tradeoff`` end to end on tiny Llama checkpoints saved to a folder.

Oracle: the JSON's rows equal ``real.tradeoff.tradeoff`` recomputed on the pool the
command cached (read back with the same settings), the predicted speed-ups equal
(AL_k + 1)/(k c + v_k) from the JSON's own costs, and the CSV and figure are written.
"""

import json

import pytest
from tiny_pair import (
    assert_one_line_naming_the_rule,
    make_tokenizer,
    raising_rule_module,
    save_model,
)

from cactus_theory import rules
from cactus_theory.cli import dispatch as cli
from cactus_theory.core.processors import SamplingSettings
from cactus_theory.decode.runs import Pair, load_setup
from cactus_theory.real import pools, tradeoff

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RULES = ["sps", "cactus:delta=1.0", "frontier:delta=0.2", "tas"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("tradeoff-models")
    tokenizer = make_tokenizer(300)
    prompts = root / "prompts.txt"
    prompts.write_text("def main(\nimport os\nclass A:\nprint(\n")
    return {
        "verifier": save_model(root / "verifier", tokenizer, len(tokenizer), 0, 2),
        "draft": save_model(root / "draft", tokenizer, len(tokenizer), 1, 1),
        "prompts": str(prompts),
    }


def arguments(pair, tmp_path, *extra):
    words = ["tradeoff", "--verifier", pair["verifier"], "--draft", pair["draft"]]
    words += ["--dataset", pair["prompts"], "--raw", "--num-prompts", "4", "--positions", "20"]
    words += ["--max-new-tokens", "10", "--batch-size", "2", "--dtype", "float32", "--quiet"]
    words += ["--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out")]
    for spec in RULES:
        words += ["--rule", spec]
    return [*words, *extra]


def test_tradeoff_writes_the_exact_table_json_csv_and_figure(pair, tmp_path, capsys):
    copy = tmp_path / "copy.json"
    code = cli.main(arguments(pair, tmp_path, "--no-costs", "--k-max", "3", "--json", str(copy)))
    out = capsys.readouterr().out
    assert code == 0
    data = json.loads((tmp_path / "out" / "tradeoff.json").read_text())
    assert json.loads(copy.read_text()) == data
    assert [row["rule"] for row in data["rows"]] == ["sps", "cactus:delta=1.0",
                                                     "frontier:delta=0.2",
                                                     "tas:epsilon=0.09,alpha=0.3"]  # fmt: skip
    assert data["violations"] == [] and data["costs"] is None
    assert "frontier check: no rule exceeds the frontier" in out
    assert f"Cactus δ=1 accepts {data['rows'][1]['acceptance']:.4f}" in out

    # the oracle: the same pool, read back from the cache, through the library
    setup = load_setup(Pair(pair["verifier"], pair["draft"]), "cpu", "float32",
                       pair["prompts"], 4, raw=True)  # fmt: skip
    sampling = SamplingSettings(0.6, 20, 0.95)  # the command's defaults (the paper's)
    settings = pools.PoolSettings(positions=20, num_prompts=4, max_new_tokens=10,
                                  sampling=sampling, batch_size=2)  # fmt: skip
    pool = pools.build_pool(setup, settings, tmp_path / "cache", device="cpu",
                            dtype="float32", progress=False)  # fmt: skip
    assert pool.info["shards_built"] == 0  # the command's shards were cached
    assert data["positions"] == len(pool) >= 20
    expected = tradeoff.to_json(tradeoff.tradeoff(pool, RULES, k_max=3))
    for got, want in zip(data["rows"], expected["rows"], strict=True):
        for key in ("acceptance", "tv_per_token", "frontier_acceptance"):
            assert got[key] == pytest.approx(want[key], abs=1e-12)
        assert got["predicted_al"] == pytest.approx(want["predicted_al"])
    assert data["rows"][0]["kl_per_token"] == pytest.approx(0.0, abs=1e-12)

    csv_lines = (tmp_path / "out" / "tradeoff.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + len(RULES) and csv_lines[1].startswith("sps,")
    assert (tmp_path / "out" / "tradeoff.png").stat().st_size > 10_000


def test_costs_give_the_predicted_speedups(pair, tmp_path, capsys):
    code = cli.main(arguments(pair, tmp_path, "--k-max", "2"))
    out = capsys.readouterr().out
    assert code == 0 and "costs: draft c =" in out
    data = json.loads((tmp_path / "out" / "tradeoff.json").read_text())
    costs = data["costs"]
    assert costs["draft_cost"] > 0 and set(costs["verify_costs"]) == {"1", "2"}
    for row in data["rows"]:
        for k in (1, 2):
            alpha = row["acceptance"]
            tokens = sum(alpha**j for j in range(k + 1))
            cost = k * costs["draft_cost"] + costs["verify_costs"][str(k)]
            assert row["predicted_speedup"][str(k)] == pytest.approx(tokens / cost)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--temperature", "0"], "temperature: must be > 0"),
        (["--positions", "0"], "positions: must be >= 1"),
        (["--rule", "nonsense"], "nonsense"),
        (["--rule", "cactus"], "delta"),
        (["--pair", "stdlib"], "pair: give --pair or --verifier/--draft, not both"),
        (["--dataset", "no-such-set"], "dataset"),
        (["--device", "cuda:7"], "device"),
    ],
)
def test_bad_arguments_are_one_line(pair, tmp_path, capsys, extra, message):
    assert cli.main([*arguments(pair, tmp_path, "--no-costs"), *extra]) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error
    assert len(error.strip().splitlines()) == 1


def test_one_model_alone_and_an_unwritable_out(pair, tmp_path, capsys):
    assert cli.main(["tradeoff", "--verifier", pair["verifier"]]) == 2
    assert "give both --verifier and --draft" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert cli.main(["tradeoff", "--pair", "stdlib", "--out", str(blocker)]) == 2
    assert "out:" in capsys.readouterr().err


def test_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit):
        cli.main(["tradeoff", "--help"])
    text = capsys.readouterr().out
    for flag in ("--pair", "--verifier", "--draft", "--dataset", "--num-prompts",
                 "--max-new-tokens", "--positions", "--rule", "--temperature", "--top-k",
                 "--top-p", "--dtype", "--device", "--k-max", "--no-costs", "--json",
                 "--out", "--cache"):  # fmt: skip
        assert flag in text


def test_a_rule_that_raises_is_one_line_naming_it(pair, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(rules.ENV_MODULES, raising=False)  # restored after --rules-module
    module = raising_rule_module(tmp_path)
    words = arguments(pair, tmp_path, "--no-costs", "--rules-module", module)
    words += ["--rule", "test-half-written"]
    try:
        assert cli.main(words) == 1
    finally:
        rules.REGISTRY.pop("test-half-written", None)
    assert_one_line_naming_the_rule(capsys.readouterr().err, "tradeoff")


def test_tree_tradeoff_writes_exact_tree_rows_and_the_frontier(pair, tmp_path, capsys):
    """``--tree``: tree rules on the same pool, recomputed through the library."""
    words = arguments(pair, tmp_path, "--no-costs", "--k-max", "2")
    words = [w for w in words if w not in RULES and w != "--rule"]
    tree_rules = ["walk", "cactus-tree:delta=0.5", "rrs", "k-seq"]
    for spec in tree_rules:
        words += ["--rule", spec]
    code = cli.main([*words, "--tree", "1,2", "--children", "deterministic,with-replacement"])
    out = capsys.readouterr().out
    assert code == 0 and "frontier check: no tree rule exceeds the frontier" in out
    data = json.loads((tmp_path / "out" / "tree-tradeoff.json").read_text())
    assert [(c["scheme"], c["width"]) for c in data["configurations"]] == [
        ("deterministic", 1), ("deterministic", 2), ("with-replacement", 1),
        ("with-replacement", 2),
    ]  # fmt: skip
    setup = load_setup(Pair(pair["verifier"], pair["draft"]), "cpu", "float32",
                       pair["prompts"], 4, raw=True)  # fmt: skip
    sampling = SamplingSettings(0.6, 20, 0.95)
    settings = pools.PoolSettings(positions=20, num_prompts=4, max_new_tokens=10,
                                  sampling=sampling, batch_size=2)  # fmt: skip
    pool = pools.build_pool(setup, settings, tmp_path / "cache", device="cpu",
                            dtype="float32", progress=False)  # fmt: skip
    from cactus_theory.real import tree_tradeoff

    # every --rule that supports the scheme: walk, cactus-tree and rrs (k-seq is i.i.d. only)
    specs = ["walk", "cactus-tree:delta=0.5", "rrs"]
    wanted = tree_tradeoff.configuration(pool, "deterministic", 2, specs)
    got = data["configurations"][1]["rows"]
    for mine, theirs in zip(got, wanted.rows, strict=True):
        assert mine["acceptance"] == pytest.approx(theirs.acceptance, abs=1e-12)
        assert mine["frontier_acceptance"] == pytest.approx(theirs.frontier_acceptance, abs=1e-12)
    assert (tmp_path / "out" / "tree-tradeoff.png").stat().st_size > 10_000
    assert cli.main([*words, "--tree", "2", "--children", "beam"]) == 2
    assert "children: expected some of" in capsys.readouterr().err


def test_dtype_auto_measures_the_pools_and_the_decoders_dtype(pair, tmp_path, capsys, monkeypatch):
    """The default --dtype auto measures the pool's generation step (batch 2 here) and the
    decoder's verify call (k_max + 1 tokens), prints both and records them."""
    monkeypatch.setenv("CACTUS_CACHE", str(tmp_path / "user-cache"))
    words = arguments(pair, tmp_path, "--no-costs", "--k-max", "2")
    at = words.index("--dtype")
    del words[at : at + 2]
    assert cli.main(words) == 0
    out = capsys.readouterr().out
    assert "pools: dtype auto: " in out and "one forward of 1 token at batch 2" in out
    assert "decoder: dtype auto: " in out and "one forward of 3 tokens at batch 1" in out
    data = json.loads((tmp_path / "out" / "tradeoff.json").read_text())
    assert data["settings"]["dtype"] in ("float32", "bfloat16")
    assert data["settings"]["costs_dtype"] in ("float32", "bfloat16")
