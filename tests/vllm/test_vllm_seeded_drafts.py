"""Seeded requests draw their drafts from their own generator (``vllm.seeded_drafts``).

Around vLLM's real ``compute_probs_and_sample_next_token`` on synthetic logits: a seeded
row's draft depends on its seed only (not on its batch index, the other rows or the default
generator), unseeded and greedy rows keep vLLM's own draws, and the redrawn tokens follow
p exactly (chi-square at the suite's level, with a negative control that must fail).
"""

import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("vllm.v1.sample.rejection_sampler", reason="vLLM is not installed here")

from goodness_of_fit import LEVEL, chi_square_pvalue  # noqa: E402

from cactus_theory.vllm import seeded_drafts  # noqa: E402

VOCAB = 12


@dataclasses.dataclass
class Metadata:
    """The fields of vLLM's ``SamplingMetadata`` the proposer's sampling reads."""

    temperature: torch.Tensor  # [B]
    generators: dict
    output_token_ids: list
    all_greedy: bool = False
    all_random: bool = True


def vllm_sampler():
    from vllm.v1.spec_decode import llm_base_proposer

    function = llm_base_proposer.compute_probs_and_sample_next_token
    return getattr(function, "__wrapped__", function)


def draft_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 2  # [B, V]


def sample(logits, metadata):
    return seeded_drafts.seeded_sample(vllm_sampler(), logits.clone(), metadata)


def test_a_seeded_row_depends_on_its_seed_only():
    row_logits = draft_logits(1, seed=7)[0]  # [V]
    tokens = []
    for batch_index, others, default_seed in [(0, 2, 1), (2, 3, 2), (1, 1, 3)]:
        logits = draft_logits(others + 1, seed=default_seed)
        logits[batch_index] = row_logits
        metadata = Metadata(
            temperature=torch.full((others + 1,), 0.8),
            generators={batch_index: torch.Generator().manual_seed(1234)},
            output_token_ids=[[] for _ in range(others + 1)],
        )
        torch.manual_seed(default_seed)  # the default generator differs every time
        draws = [int(sample(logits, metadata)[0][batch_index]) for _ in range(20)]
        tokens.append(draws)
    assert tokens[0] == tokens[1] == tokens[2]
    assert len(set(tokens[0])) > 1  # a real sample, not an argmax


def test_unseeded_and_greedy_rows_keep_vllms_draws():
    logits = draft_logits(4)
    metadata = Metadata(
        temperature=torch.tensor([0.8, 0.0, 0.8, 0.8]),
        generators={1: torch.Generator().manual_seed(5), 2: torch.Generator().manual_seed(6)},
        output_token_ids=[[] for _ in range(4)],
        all_random=False,
    )
    torch.manual_seed(0)
    plain, plain_probs = vllm_sampler()(logits.clone(), metadata)
    torch.manual_seed(0)
    wrapped, probs = sample(logits, metadata)
    assert torch.equal(probs, plain_probs)
    assert wrapped[[0, 1, 3]].tolist() == plain[[0, 1, 3]].tolist()  # unseeded, greedy (1)
    assert int(wrapped[1]) == int(logits[1].argmax())
    everything_greedy = dataclasses.replace(metadata, all_greedy=True)
    tokens, _ = sample(logits, everything_greedy)
    assert tokens.tolist() == logits.argmax(-1).tolist()


def test_request_major_rows_of_parallel_drafting_use_their_requests_generator():
    metadata = Metadata(
        temperature=torch.full((6,), 1.0),  # 2 requests x 3 rows, repeated as vLLM does
        generators={1: torch.Generator().manual_seed(3)},
        output_token_ids=[[], []],
    )
    rows = seeded_drafts.seeded_rows(metadata, 6)
    assert [row for row, _ in rows] == [3, 4, 5]
    assert seeded_drafts.seeded_rows(metadata, 5) == []  # no request-major layout: untouched


def test_redrawn_drafts_follow_p_exactly():
    """20,000 draws of one seeded row at T = 0.7 against softmax(logits / 0.7): p-value
    above LEVEL; the negative control (the law at T = 1) must be rejected."""
    logits = draft_logits(1, seed=11)
    temperature = 0.7
    metadata = Metadata(
        temperature=torch.full((1,), temperature),
        generators={0: torch.Generator().manual_seed(99)},
        output_token_ids=[[]],
    )
    counts = np.zeros(VOCAB)
    for _ in range(20_000):
        counts[int(sample(logits, metadata)[0][0])] += 1
    law = torch.softmax(logits[0] / temperature, dim=-1).double().numpy()
    wrong = torch.softmax(logits[0], dim=-1).double().numpy()
    assert chi_square_pvalue(counts, law) > LEVEL
    assert chi_square_pvalue(counts, wrong) < LEVEL


def test_install_wraps_the_proposer_once():
    from vllm.v1.spec_decode import llm_base_proposer

    assert seeded_drafts.install()
    first = llm_base_proposer.compute_probs_and_sample_next_token
    assert seeded_drafts.install()
    assert llm_base_proposer.compute_probs_and_sample_next_token is first
    assert getattr(first, seeded_drafts.MARK)
