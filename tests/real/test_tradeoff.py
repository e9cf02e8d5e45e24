"""The exact trade-off over a real pool (``cactus_theory.real.tradeoff``).

Oracle: the core's exact laws on whole rows (``law.acceptance``, ``law.output_law``,
``law.emitted_divergence``), averaged over positions by hand; tolerance 1e-9 (the pool
stores float32 rows, renormalised to float64 in both paths). The pool is synthetic but
built the way real pools are: top-k-truncated rows over a 400-token vocabulary packed to
their support by ``pools.pack_rows``.
"""

import json
import math

import numpy as np
import pytest
import torch

from cactus_theory import law, rules
from cactus_theory.core import divergences
from cactus_theory.real import pools, tradeoff

VOCAB = 400
POSITIONS = 300
TOP_K = 12


class VocabScaledCactus(rules.BranchRule):
    """Cactus with budget δ / log V: the vocabulary size changes γ, so packed rows would give
    other numbers (``support_only`` stays False)."""

    name = "test-vocab-scaled-cactus"

    def __init__(self, delta: float = 1.0) -> None:
        self.delta = float(delta)

    def params(self):
        return {"delta": self.delta}

    def raised_masses(self, target_probs, draft_probs, cap=None):
        budget = self.delta / math.log(target_probs.shape[-1])
        raised = np.minimum(
            1.0, target_probs + np.sqrt(2 * budget * target_probs * (1 - target_probs))
        )
        return raised if cap is None else np.minimum(raised, cap)


def truncated_rows(rows):
    dropped = np.argsort(-rows, axis=1)[:, TOP_K:]
    np.put_along_axis(rows, dropped, 0.0, axis=1)
    return rows / rows.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def pool():
    generator = np.random.default_rng(11)
    target = truncated_rows(generator.dirichlet(np.full(VOCAB, 0.05), size=POSITIONS))
    other = generator.dirichlet(np.full(VOCAB, 0.05), size=POSITIONS)
    draft = truncated_rows(0.6 * target + 0.4 * other)  # a draft that often agrees
    draft[:50] = target[:50]  # some positions where the draft is the verifier
    packed_target, packed_draft, ids = pools.pack_rows(
        torch.from_numpy(target), torch.from_numpy(draft), VOCAB
    )
    assert ids is not None  # packed, as a top-k pool is
    zeros = np.zeros(POSITIONS, dtype=np.int64)
    return pools.RealPool(
        packed_target, packed_draft, ids, VOCAB, zeros, np.arange(POSITIONS), zeros
    )


def whole_rows(pool):
    return pool.rows(slice(None), full=True)


RULES = ["sps", "tas", "cactus:delta=1.0", "cactus-exact:delta=0.5", "frontier:delta=0.2",
         "relaxed:top_k=10,delta=0.6", "sglang"]  # fmt: skip


@pytest.mark.parametrize("spec", [*RULES, VocabScaledCactus(0.01)], ids=str)
def test_rule_stats_equal_the_exact_laws_on_whole_rows(pool, spec):
    rule = rules.parse(spec) if isinstance(spec, str) else spec
    found = tradeoff.rule_stats(pool, rule)
    target, draft = whole_rows(pool)
    emitted = law.output_law(rule, target, draft)
    kl = law.emitted_divergence(rule, target, draft)
    assert found.positions == POSITIONS
    assert found.acceptance == pytest.approx(np.mean(law.acceptance(rule, target, draft)), abs=1e-9)
    assert found.tv_per_token == pytest.approx(
        np.mean(0.5 * np.abs(emitted - target).sum(axis=1)), abs=1e-9
    )
    finite = np.isfinite(kl)
    assert found.kl_infinite == pytest.approx(1 - finite.mean())
    if finite.all():
        assert found.kl_per_token == pytest.approx(kl.mean(), rel=1e-9, abs=1e-12)
    else:
        assert found.kl_per_token == math.inf
    if rules.exact_family(rule) == "branch":
        raised = rule.raised_masses(target, draft)
        per_branch = divergences.binary("kl", raised, target)
        expected = np.max(np.where(draft > 0, per_branch, -np.inf))
        assert found.max_branch_kl == pytest.approx(expected, rel=1e-9)


def test_a_rule_that_reads_the_vocabulary_is_computed_on_whole_rows(pool):
    """Negative control: on the packed rows the same rule accepts another amount, so a
    packed fast path would have given a wrong number with no error."""
    rule = VocabScaledCactus(0.01)  # a budget that binds
    packed_target, packed_draft = pool.rows(slice(None))
    packed = np.mean(law.acceptance(rule, packed_target, packed_draft))
    found = tradeoff.rule_stats(pool, rule)
    assert abs(found.acceptance - packed) > 1e-4  # 10^5 times the tolerance above
    assert found.family == "branch"


