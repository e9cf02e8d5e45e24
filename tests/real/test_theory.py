"""The theory against the decoder (``cactus_theory.real.theory``) on tiny random models.

- step starts from accepted lengths on a batch worked by hand, and bad step logs refused;
- step starts simulated on a pool's trajectories, worked by hand at acceptance 0 and 1;
- the chance that an emitted token was an accepted draft is min(p, q)/q for sps;
- the prompt-clustered standard errors on numbers worked by hand;
- the exact acceptance per position averages to ``tradeoff.rule_stats``' acceptance;
- draft = verifier under sps: α₁ = 1 and pool α = 1;
- the measured α₁ is the decoder's own ``alpha_by_position[0]``;
- sps on a perturbed draft: pool α, α at the step starts and the pool's α at simulated
  step starts agree with the measured α₁ within 3 standard errors (level: a two-sided 3-SE
  band, about 0.3% false alarms for a normal difference; fixed seeds), and the negative
  controls are caught beyond 3 SE: a pool at another temperature (T = 2 against a decode
  at T = 0.8), and a lossy rule's exact acceptance against an sps decode (pool and step
  starts both);
- a cached decode is read back to the same arrays.
"""

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch_tiny_models as tiny

from cactus_theory.core.processors import SamplingSettings
from cactus_theory.decode import speculative_generate
from cactus_theory.decode.runs import Pair, Setup, encode
from cactus_theory.real import pools, theory, tradeoff

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = [
    "Hi",
    "What is 2+2?",
    "Name a colour.",
    "Spell cat",
    "Count to three",
    "Say yes",
    "abc",
    "Tell me",
    "x y z",
    "Why?",
    "hello there",
    "ok",
]
SAMPLING = SamplingSettings(temperature=0.8)
SETTINGS = theory.TheorySettings(
    k=3, num_prompts=12, max_new_tokens=32, sampling=SAMPLING, batch_size=6, seed=0
)


@pytest.fixture(scope="module")
def setup(verifier, tokenizer):
    tokenizer.padding_side = "left"
    draft = tiny.perturbed(verifier, scale=0.3)
    return Setup(verifier, draft, tokenizer, list(PROMPTS), tiny.DEVICE, Pair("v", "d"), True)


@pytest.fixture(scope="module")
def pool(setup):
    return pools.build_pool(
        setup, SETTINGS.pool_settings(), None, device="cpu", dtype="float64", progress=False
    )


@pytest.fixture(scope="module")
def sps_decode(setup):
    return theory.decode(
        setup, SETTINGS, "sps", None, device="cpu", dtype="float64", progress=False
    )


# --- step starts ----------------------------------------------------------------------------


def test_step_starts_on_a_batch_worked_by_hand():
    # row 0: accepts 2 then 1 then stops; row 1: 0, 3, then a last plain step (k_b = 0);
    # row 2: one step accepting 1, then finished.
    accepted = [[2, 0, 1], [1, 3, -1], [-1, 0, -1]]
    drafts = [[3, 3, 3], [3, 3, -1], [-1, 0, -1]]
    steps = theory.step_starts(accepted, drafts)
    np.testing.assert_array_equal(steps.row, [0, 0, 1, 1, 1, 2])
    # row 0: 0, then 0 + (2 + 1) = 3; row 1: 0, 1, 1 + 4 = 5; row 2: 0
    np.testing.assert_array_equal(steps.start, [0, 3, 0, 1, 5, 0])
    np.testing.assert_array_equal(steps.accepted, [2, 1, 0, 3, 0, 1])
    np.testing.assert_array_equal(steps.drafts, [3, 3, 3, 3, 0, 3])


@pytest.mark.parametrize(
    ("accepted", "drafts", "message"),
    [
        ([1, 2], [3, 3], "accepted_lengths: must be"),
        ([[1, 2]], [[3, 3, 3]], "draft_counts: shape"),
        ([[4]], [[3]], "accepted more drafts"),
        ([[1], [-1], [0]], [[3], [-1], [3]], "active again"),
    ],
)
def test_bad_step_logs_are_value_errors(accepted, drafts, message):
    with pytest.raises(ValueError, match=message):
        theory.step_starts(accepted, drafts)


