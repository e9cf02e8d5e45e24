"""Greedy speculative decoding equals the verifier's own greedy ``generate``, batched.

Left-padded batches of 5 prompts whose rows accept different numbers of drafts per step
(a perturbed copy of the verifier as the draft), an exact copy (every draft accepted, so
the draft lags one token each step), and an unrelated draft (almost nothing accepted).
float64 models make ``generate`` and the cached, chunked forward passes agree to ~1e-15,
far below any logit gap, so the comparison is token for token.

At temperature 0 both laws are one-hot. Every rule that gives no mass to tokens the
verifier gives none (sps, cactus, cactus-exact with KL or χ², frontier, tas, greedy,
topk with k = 1) then accepts exactly the verifier's argmax; interp, topk with k > 1 and
cactus-exact with tv/hellinger/js/reverse-kl may accept other drafts, by definition.
"""

import copy

import pytest
import torch
import torch_tiny_models as tiny

from cactus_theory import decode

MAX_NEW = 24


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def verifier():
    return tiny.llama(seed=0)


@pytest.fixture(scope="module")
def prompts():
    return tiny.left_padded_prompts()


def reference(model, prompts, eos=None, max_new=MAX_NEW):
    ids, mask = prompts
    return model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=max_new,
        eos_token_id=eos,
        pad_token_id=0,
    ).cpu()


def speculative(verifier, draft, prompts, rule, k, eos=None, max_new=MAX_NEW):
    ids, mask = prompts
    return decode.speculative_generate(
        verifier,
        draft,
        ids,
        rule=rule,
        k=k,
        max_new_tokens=max_new,
        temperature=0,
        eos_token_id=eos,
        pad_token_id=0,
        attention_mask=mask,
        generator=torch.Generator().manual_seed(0),
    )


@pytest.mark.parametrize(
    ("rule", "k"),
    [
        ("sps", 1),
        ("sps", 4),
        ("cactus:delta=1.0", 3),
        ("cactus-exact:delta=0.5", 5),
        ("frontier:delta=0.5", 6),
        ("cactus-exact:delta=0.3,divergence=chi2", 2),
        ("tas", 3),
        ("topk:k=1", 3),
        ("greedy", 8),
        # The engines' rules (greedy-consistent at these settings), on the generic adapter.
        ("sglang:threshold_single=0.3,threshold_acc=0.3", 3),
        ("relaxed:top_k=10,delta=0.6", 4),
        ("relaxed-ratio:top_k=3,ratio=0.3", 2),
    ],
)
def test_ragged_batch_matches_generate(verifier, prompts, rule, k):
    draft = tiny.perturbed(verifier)
    result = speculative(verifier, draft, prompts, rule, k)
    assert torch.equal(result.sequences, reference(verifier, prompts))
    assert result.num_generated.tolist() == [MAX_NEW] * 5
    # The batch really is ragged: some step accepted different counts in different rows.
    steps = result.accepted_lengths
    active = steps >= 0
    assert any(len(set(row[mask].tolist())) > 1 for row, mask in zip(steps, active, strict=True))
    assert 0.0 < result.acceptance_length <= k
    assert result.tokens_per_call == result.acceptance_length + 1


def test_with_eos_rows_stop_at_their_first_eos(verifier, prompts):
    plain = reference(verifier, prompts)
    eos = int(plain[1, prompts[0].shape[1] + 4])  # a token row 1 emits fifth
    expected = reference(verifier, prompts, eos=eos)
    assert expected.shape[1] < plain.shape[1] or (expected == eos).any()
    for k in (2, 5):
        result = speculative(verifier, tiny.perturbed(verifier), prompts, "sps", k, eos=eos)
        assert torch.equal(result.sequences, expected)


def test_perfect_draft_accepts_everything_and_lags_correctly(verifier, prompts):
    result = speculative(verifier, copy.deepcopy(verifier), prompts, "sps", 4)
    assert torch.equal(result.sequences, reference(verifier, prompts))
    full_steps = result.accepted_lengths[:-1]  # the last step may be shortened by the budget
    assert bool((full_steps[full_steps >= 0] == 4).all())


def test_unrelated_draft(verifier, prompts):
    result = speculative(verifier, tiny.llama(seed=7, layers=1), prompts, "cactus:delta=0.5", 3)
    assert torch.equal(result.sequences, reference(verifier, prompts))


def test_gpt2_models(prompts):
    verifier = tiny.gpt2(seed=2)
    result = speculative(verifier, tiny.perturbed(verifier), prompts, "sps", 3)
    assert torch.equal(result.sequences, reference(verifier, prompts))


def test_baseline_matches_generate(verifier, prompts):
    ids, mask = prompts
    result = decode.autoregressive_generate(
        verifier,
        None,
        ids,
        max_new_tokens=MAX_NEW,
        temperature=0,
        pad_token_id=0,
        attention_mask=mask,
    )
    assert torch.equal(result.sequences, reference(verifier, prompts))
    assert result.timing["verifier_calls"] == MAX_NEW


def test_prompt_of_one_token_and_batch_of_one(verifier):
    ids = torch.tensor([[17]], device=tiny.DEVICE)
    mask = torch.ones_like(ids)
    result = speculative(verifier, tiny.perturbed(verifier), (ids, mask), "sps", 3)
    assert torch.equal(result.sequences, reference(verifier, (ids, mask)))
