"""The report's real-model section (``cactus_theory.real.real_model`` and
``paper_figs.page_real``) on a tiny pair saved with ``save_pretrained`` and loaded back by
path, as the report loads the default pair.

- the JSON's trade-off rows equal ``real.tradeoff.tradeoff`` on the same pool built again
  independently (no cache), to the last bit, and its CSV is ``tradeoff.csv_text`` of them;
- the page's sentence carries the JSON's numbers; no degenerate interval ("[a, a]") is
  ever printed: a decoding table of 1 round with equal ends (the negative control) is
  rendered without any speed-up, one of 6 rounds with distinct ends with its interval;
- a pair that cannot be loaded gives the "unavailable" reason, in the JSON and on the page,
  and no traceback.
"""

import json
import re

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from cactus_theory.decode.runs import Pair, load_setup
from cactus_theory.real import pools, real_model, theory, tradeoff
from cactus_theory.real.decode_table import TableSettings
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
TABLE = TableSettings(
    rules=("sps", "cactus:delta=1.0"), ks=(2,), num_prompts=2, max_new_tokens=6, repeats=1
)
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
    found = real_model.run(
        out,
        quick=True,
        progress=False,
        pair=tiny_pair,
        say=lambda text: None,
        prompts={"mt-bench": PROMPTS},
        pool_settings=POOL,
        table_settings=TABLE,
        theory_settings=THEORY,
    )
    return out, found