def test_step_starts_follow_the_decoders_commits(setup):
    """Without EOS every row generates exactly max_new_tokens: its steps tile them, the
    last step ending at the row's generated length (k_b shrinks near the budget)."""
    input_ids, mask = encode(setup, PROMPTS[:6])
    result = speculative_generate(
        setup.verifier, setup.draft, input_ids, rule="sps", k=3, max_new_tokens=24,
        temperature=0.8, generator=torch.Generator().manual_seed(4), attention_mask=mask,
        eos_token_id=[], divergence=False,
    )  # fmt: skip
    steps = theory.step_starts(result.accepted_lengths, result.draft_counts)
    ends = steps.start + steps.accepted + 1
    for row in range(6):
        mine = steps.row == row
        assert ends[mine][-1] == int(result.num_generated[row]) == 24
        np.testing.assert_array_equal(steps.start[mine][1:], ends[mine][:-1])


# --- statistics -----------------------------------------------------------------------------


def test_cluster_standard_errors_worked_by_hand():
    # R = 6 / 6 = 1; residuals x − R y = (−1, 0, 1): SE² = 3/2 · 2 / 36
    assert theory.ratio_se([1, 2, 3], [2, 2, 2]) == pytest.approx(math.sqrt(3) / 6)
    # the same ratio against itself: the difference has no error
    assert theory.paired_difference_se([1, 2, 3], [2, 2, 2], [1, 2, 3], [2, 2, 2]) == 0
    # against a constant ratio (no residual): the first ratio's own SE
    assert theory.paired_difference_se([1, 2, 3], [2, 2, 2], [1, 1, 1], [2, 2, 2]) == pytest.approx(
        math.sqrt(3) / 6
    )
    assert math.isnan(theory.ratio_se([1], [2]))


@pytest.mark.parametrize("rule", ["sps", "cactus:delta=1", "tas"])
def test_exact_acceptance_averages_to_rule_stats(pool, rule):
    per_position = theory.exact_acceptance(pool, rule)
    assert per_position.shape == (len(pool),)
    assert per_position.mean() == pytest.approx(tradeoff.rule_stats(pool, rule).acceptance, 1e-12)


def _line_pool(length: int, prompts: int = 1) -> pools.RealPool:
    """A pool of ``prompts`` trajectories of ``length`` positions (rows irrelevant here)."""
    count = length * prompts
    rows = np.full((count, 2), 0.5, np.float32)
    return pools.RealPool(
        rows, rows.copy(), None, 2, np.repeat(np.arange(prompts), length),
        np.tile(np.arange(length), prompts), np.zeros(count, np.int64),
    )  # fmt: skip


def test_simulated_step_starts_worked_by_hand():
    line = _line_pool(10)
    # every draft accepted: steps start at 0, 4, 8 (k = 3, each commits 4 tokens); at 8
    # the budget leaves k_b = min(3, 10 − 8 − 1) = 1 draft
    starts, weights = theory.simulated_step_starts(line, np.ones(10), 3, 10, replicates=5)
    np.testing.assert_array_equal(starts, np.tile([0, 4, 8], 5))
    np.testing.assert_allclose(weights, 0.2)
    # every draft rejected: a step at every position but the last (k_b = 0 there)
    starts, _ = theory.simulated_step_starts(line, np.zeros(10), 3, 10, replicates=1)
    np.testing.assert_array_equal(starts, np.arange(9))
    # a trajectory cut by EOS at 6 positions of a budget of 10 drafts up to its end
    short = _line_pool(6, prompts=2)
    starts, _ = theory.simulated_step_starts(short, np.ones(12), 3, 10, replicates=1)
    np.testing.assert_array_equal(starts, [0, 4, 6, 10])
    with pytest.raises(ValueError, match="replicates"):
        theory.simulated_step_starts(line, np.ones(10), 3, 10, replicates=0)


