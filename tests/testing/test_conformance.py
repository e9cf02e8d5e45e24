"""The conformance suite (``cactus_theory.testing.conformance``): its oracle, its statistics
and its verdicts on our own sampler and on samplers with planted defects.

Reduced draws here (the CLI runs 10^6 per law case); every statistical assertion is a
fixed-seed run at the suite's level, with a negative control the suite must catch.
"""

import math

import numpy as np
import pytest
import torch

from cactus_theory.core import rules
from cactus_theory.core.verify import inverse_cdf, verify_block
from cactus_theory.testing import conform
from cactus_theory.testing.conformance import cases, planted, reference, stats
from cactus_theory.testing.conformance.adapter import Adapter, layout_problem
from cactus_theory.testing.conformance.adapters import cactus_torch
from cactus_theory.testing.conformance.harness import LEVEL, PROPERTIES
from cactus_theory.testing.conformance.reference import Uniforms, decide, draw_uniforms

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def random_block(generator, batch=6, steps=3, vocab=9):
    target = generator.dirichlet(np.ones(vocab) * 0.5, size=(batch, steps + 1))
    draft = generator.dirichlet(np.ones(vocab) * 0.5, size=(batch, steps))
    draft[draft < 0.05] = 0
    draft /= draft.sum(-1, keepdims=True)
    ids = inverse_cdf(draft, generator.random((batch, steps)))
    return target, draft, ids


@pytest.mark.parametrize("spec", ["sps", "cactus:delta=0.5", "tas", "sglang:threshold_acc=0.5"])
def test_the_oracle_decides_as_the_numpy_reference(spec):
    rule = rules.parse(spec)
    generator = np.random.default_rng(1)
    for _ in range(20):
        target, draft, ids = random_block(generator)
        uniforms = draw_uniforms(generator, *ids.shape, target.shape[-1])
        expected, accepted = verify_block(
            rule, target, draft, ids, uniforms.accept, uniforms.sample
        )
        got = decide(rule, target, draft, ids, uniforms)
        np.testing.assert_array_equal(got.token_ids, expected)
        np.testing.assert_array_equal(got.num_accepted, accepted)


def test_the_exponential_race_samples_the_residual_law():
    """argmax r_i / E_i with E ~ Exp(1) is an exact sample of r: chi-square at 1e-3 on
    20,000 draws, and a wrong law (the target itself) is rejected."""
    rule = rules.make("sps")
    target = np.array([[0.5, 0.2, 0.3, 0.0], [0.1, 0.2, 0.3, 0.4]])
    draft = np.array([[0.1, 0.6, 0.2, 0.1]])
    draws = 20_000
    generator = np.random.default_rng(2)
    block = (np.broadcast_to(target, (draws, 2, 4)), np.broadcast_to(draft, (draws, 1, 4)))
    ids = np.ones((draws, 1), dtype=np.int64)  # token 1 (a_n = 1/3): rejected or accepted
    uniforms = Uniforms(
        np.full((draws, 1), 0.99), generator.random(draws), generator.exponential(size=(draws, 4))
    )
    got = decide(rule, *block, ids, uniforms, reference.EXPONENTIAL_RACE)
    counts = np.bincount(got.token_ids[:, 0], minlength=4)
    residual = np.clip(target[0] - draft[0], 0, None) / np.clip(target[0] - draft[0], 0, None).sum()
    assert stats.chi_square_pvalue(counts, residual) > 1e-3
    assert stats.chi_square_pvalue(counts, target[0]) < 1e-3