def test_the_json_rows_are_the_exact_tradeoff_of_the_same_pool(section, tiny_pair):
    out, found = section
    stored = json.loads((out / real_model.OUTPUT).read_text())
    assert stored == json.loads(json.dumps(found))
    entry = stored["tradeoff"]["mt-bench"]
    setup = load_setup(tiny_pair, torch.device("cpu"), real_model.DTYPE)
    setup.prompts = list(PROMPTS)
    pool = pools.build_pool(
        setup, POOL, None, device="cpu", dtype=real_model.DTYPE, progress=False
    )  # built again from scratch: no cache
    assert pool.info["shards_built"] == -(-len(PROMPTS) // POOL.batch_size) or (
        len(pool) >= POOL.positions
    )
    assert entry["document"]["positions"] == len(pool) > 0
    costs = stored["costs"]  # measured once by the run (timings: not reproducible)
    assert set(costs["verify_costs"]) == {str(k) for k in range(1, real_model.K_MAX + 1)}
    expected = tradeoff.tradeoff(
        pool,
        tradeoff.default_rules(),
        k_max=real_model.K_MAX,
        draft_cost=costs["draft_cost"],
        verify_costs={int(k): value for k, value in costs["verify_costs"].items()},
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
    assert set(stored["timings"]) == {
        "load", "costs", "pools", "tradeoff", "decode_table", "theory"
    }  # fmt: skip
    assert set(cactus["predicted_speedup"]) == set(cactus["predicted_al"])
    table = stored["datasets"]["mt-bench"]
    assert table["rows"][0]["rule"] == "autoregressive"
    # One round: the JSON carries no speed-up either (no degenerate interval to reuse).
    assert "speedup_left_out" in table
    assert all(row["speedup"] is None and row["speedup_low"] is None for row in table["rows"][1:])
    assert [row["rule"] for row in table["rows"][1:]] == list(TABLE.rules)


def test_a_rerun_reads_the_pool_back(section, tiny_pair):
    out, found = section
    again = real_model.run(
        out, quick=True, progress=False, pair=tiny_pair, say=lambda text: None,
        prompts={"mt-bench": PROMPTS}, pool_settings=POOL, table_settings=TABLE,
        theory_settings=THEORY,
    )  # fmt: skip
    entry = again["tradeoff"]["mt-bench"]
    assert again["costs"] == found["costs"]  # read back, not measured again
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
    _, found = section
    table = found["theory"]["mt-bench"]
    assert table["settings"]["num_prompts"] == THEORY.num_prompts
    setup = load_setup(tiny_pair, torch.device("cpu"), real_model.DTYPE)
    setup.prompts = list(PROMPTS)
    pool = pools.build_pool(setup, POOL, None, device="cpu", dtype=real_model.DTYPE, progress=False)
    subset = theory.restrict(pool, THEORY)
    assert set(subset.prompt.tolist()) == set(range(THEORY.num_prompts))
    assert subset.step.max() < THEORY.max_new_tokens < POOL.max_new_tokens
    expected = []
    for rule in real_model.THEORY_RULES:
        decoded = theory.decode(
            setup, THEORY, rule, None, device="cpu", dtype=real_model.DTYPE, progress=False
        )
        row = theory.compare(subset, decoded, rule, THEORY.k, THEORY.max_new_tokens)
        expected.append({key: real_model._strict(value) for key, value in row.items()})
    assert table["rows"] == expected
    assert [row["rule"] for row in table["rows"]] == ["sps", "cactus:delta=1.0",
                                                       "cactus-exact:delta=1.0"]  # fmt: skip
    assert table["rows"][0]["positions"] == len(subset)


def test_the_page_quotes_the_json_numbers_and_prints_no_degenerate_interval(section):
    _, found = section
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
    assert "No speed-up is shown" in page and "speed-up (95% interval)" not in page
    assert not DEGENERATE.search(page)
    assert "Dominance checked" in page
    sps_theory = found["theory"]["mt-bench"]["rows"][0]
    assert (
        f"SpS: the pool&#x27;s exact α {sps_theory['pool_alpha']:.3f} against the decoder&#x27;s "
        f"measured α₁ {sps_theory['measured_alpha']:.3f} over {sps_theory['drafted_steps']} "
        f"verify steps, z = {sps_theory['pool_z']:+.1f}"
    ) in page
    assert "The theory against the decoder" in page and "α by draft position 1..2" in page
    three = f"{cactus['predicted_speedup']['3']:.2f}x"
    assert f"<td>{three}</td>" in page and "It is a prediction, not a measured speed-up" in page
    # A planted violation is shown as one (the check's own tests plant it in the rows).
    planted = json.loads(json.dumps(found))
    planted["tradeoff"]["mt-bench"]["violations"] = ["tas: acceptance 0.9 > frontier 0.5"]
    shown = page_real.real_model_section(planted)
    assert "1 dominance violation(s)" in shown and "tas: acceptance 0.9 &gt; frontier" in shown


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
    check is unavailable with that reason, the trade-off and decoding table are there."""
    found = real_model.run(
        tmp_path, quick=True, progress=False, pair=tiny_pair, say=lambda text: None,
        prompts={"mt-bench": PROMPTS}, pool_settings=POOL, table_settings=TABLE,
        theory_settings=theory.TheorySettings(k=2, num_prompts=2, max_new_tokens=20),
        costs={"num_prompts": 1, "max_new_tokens": 4, "rounds": 1},
    )  # fmt: skip
    assert found["theory_unavailable"].startswith("ValueError: max_new_tokens: the pool's")
    assert "theory" not in found and found["tradeoff"]["mt-bench"]["document"]["rows"]
    assert "Theory check unavailable: ValueError: max_new_tokens" in (
        page_real.real_model_section(found)
    )


def _decoding(repeats, low, high):
    row = {
        "rule": "sps", "label": "sps", "k": 3, "tokens": 64, "acceptance_length": 0.8,
        "tokens_per_call": 1.8, "tokens_per_second": 20.0, "speedup": 1.16,
        "speedup_low": low, "speedup_high": high, "kl_per_token": 0.0, "verifier_nll": 1.1,
        "alpha": 0.4,
    }  # fmt: skip
    settings = {
        "num_prompts": 2, "max_new_tokens": 32, "batch_size": 1, "seed": 0, "repeats": repeats,
        "sampling": {"temperature": 0.6, "top_k": 20, "top_p": 0.95},
    }  # fmt: skip
    return {"datasets": {"mt-bench": {"settings": settings, "rows": [row]}}}


def test_a_speedup_appears_only_with_an_honest_interval():
    # Negative control: 1 round, equal ends (what the old report printed as
    # "1.16x [1.16, 1.16]"): no speed-up at all.
    one_round = page_real.decoding_section(_decoding(1, 1.16, 1.16))
    assert "1.16x" not in one_round and not DEGENERATE.search(one_round)
    assert "No speed-up is shown" in one_round and "1 round," in one_round
    assert "the first 2 prompts of MT-Bench × 32 new tokens" in one_round
    # 6 rounds with equal ends: still no interval, and no bare speed-up.
    equal = page_real.decoding_section(_decoding(6, 1.16, 1.16))
    assert "1.16x" not in equal and not DEGENERATE.search(equal)
    # 6 rounds, distinct ends: the speed-up with its interval.
    honest = page_real.decoding_section(_decoding(6, 1.05, 1.24))
    assert "1.16x [1.05, 1.24]" in honest and "6 interleaved rounds" in honest
    # AL carries its 95% bound from its own counts: 64 tokens at 1.8 per call, k = 3.
    half = 1.959963984540054 * (0.8 * (3 - 0.8) / (64 / 1.8)) ** 0.5
    assert f"<td>0.80 ± {half:.2f}</td>" in one_round and f"{half:.2f}" == "0.44"
    none_accepted = _decoding(1, None, None)
    none_accepted["datasets"]["mt-bench"]["rows"][0]["acceptance_length"] = 0.0
    assert "<td>0.00</td>" in page_real.decoding_section(none_accepted)  # no "± 0.00"
    # The JSON keeps exactly the speed-ups the page shows.
    table = _decoding(6, 1.05, 1.24)["datasets"]["mt-bench"]
    assert real_model.honest_table(table)["rows"][0]["speedup"] == 1.16
    table = _decoding(1, 1.16, 1.16)["datasets"]["mt-bench"]
    assert real_model.honest_table(table)["rows"][0]["speedup_low"] is None
    # The decode-table helper may leave the speed-up None below 6 rounds.
    missing = _decoding(6, None, None)
    missing["datasets"]["mt-bench"]["rows"][0]["speedup"] = None
    assert "x [" not in page_real.decoding_section(missing)


def test_an_unloadable_pair_is_unavailable_with_its_reason(tmp_path, capsys):
    empty = tmp_path / "no-model"
    empty.mkdir()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hi\n")
    pair = Pair(str(empty), str(empty), str(prompts), "broken")
    said = []
    found = real_model.run(
        tmp_path, quick=True, progress=False, pair=pair, say=said.append,
        prompts={"mt-bench": PROMPTS}, pool_settings=POOL, table_settings=TABLE,
    )  # fmt: skip
    assert set(found) == {"unavailable"} and found["unavailable"].startswith("ValueError: ")
    assert str(empty) in found["unavailable"]
    assert json.loads((tmp_path / real_model.OUTPUT).read_text()) == found
    page = page_real.real_model_section(found)
    assert "<b>Unavailable:</b> ValueError: " in page and "Traceback" not in page
    assert said == [f"real-model section unavailable: {found['unavailable']}"]


def test_the_full_report_checks_the_theory_on_every_set(section):
    """The full report compares the pool with the decoder on every evaluation set, each
    under its own title with its own SpS verdict."""
    assert real_model.THEORY_DATASETS == real_model.DATASETS
    _, found = section
    table = found["theory"]["mt-bench"]
    page = page_real.theory_section({**found, "theory": {"mt-bench": table, "heldout": table}})
    titles = [f"<h4>{page_real.DATASET_TITLES[name]}</h4>" for name in ("mt-bench", "heldout")]
    assert page.index(titles[0]) < page.index(titles[1])
    assert page.count("SpS: the pool") == 2