def test_the_frontier_dominates_every_rule_and_a_violation_is_caught(pool):
    result = tradeoff.tradeoff(pool, RULES, k_max=4, draft_cost=0.1, verify_costs={4: 1.5})
    assert tradeoff.dominance_violations(result) == []
    by_rule = {row.stats.spec: row for row in result.rows}
    sps = by_rule["sps"]
    assert sps.stats.kl_per_token == pytest.approx(0.0, abs=1e-12)
    assert sps.frontier_acceptance == pytest.approx(sps.stats.acceptance, abs=1e-9)
    for row in result.rows:
        assert row.stats.acceptance <= row.frontier_acceptance + 1e-9
        alpha = row.stats.acceptance
        assert row.predicted_al[3] == pytest.approx(alpha + alpha**2 + alpha**3)
        expected = (1 + alpha + alpha**2 + alpha**3 + alpha**4) / (4 * 0.1 + 1.5)
        assert row.predicted_speedup[4] == pytest.approx(expected)
    # the frontier curve rises with KL
    acceptances = [value for _, value in result.frontier]
    assert all(b >= a - 1e-12 for a, b in zip(acceptances, acceptances[1:], strict=False))
    # negative control: a row above the frontier is reported
    cheat = by_rule["cactus:delta=1.0"]
    cheat.frontier_acceptance = cheat.stats.acceptance - 0.01
    assert [line.split(":")[0] for line in tradeoff.dominance_violations(result)] == ["cactus"]


def test_json_and_csv_follow_the_schema(pool):
    # relaxed's top-16 of a row with 12 nonzero entries ties at zero: it accepts drafts the
    # verifier excludes, so its KL is infinite
    relaxed_spec = "relaxed:top_k=16,delta=0.6"
    result = tradeoff.tradeoff(pool, ["sps", "cactus:delta=1.0", relaxed_spec], k_max=2)
    data = tradeoff.to_json(result, pair={"verifier": "v"}, settings={"temperature": 0.6})
    again = json.loads(json.dumps(data, allow_nan=False))  # strict JSON: no inf, no NaN
    assert again["positions"] == POSITIONS and again["pair"] == {"verifier": "v"}
    row = again["rows"][1]
    assert row["rule"] == "cactus:delta=1.0" and row["label"]
    assert set(row) >= {"acceptance", "kl_per_token", "tv_per_token", "frontier_acceptance",
                        "predicted_al"}  # fmt: skip
    assert list(row["predicted_al"]) == ["1", "2"]
    assert all({"kl", "acceptance"} == set(point) for point in again["frontier"])
    lines = tradeoff.csv_text(again).splitlines()
    assert lines[0].startswith("rule,label,family,acceptance,kl_per_token")
    assert lines[0].endswith("predicted_al_1,predicted_al_2")
    assert len(lines) == 4
    relaxed = again["rows"][2]
    assert relaxed["kl_per_token"] is None
    assert ",inf," in lines[3]
    # at an infinite KL the frontier is h = p, which accepts every draft
    assert relaxed["frontier_acceptance"] == 1.0


def test_bad_arguments_name_themselves(pool):
    with pytest.raises(ValueError, match="k_max"):
        tradeoff.tradeoff(pool, ["sps"], k_max=0)
    with pytest.raises(ValueError, match="draft_cost"):
        tradeoff.tradeoff(pool, ["sps"], draft_cost=-1.0)
    with pytest.raises(ValueError, match="verify_cost"):
        tradeoff.predicted_speedup(0.5, 3, 0.1, verify_cost=0.0)
    with pytest.raises(ValueError, match="delta"):
        tradeoff.tradeoff(pool, ["cactus"])


def test_headline_reads_the_sps_and_cactus_rows_and_says_none_without_them():
    """The quotable sentence: rows found after parsing (``cactus:delta=1`` finds
    ``cactus:delta=1.0``), KL written by ``format_kl``; None when a row is missing or
    Cactus's KL is infinite (no sentence rather than a wrong one)."""
    document = {
        "positions": 2404,
        "rows": [
            {"rule": "sps", "acceptance": 0.4375, "kl_per_token": 0.0},
            {
                "rule": "cactus:delta=1.0",
                "acceptance": 0.5785,
                "kl_per_token": 0.1738,
                "tv_per_token": 0.1410,
                "frontier_acceptance": 0.5803,
            },
        ],
    }
    assert tradeoff.headline(document, "MT-Bench") == (
        "On MT-Bench (2,404 positions), Cactus δ=1 accepts 0.579 vs SpS's 0.438 (+14.1 "
        "points) at KL 0.1738 nats/token, TV 0.141; the frontier reaches 0.580 at that KL."
    )
    assert tradeoff.find_row(document, "cactus:delta=1") is document["rows"][1]
    assert tradeoff.headline({"positions": 1, "rows": document["rows"][:1]}, "x") is None
    infinite = {"positions": 1, "rows": [document["rows"][0], {**document["rows"][1]}]}
    infinite["rows"][1]["kl_per_token"] = None
    assert tradeoff.headline(infinite, "x") is None
    assert [tradeoff.format_kl(v) for v in (None, 1e-15, 2.5e-4, 0.1738)] == [
        "∞", "0", "2.50e-04", "0.1738"
    ]  # fmt: skip