def test_step_starts_over_represent_hard_stretches():
    """The selection effect worked by hand: 10 easy positions (every draft accepted) then
    10 hard ones (every draft rejected), k = 3, a budget of 20. Steps start at 0, 4, 8
    (8 accepts 8 and 9, is rejected at 10: next start 11), then at 11..18 (19 has k_b = 0):
    3 easy starts of 11, so α at step starts is 3/11 where the positions' mean is 1/2."""
    line = _line_pool(20)
    easy = np.r_[np.ones(10), np.zeros(10)]
    starts, _ = theory.simulated_step_starts(line, easy, 3, 20, replicates=1)
    np.testing.assert_array_equal(starts, [0, 4, 8, *range(11, 19)])
    assert easy[starts].mean() == pytest.approx(3 / 11)
    assert easy.mean() == 0.5


def test_emitted_acceptance_of_sps_is_min_over_q_at_the_token(pool):
    """r = min(p, q)(x)/q(x) at the pool's sampled token x, from the dense rows."""
    found = theory.emitted_acceptance(pool, "sps")
    target, draft = pool.rows(slice(None), full=True)
    index = np.arange(len(pool))
    q, p = target[index, pool.token], draft[index, pool.token]
    np.testing.assert_allclose(found, np.minimum(p, q) / q, rtol=1e-12)
    assert 0 < found.mean() < 1


# --- the comparison -------------------------------------------------------------------------


def test_draft_equal_to_the_verifier_accepts_everything(setup):
    same = dataclasses.replace(setup, draft=setup.verifier)
    settings = dataclasses.replace(SETTINGS, num_prompts=6, max_new_tokens=16)
    pool = pools.build_pool(
        same, settings.pool_settings(), None, device="cpu", dtype="float64", progress=False
    )
    decoded = theory.decode(
        same, settings, "sps", None, device="cpu", dtype="float64", progress=False
    )
    row = theory.compare(pool, decoded, "sps", settings.k)
    assert row["pool_alpha"] == pytest.approx(1.0, abs=1e-9)
    assert row["measured_alpha"] == 1.0
    assert row["alpha_step_starts"] == pytest.approx(1.0, abs=1e-9)
    assert row["alpha_by_position"] == [1.0, 1.0, 1.0]


def test_measured_alpha_is_the_decoders_own(setup, sps_decode, pool):
    """One batch decoded again with the same generator: its ``alpha_by_position[0]``."""
    settings = dataclasses.replace(SETTINGS, num_prompts=6)
    decoded = theory.decode(
        setup, settings, "sps", None, device="cpu", dtype="float64", progress=False
    )
    input_ids, mask = encode(setup, PROMPTS[:6])
    result = speculative_generate(
        setup.verifier, setup.draft, input_ids, rule="sps", k=3, max_new_tokens=32,
        temperature=0.8, generator=theory.decode_generator(0, 0), attention_mask=mask,
        eos_token_id=setup.tokenizer.eos_token_id, pad_token_id=setup.tokenizer.pad_token_id,
        divergence=False,
    )  # fmt: skip
    row = theory.compare(pool, decoded, "sps", 3)
    assert row["measured_alpha"] == result.alpha_by_position[0]
    assert row["alpha_by_position"] == pytest.approx(result.alpha_by_position)
    assert row["measured_al"] == pytest.approx(result.acceptance_length)


def test_sps_agrees_within_three_standard_errors(pool, sps_decode):
    row = theory.compare(pool, sps_decode, "sps", SETTINGS.k, SETTINGS.max_new_tokens)
    assert row["drafted_steps"] > 100
    assert abs(row["pool_z"]) < 3
    assert abs(row["starts_z"]) < 3
    assert abs(row["simulated_z"]) < 3
    assert 0.2 < row["measured_alpha"] < 0.8  # a draft that disagrees often: a real test
    assert row["measured_alpha_se"] > 0 and row["pool_minus_measured_se"] > 0


def test_a_lossy_rule_agrees_at_its_step_starts(setup, pool):
    decoded = theory.decode(
        setup, SETTINGS, "cactus:delta=1", None, device="cpu", dtype="float64", progress=False
    )
    row = theory.compare(pool, decoded, "cactus:delta=1", SETTINGS.k)
    assert abs(row["starts_z"]) < 3


