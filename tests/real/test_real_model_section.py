"""The report's real-model section (``cactus_theory.real.real_model`` and
``paper_figs.page_real``) on a tiny pair saved with ``save_pretrained`` and loaded back by
path, as the report loads the default pair.

- the JSON's trade-off rows equal ``real.tradeoff.tradeoff`` on the same pool built again
  independently (no cache), to the last bit, and its CSV is ``tradeoff.csv_text`` of them;
- the predicted speed-ups rest on the speed check's costs, measured in the same run as the
  measured speed-up; the page shows both side by side with the reason they differ, and
  no degenerate interval ("[a, a]") is ever printed; a speed check of fewer than 6
  rounds (the negative control) shows no measured speed-up at all;
- every stage prints progress lines (what it does, how far, the time left);
- a pair that cannot be loaded gives the "unavailable" reason, in the JSON and on the page,
  and no traceback.
"""

import json
import re

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from cactus_theory.decode.runs import Pair, load_setup
from cactus_theory.real import pools, real_model, speed_check, theory, tradeoff
from cactus_theory.real.speed_check import SpeedSettings
from cactus_theory.util.stages import CoreShare
from paper_figs import page_real

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = [
    "def main(argv):",
    "import os",
    "class A:",
    "print(",
    "return 0",
    "import sys",
]
POOL = pools.PoolSettings(positions=40, num_prompts=6, max_new_tokens=12, batch_size=2)
SPEED = SpeedSettings(k=2, num_prompts=1, max_new_tokens=6, rounds=6)
DTYPES = {"pools": "float32", "decoder": "float32"}
THEORY = theory.TheorySettings(k=2, num_prompts=4, max_new_tokens=10, batch_size=2)
DEGENERATE = re.compile(r"\[\s*([0-9.]+)x?,\s*\1x?\s*\]")


def _save(folder, tokenizer, seed, layers):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4, intermediate_size=64,
        max_position_embeddings=256, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.pad_token_id,
        initializer_range=0.3,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("pair")
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    return Pair(
        _save(root / "verifier", tokenizer, 0, 2),
        _save(root / "draft", tokenizer, 1, 1),
        str(prompts),
        "tiny",
    )


