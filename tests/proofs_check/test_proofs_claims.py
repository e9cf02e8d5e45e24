"""The claims table in --quick mode, with its verdicts asserted where they are theorems.

One quick run (module fixture) serves every test here. Verdicts asserted to *hold* are
mathematical facts (proved in the report or in the literature); ``thm3.gamma`` and
``prop4.gsps`` are asserted to *fail*, with explicit counterexamples.
"""

import json
import math

import numpy as np
import pytest

import proofs_check
from cactus_theory import divergences, law, rules
from proofs_check import checks_laws

MUST_HOLD = {
    "thm1",
    "thm1.optimal",
    "thm3",
    "thm3.f",
    "lemma.between",
    "prop4",
    "cor5",
    "cor6",
    "cor6.sharp",
    "overshoot",
    "ours.cactus-exact.branch",
    "ours.frontier.budget",
    "ours.frontier.optimal",
    "ours.delta0",
    *(f"thm2.{name}" for name in ("kl", "reverse-kl", "chi2", "hellinger", "tv", "js")),
    *(f"ours.gamma.{name}" for name in ("kl", "reverse-kl", "chi2", "hellinger", "tv", "js")),
    # multi-draft (tree) verification: checks_trees and checks_trees_findings
    "trees.lossless",
    "trees.below-optimum",
    "trees.alpha-three-ways",
    "trees.rrs-acceptance",
    "trees.alpha-det",
    "trees.frontier-dominates",
    "trees.frontier-exact",
    "trees.cactus-tree-frontier",
    "trees.monotone",
    "trees.kseq-bound",
    "trees.without-replacement.rrs",
    "trees.without-replacement.optimum",
    "trees.sglang-kl",
    "trees.figure2",
}
MUST_FAIL = {"thm3.gamma", "prop4.gsps"}


@pytest.fixture(scope="module")
def result():
    return proofs_check.run(quick=True, seed=0, progress=False)


@pytest.fixture(scope="module")
def rows(result):
    return {item["id"]: item for item in result["claims"]}


def test_every_row_has_the_documented_keys_and_is_json(result):
    text = json.dumps(result, allow_nan=False)  # no NaN/inf anywhere
    assert json.loads(text) == result
    for item in result["claims"]:
        assert set(item) == {
            "id",
            "statement",
            "owner",
            "verdict",
            "instances",
            "worst_case",
            "counterexample",
        }
        assert item["owner"] in ("ours", "paper")
        assert item["verdict"] in ("holds", "fails")
        assert item["instances"] > 0
        assert (item["counterexample"] is None) == (item["verdict"] == "holds")


def test_the_table_covers_exactly_the_known_claims(rows):
    assert set(rows) == MUST_HOLD | MUST_FAIL


@pytest.mark.parametrize("claim", sorted(MUST_HOLD))
def test_theorems_hold(rows, claim):
    assert rows[claim]["verdict"] == "holds", rows[claim]


def test_our_guarantees_hold_so_the_exit_code_is_zero(result):
    assert result["guarantees_hold"] is True


def test_prop4_law_counterexample_is_real(rows):
    found = rows["prop4.gsps"]
    assert found["verdict"] == "fails"
    example = found["counterexample"]
    tas = rules.make("tas", epsilon=example["epsilon"], alpha=example["alpha"])
    tas_law = law.output_law(tas, example["target"], example["draft"])
    np.testing.assert_allclose(tas_law, example["tas_law"], atol=1e-12)
    assert np.abs(np.array(example["gsps_cross_entropy_law"]) - tas_law).max() > 1e-9


def test_gamma_counterexample_has_large_emitted_kl_within_per_branch_budget(rows):
    example = rows["thm3.gamma"]["counterexample"]
    rule = rules.parse(example["rule"])
    delta = rule.delta
    emitted = law.output_law(rule, example["target"], example["draft"])
    kl = divergences.kl(emitted / emitted.sum(), example["target"])
    assert kl == pytest.approx(example["kl_emitted"], rel=1e-9)
    assert kl > 10 * delta
    assert np.all(law.branch_divergence(rule, example["target"], example["draft"]) <= delta)
    growth = [value for _, value in example["growth"]]
    assert growth == sorted(growth) and growth[-1] > 50 * growth[0]


def test_gamma_curves_match_the_two_token_facts(result):
    curve = result["curves"]["gamma"]
    two = curve["by_vocab"]["2"]
    for index, delta in enumerate(curve["delta"]):
        # V = 2: the emitted law lies between q and one branch's h.
        assert two["cactus-exact"][index] == pytest.approx(delta, rel=1e-9)
        assert two["cactus"][index] == pytest.approx(math.log1p(2 * delta), rel=1e-9)
        # frontier emits exactly min(δ, KL(p‖q)).
        assert curve["rules"]["frontier"][index] == pytest.approx(delta, rel=1e-9)
        assert curve["rules"]["cactus-exact"][index] >= delta * (1 - 1e-12)
    assert len(curve["rules"]["cactus"]) == len(curve["delta"])


def test_overshoot_curve_matches_the_formula_to_1e9(result):
    curve = result["curves"]["branch_overshoot"]
    measured = np.array(curve["measured"])
    analytic = np.log1p(2 * np.array(curve["delta"])) / np.array(curve["delta"])
    np.testing.assert_allclose(measured, analytic, rtol=0, atol=1e-9)
    np.testing.assert_allclose(curve["analytic"], analytic, rtol=1e-15)


def test_markdown_has_table_formula_and_gamma(result):
    text = proofs_check.to_markdown(result)
    assert "| id | statement | verdict | instances | worst case | counterexample |" in text
    assert "log(1 + 2δ)/δ" in text and "1/(1 + 2δ)" in text
    assert "Measured Γ(δ)" in text
    for item in result["claims"]:
        assert f"`{item['id']}`" in text


def test_gamma_search_reaches_the_construction_and_it_grows_like_sqrt_delta(result):
    curve = result["curves"]["gamma"]
    for vocab, values in curve["construction"].items():
        for name in ("cactus", "cactus-exact"):
            measured = curve["by_vocab"][vocab][name]
            for found, built in zip(measured, values[name], strict=True):
                assert found >= built - 1e-8  # the seed nudges a up by 1e-9 (relative)
    # log(1/(M a)) = √(2(V − 2)δ) + O(δ): the emitted KL is of order √δ for V ≥ 3.
    delta = 1e-8
    for vocab in (3, 4, 8):
        built = checks_laws.construction_kl("cactus-exact", delta, vocab)
        assert built == pytest.approx(math.sqrt(2 * (vocab - 2) * delta), rel=1e-3)
