"""``DecodeResult``'s per-position acceptance against counts worked by hand."""

import math

import torch

from cactus_theory.decode.result import DecodeResult


def result_of(accepted: list[list[int]], drafts: list[list[int]]) -> DecodeResult:
    accepted_lengths = torch.tensor(accepted)  # [steps, B]
    return DecodeResult(
        sequences=torch.zeros(accepted_lengths.shape[1], 1, dtype=torch.int64),
        prompt_length=1,
        num_generated=torch.zeros(accepted_lengths.shape[1], dtype=torch.int64),
        accepted_lengths=accepted_lengths,
        draft_counts=torch.tensor(drafts),
    )


def test_alpha_by_position_counts_the_steps_that_reached_each_draft():
    # Two rows, k = 3; row 1 is inactive (-1) at the last step and drafts 2 there once.
    result = result_of(
        accepted=[[0, 3], [2, 1], [3, 2], [1, -1]],
        drafts=[[3, 3], [3, 2], [3, 3], [3, 3]],
    )
    # Active steps: 7. Position 1 reached by all 7, accepted where length >= 1: 6.
    # Position 2 reached by steps with >= 2 drafts and length >= 1: all 6 -> accepted
    # (length >= 2): 4 ([0,1] 3, [1,0] 2, [2,0] 3, [2,1] 2).
    # Position 3 reached with >= 3 drafts and length >= 2: [0,1] 3, [1,0] 2, [2,0] 3,
    # [2,1] 2 -> 4; accepted (length 3): 2. The [1,1] step (2 drafts, 1 accepted) does
    # not reach position 3.
    assert result.steps == 7
    assert result.reached_by_position == [7, 6, 4]
    assert result.alpha_by_position == [6 / 7, 4 / 6, 2 / 4]


def test_alpha_by_position_is_nan_where_no_step_reached_and_empty_for_the_baseline():
    result = result_of(accepted=[[0], [0]], drafts=[[2], [2]])
    assert result.reached_by_position == [2, 0]
    alphas = result.alpha_by_position
    assert alphas[0] == 0.0 and math.isnan(alphas[1])
    baseline = result_of(accepted=[[0]], drafts=[[1]])
    baseline.accepted_lengths = torch.zeros(0, 1, dtype=torch.int64)  # [steps = 0, B]
    baseline.draft_counts = torch.zeros(0, 1, dtype=torch.int64)
    assert baseline.steps == 0 and baseline.alpha_by_position == []
