"""``decode.runs``: the per-position counts ``Totals`` pools over batches, and the step
costs (c, v, the rest, the predicted speed-up) on timings worked by hand."""

import pytest
import torch
import torch_tiny_models as tiny

from cactus_theory import decode
from cactus_theory.decode.runs import StepCosts, Totals, step_costs, step_seconds

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_step_seconds_is_the_baseline_time_per_call_outside_the_prefill():
    assert step_seconds({"total": 5.0, "prefill": 1.0, "verifier_calls": 8}) == 0.5
    assert step_seconds({"total": 3.0, "verifier_calls": 4}) == 0.75  # no prefill span
    with pytest.raises(ValueError, match="^baseline: no verifier call"):
        step_seconds({"total": 1.0, "verifier_calls": 0})


def test_step_costs_on_a_timing_worked_by_hand():
    """T = 0.5 s per step; 6 draft tokens in 3 s: c = 0.5 / 0.5 = 1; 2 verify calls in 4 s:
    v = 2 / 0.5 = 4; the rest (10 − 1 − 3 − 4 = 2 s over 2 calls) = 2 steps per call;
    predicted (AL + 1) / (k c + v) = 2.5 / 7."""
    timing = {"total": 10.0, "prefill": 1.0, "draft": 3.0, "verify": 4.0, "verifier_calls": 2}
    costs = step_costs(timing, drafted=6, k=3, acceptance_length=1.5, step=0.5)
    assert costs == StepCosts(1.0, 4.0, 2.0, 2.5 / 7.0)
    with pytest.raises(ValueError, match="^step: the baseline's seconds per step must be > 0"):
        step_costs(timing, drafted=6, k=3, acceptance_length=1.5, step=0.0)


def test_totals_pool_the_per_position_counts_of_every_batch():
    """Two batches of different lengths: ``reached_by_position`` is their sum position by
    position, accepted_by_position[j] counts the steps with at least j + 1 accepted, and the
    identities Σ_j accepted_j = Σ accepted drafts and Σ_j reached_j = the positions scanned
    hold exactly."""
    verifier = tiny.llama(seed=0, vocab=99, dtype=torch.float64, init=0.2)
    draft = tiny.perturbed(verifier, scale=0.6, seed=1)
    tokenizer = tiny.chatml_tokenizer()
    totals, results = Totals(), []
    for k, seed in ((4, 0), (2, 1)):
        ids, mask = tiny.left_padded_prompts(batch=3, vocab=99, seed=seed, pads=(0, 2, 1))
        result = decode.speculative_generate(
            verifier, draft, ids, rule="sps", k=k, max_new_tokens=12,
            attention_mask=mask, generator=torch.Generator().manual_seed(seed), eos_token_id=[],
        )  # fmt: skip
        totals.add(result, verifier, mask, tokenizer)
        results.append(result)
    reached = [a + b for a, b in zip(*(r.reached_by_position for r in results), strict=False)]
    reached += results[0].reached_by_position[len(reached) :]  # only the k = 4 batch
    assert totals.reached_by_position == reached and len(reached) == 4
    for j in range(1, 5):
        taken = sum(int(((r.accepted_lengths >= j) & (r.draft_counts >= j)).sum()) for r in results)
        assert totals.accepted_by_position[j - 1] == taken
    assert sum(totals.accepted_by_position) == sum(totals.accepted)
    assert sum(totals.reached_by_position) == totals.scanned
    assert totals.steps == sum(r.steps for r in results) == len(totals.accepted)
    pairs = zip(totals.accepted_by_position, totals.reached_by_position, strict=True)
    assert totals.alpha_by_position == [taken / count for taken, count in pairs]
    assert 0 < totals.alpha_by_position[0] < 1  # the draft is neither perfect nor useless