def test_the_next_coin_convention_reads_the_following_uniform():
    rule = rules.make("sps")
    target = np.array([[[0.0, 1.0], [0.5, 0.5], [0.5, 0.5]]])
    draft = np.array([[[1.0, 0.0], [0.5, 0.5]]])
    ids = np.array([[0, 0]])  # position 0 rejected (q_0 = 0): the residual is [0, 1]
    uniforms = Uniforms(np.array([[0.3, 0.9]]), np.array([0.1]), np.ones((1, 2)))
    got = decide(rule, target, draft, ids, uniforms, reference.INVERSE_CDF_NEXT_COIN)
    assert got.token_ids.tolist() == [[1, -1, -1]]
    both = np.full((1, 2, 2), 0.5)  # every draft accepted (a_n = 1)
    coins = Uniforms(np.array([[0.1, 0.2]]), np.array([0.9]), np.ones((1, 2)))
    bonus = decide(rule, target, both, np.array([[1, 0]]), coins, reference.INVERSE_CDF_NEXT_COIN)
    assert bonus.token_ids.tolist() == [[1, 0, 1]]  # the bonus drawn with sample = 0.9


@pytest.mark.parametrize(
    "tokens, accepted, message",
    [
        ([[3, 1, -1]], [1], "does not hold its draft"),
        ([[2, 9, -1]], [1], "outside [0, 5)"),
        ([[2, -1, -1]], [1], "outside [0, 5)"),
        ([[2, 1, 4]], [1], "are not -1"),
        ([[2, 1, -1]], [3], "outside [0, 2]"),
        ([[2, 1]], [1], "shape"),
    ],
)
def test_the_layout_check_catches_bad_outputs(tokens, accepted, message):
    ids = np.array([[2, 0]])
    assert layout_problem(np.array([[2, 1, -1]]), np.array([1]), ids, 5) is None
    problem = layout_problem(np.array(tokens), np.array(accepted), ids, 5)
    assert problem is not None and message in problem


def test_the_stated_power_holds_at_ten_to_the_six_draws():
    """10^6 draws over 16 bins at a per-test level of 1e-3/50 detect TV 0.005: the stated
    detectable TV is below it, the worst-direction law at TV 0.005 is rejected in at
    least 9 of 10 seeded runs, and the exact law in none."""
    level = LEVEL / 50
    assert stats.detectable_tv(10**6, 16, level) < 0.005
    law = np.random.default_rng(3).dirichlet(np.ones(16))
    order = np.argsort(law)
    signs = np.where(np.cumsum(law[order]) <= 0.5, 1.0, -1.0)[np.argsort(order)]
    shift = signs * law
    shifted = law + shift * (0.005 / (0.5 * np.abs(shift).sum()))
    assert abs(0.5 * np.abs(shifted - law).sum() - 0.005) < 1e-12
    caught = [
        stats.law_test(np.random.default_rng(seed).multinomial(10**6, shifted), law, level)
        for seed in range(10)
    ]
    null = [
        stats.law_test(np.random.default_rng(seed).multinomial(10**6, law), law, level)
        for seed in range(10)
    ]
    assert sum(not test["passed"] for test in caught) >= 9
    assert all(test["passed"] for test in null)


def test_our_sampler_passes_every_property():
    report = conform(cactus_torch.adapter("sps"), draws=20_000, examples=25)
    assert report.passed, str(report)
    statuses = {result.name: result.status for result in report.results}
    assert set(statuses) == set(PROPERTIES)
    assert statuses["seeded-batch-invariance"] == "n/a"  # one generator per batch
    assert all(s == "passed" for n, s in statuses.items() if "seeded" not in n)
    law = next(result for result in report.results if result.name == "law-emitted")
    assert law.level == pytest.approx(LEVEL / 24) and law.detectable_tv < 0.06
    dense = report.acceptance[0]
    assert dense.case == "dense" and np.allclose(dense.measured, dense.exact, atol=0.02)