@pytest.fixture(scope="module")
def section(tiny_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    lines = []
    cores = CoreShare(out / "cores.json")
    cores.grant(1, quiet=True)  # as the report grants it once alone (one core: CI's share)
    found = real_model.run(
        out,
        quick=True,
        progress=False,
        pair=tiny_pair,
        say=lines.append,
        prompts={"mt-bench": PROMPTS},
        pool_settings=POOL,
        theory_settings=THEORY,
        speed_settings=SPEED,
        dtypes=DTYPES,
        cores=cores,
    )
    return out, found, lines


def test_the_json_rows_are_the_exact_tradeoff_of_the_same_pool(section, tiny_pair):
    out, found, _ = section
    stored = json.loads((out / real_model.OUTPUT).read_text())
    assert stored == json.loads(json.dumps(found))
    entry = stored["tradeoff"]["mt-bench"]
    setup = load_setup(tiny_pair, torch.device("cpu"), "float32")
    setup.prompts = list(PROMPTS)
    pool = pools.build_pool(
        setup, POOL, None, device="cpu", dtype="float32", progress=False
    )  # built again from scratch: no cache
    assert entry["document"]["positions"] == len(pool) > 0
    costs = stored["costs"]  # measured once by the speed check (timings: not reproducible)
    assert costs == stored["speed"]["costs"] and costs["rule"] == "sps"
    expected = tradeoff.tradeoff(
        pool,
        tradeoff.default_rules(),
        k_max=real_model.K_MAX,
        draft_cost=costs["draft_cost"]["median"],
        verify_costs={SPEED.k: costs["verify_cost"]["median"]},
    )
    document = entry["document"]
    assert document["rows"] == tradeoff.to_json(expected)["rows"]
    assert document["frontier"] == tradeoff.to_json(expected)["frontier"]
    assert [row["rule"] for row in document["rows"]] == [row.stats.spec for row in expected.rows]
    # The frontier dominates every rule, the engines' relaxed top-K (infinite KL here)
    # included: at an infinite KL the frontier accepts every draft.
    assert entry["violations"] == tradeoff.dominance_violations(expected) == []
    relaxed = real_model.find_row(document, "relaxed:top_k=10,delta=0.6")
    assert relaxed["kl_per_token"] is None and relaxed["frontier_acceptance"] == 1.0
    assert (out / entry["csv"]).read_text() == tradeoff.csv_text(document)
    assert entry["pool"].startswith(f"{len(pool):,} positions from ")
    # sps is lossless: KL 0 exactly; cactus δ = 1 accepts at least as much as sps.
    sps = real_model.find_row(document, "sps")
    cactus = real_model.find_row(document, "cactus:delta=1")
    assert sps["kl_per_token"] == pytest.approx(0.0, abs=1e-12)
    assert cactus["acceptance"] >= sps["acceptance"]
    assert set(stored["timings"]) == {"load", "pools", "trees", "theory", "speed"}
    # A predicted speed-up only where v_k was measured: at the speed check's k.
    assert set(cactus["predicted_speedup"]) == {str(SPEED.k)}
    assert set(cactus["predicted_al"]) == {str(k) for k in range(1, real_model.K_MAX + 1)}
    assert stored["dtype"] == "float32" and stored["cpu"]["capability"]


def test_the_tree_rows_are_the_exact_tree_tradeoff_of_the_same_pool(section, tiny_pair):
    """The tree stage: every configuration (top-K and sampled children, K = 1, 2, 4) equal
    to ``tree_tradeoff.configuration`` on the pool built again from scratch; its CSV; the
    page's tree section quotes it."""
    from cactus_theory.core import trees
    from cactus_theory.real import tree_tradeoff

    out, found, _ = section
    entry = found["trees"]
    assert entry["dataset"] == "mt-bench" and (out / entry["csv"]).is_file()
    setup = load_setup(tiny_pair, torch.device("cpu"), "float32")
    setup.prompts = list(PROMPTS)
    pool = pools.build_pool(setup, POOL, None, device="cpu", dtype="float32", progress=False)
    expected = [
        tree_tradeoff.configuration(
            pool,
            scheme,
            width,
            None if scheme == trees.DETERMINISTIC else list(real_model.TREE_SAMPLED_RULES),
            real_model.K_MAX,
        )
        for scheme in (trees.DETERMINISTIC, trees.WITH_REPLACEMENT)
        for width in real_model.TREE_WIDTHS
    ]
    document = tree_tradeoff.to_json(expected, dataset="mt-bench", positions=len(pool),
                                     pair=found["pair"])  # fmt: skip
    assert entry["document"] == json.loads(json.dumps(document))
    assert entry["document"]["violations"] == []
    assert (out / entry["csv"]).read_text() == tree_tradeoff.csv_text(entry["document"])
    page = page_real.real_model_section(found)
    walk = entry["document"]["configurations"][1]["rows"][0]  # K = 2, the walk: q(S)
    assert walk["rule"] == "walk" and f"<td>2</td><td>{walk['acceptance']:.4f} / " in page
    assert "Tree verification on MT-Bench" in page and "K children sampled" in page


def test_the_speed_check_puts_prediction_and_measurement_side_by_side(section):
    _, found, _ = section
    speed = found["speed"]
    assert speed["dataset"] == "mt-bench" and speed["rounds"] == SPEED.rounds == 6
    assert speed["threads"] == real_model.SPEED_THREADS and speed["dtype"] == "float32"
    baseline, *rules = speed["rows"]
    assert baseline["rule"] == "autoregressive" and baseline["speedup"] == 1.0
    assert [row["rule"] for row in rules] == list(SPEED.rules)
    document = found["tradeoff"]["mt-bench"]["document"]
    for row in rules:
        # Every round is a new sample: tokens from all 6 rounds are pooled (EOS may end one
        # early), far more than one round holds.
        one_round = SPEED.num_prompts * SPEED.max_new_tokens
        assert 2 * one_round < row["tokens"] <= SPEED.rounds * one_round
        assert row["speedup_low"] <= row["speedup"] <= row["speedup_high"]
        assert row["speedup_low"] < row["speedup_high"]  # never a degenerate interval
        # The pool prediction uses the pool's exact α of the same rule.
        alpha = real_model.find_row(document, row["rule"])["acceptance"]
        assert row["pool_alpha"] == alpha
        assert row["predicted_al"] == pytest.approx(alpha + alpha**2)
        for name in ("predicted", "predicted_measured_al", "accounted"):
            interval = row[name]
            assert interval["low"] <= interval["median"] <= interval["high"]
        assert row["why"]
    sps = rules[0]
    assert speed["costs"]["draft_cost"]["median"] > 0 and speed["costs"]["verify_cost"]["median"]
    # The measured AL's interval comes from its own counts.
    steps = sps["tokens"] / (sps["acceptance_length"] + 1)
    assert sps["steps"] == pytest.approx(steps, rel=0.01)


def test_a_speed_check_without_six_rounds_shows_no_measured_speedup():
    """Negative control: a decode table of 1 round has no speed-up interval, so the speed
    check gives no measured speed-up, says why, and the page prints none."""
    row = {
        "rule": "sps", "label": "sps", "k": 2, "acceptance_length": 0.5, "tokens": 12,
        "tokens_per_call": 1.5, "steps": 8, "tokens_per_second": 20.0, "speedup": None,
        "alpha_by_position": [0.4, 0.25], "kl_per_token": 0.0,
        "per_round": [{"draft_cost": 0.05, "verify_cost": 1.1, "other_cost": 0.1,
                       "step_seconds": 0.05, "prefill_share": 0.1}],
    }  # fmt: skip
    base = {"rule": "autoregressive", "tokens": 12, "tokens_per_second": 18.0}
    found = speed_check.summarise({"rows": [base, row]}, {"sps": 0.5}, SpeedSettings(k=2, rounds=1))
    assert found["rows"][1]["speedup"] is None
    assert found["rows"][1]["why"].startswith("no measured speed-up: fewer than 6")
    page = page_real.speed_section({"speed": {**found, "dataset": "mt-bench"}})
    assert "x [" not in page.split("predicted (pool α)")[-1].split("<td>")[9]
    assert not DEGENERATE.search(page)


def test_explain_says_what_separates_prediction_and_measurement():
    row = {
        "speedup": 1.10, "speedup_low": 1.02, "speedup_high": 1.18, "pool_alpha": 0.45,
        "predicted_al": 0.74, "acceptance_length": 0.50, "alpha_by_position": [0.42, 0.2, 0.1],
        "predicted": {"median": 1.45, "low": 1.40, "high": 1.50},
        "predicted_measured_al": {"median": 1.25, "low": 1.2, "high": 1.3},
        "accounted": {"median": 1.15, "low": 1.1, "high": 1.2}, "prefill_share": 0.08,
    }  # fmt: skip
    why = speed_check.explain(row)
    assert why.startswith("predicted 1.45x from the pool, measured 1.10x [1.02, 1.18]")
    assert "AL 0.74" in why and "AL 0.50" in why and "alone gives 1.25x" in why
    assert "takes it to 1.15x" in why and "prefill" not in why  # 1.15 is inside [1.02, 1.18]
    row["accounted"] = {"median": 1.30, "low": 1.25, "high": 1.35}
    assert "prefill and the time between steps account for the rest (8% of the time" in (
        speed_check.explain(row)
    )
    row["predicted"] = {"median": 1.12, "low": 1.0, "high": 1.3}
    assert speed_check.explain(row) == (
        "predicted 1.12x lies within the measured 1.10x [1.02, 1.18]: they agree"
    )
    row["predicted"] = {"median": 1.22, "low": 1.05, "high": 1.3}  # outside [1.02, 1.18]
    assert speed_check.explain(row) == (
        "measured 1.10x [1.02, 1.18] lies within the prediction's interval [1.05, 1.30] "
        "(median 1.22x, over the rounds' costs): they agree"
    )


def test_every_stage_prints_progress_lines(section):
    _, _, lines = section
    assert all(line.startswith("[real-model ") for line in lines)
    text = "\n".join(lines)
    for stage in ("load and dtypes", "pool mt-bench", "theory", "speed (6 interleaved rounds"):
        assert f"] {stage}" in text and f"{stage}" in text
    assert re.search(r"pool mt-bench: shard 1 built \(1 thread\), \d+ of 40 positions", text)
    assert "ETA " in text
    assert re.search(r"theory: 1 of 3 decodes", text) or re.search(r"theory: mt-bench sps", text)
    assert any(line.endswith("done in 0:00") or "done in" in line for line in lines)
    assert any("speed: sps: " in line for line in lines)


def test_a_rerun_reads_everything_back(section, tiny_pair):
    out, found, _ = section
    again = real_model.run(
        out, quick=True, progress=False, pair=tiny_pair, say=lambda text: None,
        prompts={"mt-bench": PROMPTS}, pool_settings=POOL, theory_settings=THEORY,
        speed_settings=SPEED, dtypes=DTYPES,
    )  # fmt: skip
    entry = again["tradeoff"]["mt-bench"]
    assert again["costs"] == found["costs"]  # the speed check's runs are read back
    assert again["speed"]["rows"] == found["speed"]["rows"]
    assert entry["pool_info"]["shards_built"] == 0
    assert page_real.pool_line(entry).endswith("prompts, read back from the cache")
    first = found["tradeoff"]["mt-bench"]
    assert f"built in this run ({first['pool_info']['shards_built']} shard" in (
        page_real.pool_line(first)
    )
    assert entry["document"] == found["tradeoff"]["mt-bench"]["document"]
    # The decodes are read back: the same rows, no decoding time this run.
    assert again["theory"]["mt-bench"]["rows"] == found["theory"]["mt-bench"]["rows"]
    assert (
        again["theory"]["mt-bench"]["decoded_seconds"]
        == 0
        < (found["theory"]["mt-bench"]["decoded_seconds"])
    )


def test_the_theory_rows_are_the_comparison_on_the_same_prompts_and_positions(section, tiny_pair):
    """Oracle: ``theory.compare`` of decodes made again with no cache, against the pool
    built again with no cache and restricted to the compared prompts and positions; equal
    to the last bit (NaN standard errors stored as null)."""
    _, found, _ = section
    table = found["theory"]["mt-bench"]
    assert table["settings"]["num_prompts"] == THEORY.num_prompts
    setup = load_setup(tiny_pair, torch.device("cpu"), "float32")
    setup.prompts = list(PROMPTS)
    pool = pools.build_pool(setup, POOL, None, device="cpu", dtype="float32", progress=False)
    subset = theory.restrict(pool, THEORY)
    assert set(subset.prompt.tolist()) == set(range(THEORY.num_prompts))
    assert subset.step.max() < THEORY.max_new_tokens < POOL.max_new_tokens
    expected = []
    for rule in real_model.THEORY_RULES:
        decoded = theory.decode(
            setup, THEORY, rule, None, device="cpu", dtype="float32", progress=False
        )
        row = theory.compare(subset, decoded, rule, THEORY.k, THEORY.max_new_tokens)
        expected.append({key: real_model._strict(value) for key, value in row.items()})
    assert table["rows"] == expected
    assert [row["rule"] for row in table["rows"]] == ["sps", "cactus:delta=1.0"]
    assert table["rows"][0]["positions"] == len(subset)


def test_the_page_quotes_the_json_numbers_and_prints_no_degenerate_interval(section):
    _, found, _ = section
    page = page_real.real_model_section(found)
    document = found["tradeoff"]["mt-bench"]["document"]
    sps, cactus = document["rows"][0], real_model.find_row(document, "cactus:delta=1.0")
    gain = 100 * (cactus["acceptance"] - sps["acceptance"])
    sentence = (
        f"On MT-Bench ({document['positions']:,} positions), Cactus δ=1 accepts "
        f"{cactus['acceptance']:.3f} vs SpS&#x27;s {sps['acceptance']:.3f} ({gain:+.1f} "
        f"points) at KL "
    )
    assert sentence in page
    assert f"the frontier reaches {cactus['frontier_acceptance']:.3f} at that KL." in page
    assert f"TV {cactus['tv_per_token']:.3f};" in page
    assert "first draft position" in page and "deeper draft positions" in page
    assert not DEGENERATE.search(page)
    assert "Dominance checked" in page
    sps_theory = found["theory"]["mt-bench"]["rows"][0]
    assert (
        f"SpS: the pool&#x27;s exact α {sps_theory['pool_alpha']:.3f} against the decoder&#x27;s "
        f"measured α₁ {sps_theory['measured_alpha']:.3f} over {sps_theory['drafted_steps']} "
        f"verify steps, z = {sps_theory['pool_z']:+.1f}"
    ) in page
    assert "The theory against the decoder" in page and "α by draft position 1..2" in page
    # The predicted speed-up never stands alone: the costs with intervals, the speed check.
    predicted = f"{cactus['predicted_speedup'][str(SPEED.k)]:.2f}x"
    assert f"<td>{predicted}</td>" in page and "It is a prediction" in page
    assert "The predicted speed-up against a measured one" in page
    speed_sps = found["speed"]["rows"][1]
    measured = (
        f"{speed_sps['speedup']:.2f}x [{speed_sps['speedup_low']:.2f}, "
        f"{speed_sps['speedup_high']:.2f}]"
    )
    assert f"<td>{measured}</td>" in page
    assert html_escape(speed_sps["why"]) in page
    assert f"c = {found['costs']['draft_cost']['median']:.3f} [" in page
    assert "pools and theory in float32" in page and "Dtypes were chosen by measurement" in page
    # A planted violation is shown as one (the check's own tests plant it in the rows).
    planted = json.loads(json.dumps(found))
    planted["tradeoff"]["mt-bench"]["violations"] = ["tas: acceptance 0.9 > frontier 0.5"]
    shown = page_real.real_model_section(planted)
    assert "1 dominance violation(s)" in shown and "tas: acceptance 0.9 &gt; frontier" in shown


def html_escape(text):
    import html

    return html.escape(text)


def test_the_theory_verdict_says_when_sps_disagrees():
    """The sentence follows z: within 3 standard errors it agrees, beyond it says so (the
    negative control a wrong pool or decoder would produce); no SE, no sentence."""
    row = {
        "rule": "sps", "label": "sps", "pool_alpha": 0.44, "pool_alpha_se": 0.01,
        "measured_alpha": 0.45, "measured_alpha_se": 0.02, "pool_z": -0.5,
        "alpha_step_starts": 0.45, "alpha_all_positions": 0.47, "alpha_by_position": [0.45, None],
        "predicted_al": 0.63, "predicted_al_se": 0.02, "measured_al": 0.55,
        "measured_al_se": None, "drafted_steps": 300,
    }  # fmt: skip
    settings = {"k": 2, "num_prompts": 8, "max_new_tokens": 64, "batch_size": 8, "seed": 0,
                "sampling": "T=0.6"}  # fmt: skip
    table = {"settings": settings, "rows": [row]}
    agree = page_real.theory_section({"theory": {"mt-bench": table}})
    assert "z = -0.5 (paired, by prompt): they agree within 3 standard errors" in agree
    assert "<td>0.45 / –</td>" in agree and "<td>0.55</td>" in agree  # no ± without an SE
    row["pool_z"] = -4.2
    assert "differ by more than 3 standard errors" in page_real.theory_section(
        {"theory": {"mt-bench": table}}
    )
    row["pool_z"] = None
    assert "SpS:" not in page_real.theory_section({"theory": {"mt-bench": table}})


def test_a_pool_too_short_for_the_theory_leaves_the_rest_in_place(tiny_pair, tmp_path):
    """The comparison decodes 20 tokens but the pool's continuations have 12: the theory
    check is unavailable with that reason, the trade-off and the speed check are there."""
    found = real_model.run(
        tmp_path, quick=True, progress=False, pair=tiny_pair, say=lambda text: None,
        prompts={"mt-bench": PROMPTS}, pool_settings=POOL, dtypes=DTYPES,
        theory_settings=theory.TheorySettings(k=2, num_prompts=2, max_new_tokens=20),
        speed_settings=SpeedSettings(k=2, num_prompts=1, max_new_tokens=4, rounds=1),
    )  # fmt: skip
    assert found["theory_unavailable"].startswith("ValueError: max_new_tokens: the pool's")
    assert "theory" not in found and found["tradeoff"]["mt-bench"]["document"]["rows"]
    assert found["speed"]["rows"][1]["speedup"] is None  # one round: no interval
    assert "Theory check unavailable: ValueError: max_new_tokens" in (
        page_real.real_model_section(found)
    )


def test_an_unloadable_pair_is_unavailable_with_its_reason(tmp_path, capsys):
    empty = tmp_path / "no-model"
    empty.mkdir()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hi\n")
    pair = Pair(str(empty), str(empty), str(prompts), "broken")
    said = []
    found = real_model.run(
        tmp_path, quick=True, progress=False, pair=pair, say=said.append,
        prompts={"mt-bench": PROMPTS}, pool_settings=POOL, dtypes=DTYPES,
    )  # fmt: skip
    assert set(found) == {"unavailable"} and found["unavailable"].startswith("ValueError: ")
    assert str(empty) in found["unavailable"]
    assert json.loads((tmp_path / real_model.OUTPUT).read_text()) == found
    page = page_real.real_model_section(found)
    assert "<b>Unavailable:</b> ValueError: " in page and "Traceback" not in page
    assert said[-1].endswith(f"] real-model section unavailable: {found['unavailable']}")


def test_the_full_report_checks_the_theory_on_every_set(section):
    """The full report compares the pool with the decoder on every evaluation set, each
    under its own title with its own SpS verdict."""
    assert real_model.THEORY_DATASETS == real_model.DATASETS
    _, found, _ = section
    table = found["theory"]["mt-bench"]
    page = page_real.theory_section({**found, "theory": {"mt-bench": table, "heldout": table}})
    titles = [f"<h4>{page_real.DATASET_TITLES[name]}</h4>" for name in ("mt-bench", "heldout")]
    assert page.index(titles[0]) < page.index(titles[1])
    assert page.count("SpS: the pool") == 2