def test_a_pool_at_another_temperature_is_caught(setup, sps_decode):
    hot = dataclasses.replace(SETTINGS, sampling=SamplingSettings(temperature=2.0))
    other = pools.build_pool(
        setup, hot.pool_settings(), None, device="cpu", dtype="float64", progress=False
    )
    row = theory.compare(other, sps_decode, "sps", SETTINGS.k, SETTINGS.max_new_tokens)
    assert abs(row["pool_z"]) > 3
    assert abs(row["simulated_z"]) > 3


def test_a_lossy_rules_acceptance_against_an_sps_decode_is_caught(pool, sps_decode):
    row = theory.compare(pool, sps_decode, "cactus:delta=1", SETTINGS.k)
    assert row["pool_z"] > 3
    assert row["starts_z"] > 3


def test_a_cached_decode_reads_back_the_same_arrays(setup, tmp_path):
    settings = dataclasses.replace(SETTINGS, num_prompts=4, max_new_tokens=8, batch_size=2)
    first = theory.decode(
        setup, settings, "sps", tmp_path, device="cpu", dtype="float64", progress=False
    )
    again = theory.decode(
        setup, settings, "sps", tmp_path, device="cpu", dtype="float64", progress=False
    )
    assert first.info["batches_decoded"] == 2 and again.info["batches_decoded"] == 0
    assert len(list(tmp_path.glob("decode-*/batch-*.npz"))) == 2
    for name in ("row", "start", "accepted", "drafts"):
        np.testing.assert_array_equal(getattr(first.steps, name), getattr(again.steps, name))
    np.testing.assert_array_equal(first.rows.target_probs, again.rows.target_probs)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"k": 0}, "k: must be"),
        ({"num_prompts": 0}, "num_prompts: must be"),
        ({"max_new_tokens": -1}, "max_new_tokens: must be"),
        ({"batch_size": 1.5}, "batch_size: must be"),
        ({"sampling": SamplingSettings(temperature=0)}, "temperature:"),
    ],
)
def test_bad_settings_are_value_errors(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(SETTINGS, **changes)


def test_run_needs_a_rule(setup):
    with pytest.raises(ValueError, match="rule:"):
        theory.run({"d": setup}, SETTINGS, [], None, device="cpu", dtype="float64")


def test_a_decode_with_no_drafted_step_is_refused(setup, pool):
    """max_new_tokens = 1: every step is the last, plain one (k_b = 0): no α₁ to compare."""
    settings = dataclasses.replace(SETTINGS, num_prompts=2, max_new_tokens=1)
    decoded = theory.decode(
        setup, settings, "sps", None, device="cpu", dtype="float64", progress=False
    )
    assert len(decoded.steps.row) == 2 and not decoded.steps.drafts.any()
    with pytest.raises(ValueError, match="decoded: no verify step drafted"):
        theory.compare(pool, decoded, "sps", SETTINGS.k)


def test_restrict_keeps_the_compared_prompts_and_positions(pool):
    """A pool of longer continuations serves a shorter comparison: ``restrict`` keeps the
    first ``num_prompts`` prompts' positions below ``max_new_tokens``, rows unchanged."""
    shorter = dataclasses.replace(SETTINGS, num_prompts=5, max_new_tokens=20)
    kept = theory.restrict(pool, shorter)
    expected = (pool.prompt < 5) & (pool.step < 20)
    assert len(kept) == int(expected.sum()) > 0 and kept.info["positions"] == len(kept)
    np.testing.assert_array_equal(kept.target_probs, pool.target_probs[expected])
    np.testing.assert_array_equal(kept.draft_probs, pool.draft_probs[expected])
    np.testing.assert_array_equal(kept.step, pool.step[expected])
    # The whole comparison restricts to the whole pool.
    assert len(theory.restrict(pool, SETTINGS)) == len(pool)
    with pytest.raises(ValueError, match=r"^keep: must be a bool array of shape"):
        pool.select(np.ones(3, bool))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_new_tokens": 40}, "^max_new_tokens: the pool's continuations have 32 tokens"),
        ({"sampling": SamplingSettings(temperature=0.5)}, "^pool: sampled with "),
    ],
)
def test_restrict_refuses_a_pool_that_cannot_serve(pool, changes, message):
    with pytest.raises(ValueError, match=message):
        theory.restrict(pool, dataclasses.replace(SETTINGS, **changes))
