"""The draft and verify costs (``cactus_theory.real.costs``) from decoder timings worked by
hand, and measured on a tiny pair."""

import pytest
import torch_tiny_models as tiny

from cactus_theory.decode.runs import Pair, Setup
from cactus_theory.real import costs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_costs_from_timings_worked_by_hand():
    # autoregressive: 0.5 s after a 0.1 s prefill over 50 calls -> T = 0.01 s
    baseline = {"total": 0.6, "prefill": 0.1, "verifier_calls": 50}
    speculative = {
        # k = 1: 0.3 s drafting 30 tokens, 0.36 s of verify steps over 30 calls
        1: {"total": 0.76, "prefill": 0.1, "draft": 0.3, "verifier_calls": 30, "drafted": 30},
        # k = 3: 0.3 s drafting 30 tokens, 0.2 s of verify steps over 10 calls
        3: {"total": 0.6, "prefill": 0.1, "draft": 0.3, "verifier_calls": 10, "drafted": 30},
    }
    found = costs.costs_from_timings(baseline, speculative)
    assert found.step_seconds == pytest.approx(0.01)
    assert found.draft_cost == pytest.approx((0.6 / 60) / 0.01)  # 1.0 step per draft token
    assert found.verify_costs[1] == pytest.approx((0.36 / 30) / 0.01)  # 1.2 steps
    assert found.verify_costs[3] == pytest.approx((0.2 / 10) / 0.01)  # 2.0 steps
    assert found.as_json()["verify_costs"] == {"1": found.verify_costs[1], "3": 2.0}


def test_costs_from_timings_refuse_empty_runs():
    with pytest.raises(ValueError, match="baseline"):
        costs.costs_from_timings({"total": 1.0, "verifier_calls": 0}, {})
    with pytest.raises(ValueError, match="speculative"):
        costs.costs_from_timings({"total": 1.0, "verifier_calls": 4}, {})


def test_measure_costs_on_a_tiny_pair(verifier, tokenizer):
    tokenizer.padding_side = "left"
    draft = tiny.perturbed(verifier, scale=0.3)
    setup = Setup(verifier, draft, tokenizer, ["Hi", "Count to three"], tiny.DEVICE,
                  Pair("v", "d"), True)  # fmt: skip
    found = costs.measure_costs(setup, [1, 2], max_new_tokens=6, rounds=2)
    assert set(found.verify_costs) == {1, 2}
    assert found.draft_cost > 0 and found.step_seconds > 0
    assert all(value > 0 for value in found.verify_costs.values())
    assert found.settings["rounds"] == 2 and found.settings["num_prompts"] == 2
    with pytest.raises(ValueError, match="ks"):
        costs.measure_costs(setup, [0])
    with pytest.raises(ValueError, match="rounds"):
        costs.measure_costs(setup, [1], rounds=0)