@pytest.mark.parametrize(
    "defect, properties, draws",
    [
        (
            "acceptance-off-1%",
            ["exact-decisions", "exact-truncated", "law-accepted-count"],
            300_000,
        ),
        ("residual-unclamped", ["exact-decisions", "law-emitted"], 20_000),
        ("temperature-dropped", ["exact-logits", "law-logits"], 20_000),
        ("processors-twice", ["exact-logits", "law-logits"], 20_000),
    ],
)
def test_every_planted_defect_is_caught(defect, properties, draws):
    report = conform(planted.adapter(defect), draws=draws, examples=60, only=properties)
    failed = {result.name for result in report.failures}
    assert failed, str(report)
    law_properties = [name for name in properties if name.startswith("law")]
    assert set(law_properties) <= failed, str(report)


def test_a_defect_of_tv_below_0_005_is_caught_by_the_emitted_law_at_ten_to_the_six():
    """Acceptance off by 1% moves the emitted law at each position by TV 0.0018-0.0056;
    with 10^6 draws per case the position tests alone catch it."""
    report = conform(planted.adapter("acceptance-off-1%"), draws=10**6, only=["law-emitted"])
    result = report.results[0]
    assert result.status == "failed"
    caught = [test for test in result.tests if not test["passed"]]
    exact = {}
    for case in cases.law_cases(0)[:2]:
        target = case.target / case.target.sum(-1, keepdims=True)
        draft = case.draft / case.draft.sum(-1, keepdims=True)
        for position in range(case.steps):
            tv = planted.exact_tv("acceptance-off-1%", target[position], draft[position])
            exact[(case.name, f"position {position}")] = tv
    assert any(exact[(test["case"], test["test"])] < 0.005 for test in caught)
    assert all(test["detectable_tv"] <= 0.005 for test in result.tests if test["draws"] > 6e5)


def test_a_plain_function_is_checked_with_its_declarations():
    sps = rules.make("sps")

    def my_verify(target_probs, draft_probs, draft_ids, generator, uniforms=None):
        from cactus_theory import sampler

        given = (
            None if uniforms is None else cactus_torch.torch_uniforms(uniforms, torch.device("cpu"))
        )
        return sampler.verify(
            target_probs, draft_probs, draft_ids, sps, generator=None if given else generator,
            uniforms=given,
        )  # fmt: skip

    report = conform(my_verify, "sps", draws=5_000, examples=10, dtypes=())
    assert report.engine == "my_verify" and report.passed, str(report)
    assert report.status("exact-ragged") == "n/a" and report.status("exact-float16") == "n/a"


@pytest.mark.parametrize(
    "keywords, message",
    [
        ({"rule": "cactus:delta=-1"}, "delta"),
        ({"rule": 3}, "rule"),
        ({"draws": 0}, "draws"),
        ({"examples": 1.5}, "examples"),
        ({"level": 2}, "level"),
        ({"only": ["no-such-property"]}, "only"),
    ],
)
def test_bad_arguments_are_value_errors_naming_them(keywords, message):
    with pytest.raises(ValueError, match=message):
        conform(cactus_torch.adapter("sps"), **keywords)


def test_a_bad_adapter_is_a_value_error():
    with pytest.raises(ValueError, match="verify"):
        Adapter("x", verify=3)
    with pytest.raises(ValueError, match="recovery"):
        Adapter("x", verify=print, recovery="coin")
    with pytest.raises(ValueError, match="dtypes"):
        Adapter("x", verify=print, dtypes=("float8",))
    with pytest.raises(ValueError, match="name"):
        planted.adapter("nothing")
    with pytest.raises(ValueError, match="recovery"):
        conform(cactus_torch.adapter("sps").verify, recovery="coin")


def test_an_engine_that_raises_fails_its_properties_without_crashing_the_report():
    def broken(target_probs, draft_probs, draft_ids, generator, uniforms=None):
        raise RuntimeError("kernel exploded")

    report = conform(broken, draws=100, examples=3, dtypes=())
    assert not report.passed
    assert "raised RuntimeError: kernel exploded" in report.failures[0].detail
    assert report.status("law-emitted") == "failed"
    assert math.isfinite(report.level)
