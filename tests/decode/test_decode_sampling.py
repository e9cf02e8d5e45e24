"""The decoder's sampled output follows the exact law; EOS and max_new_tokens are exact.

Law test: a vocabulary-8 model pair, one prompt repeated in N = 6000 rows, two new tokens
per row with k = 2 drafts. The first token's law is the one-position law of the rule for
(q, p) = the processed verifier and draft laws after the prompt
(``law.output_law``); the second token is then drawn from the verifier's processed law
after the first one (bonus or plain step), unchanged. So the exact joint law is
out(x1) · q(x2 | x1), computed by enumeration. Pearson chi-square at ALPHA = 1e-3 with
fixed seeds; the negative controls (the joint with the draft's p in place of out, and for
a lossy rule the lossless joint) must be rejected.
"""

import numpy as np
import pytest
import torch
import torch_tiny_models as tiny
from scipy import stats

from cactus_theory import decode, law, rules
from cactus_theory.core.processors import SamplingSettings
from cactus_theory.sampler.processors import process_logits

ALPHA = 1e-3
VOCAB = 8
ROWS = 6000
SETTINGS = SamplingSettings(temperature=1.0, top_k=6, top_p=0.97)
PROMPT = [5, 1, 6, 2]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pair():
    # init 0.3: peaked, clearly different laws (near-uniform ones would test nothing)
    verifier = tiny.llama(seed=10, vocab=VOCAB, hidden=16, init=0.3)
    draft = tiny.llama(seed=11, vocab=VOCAB, hidden=16, layers=1, init=0.3)
    return verifier, draft


def processed(model, tokens):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens], device=tiny.DEVICE)).logits[0, -1]
    return process_logits(logits, SETTINGS).cpu().numpy()


def exact_joint(first_law, verifier):
    joint = np.zeros((VOCAB, VOCAB))
    for token in np.flatnonzero(first_law > 0):
        joint[token] = first_law[token] * processed(verifier, PROMPT + [int(token)])
    return joint.reshape(-1)


def sample_pairs(generate, verifier, draft, rule, seed):
    ids = torch.tensor([PROMPT] * ROWS, device=tiny.DEVICE)
    result = generate(
        verifier,
        draft,
        ids,
        rule=rule,
        k=2,
        max_new_tokens=2,
        temperature=SETTINGS.temperature,
        top_k=SETTINGS.top_k,
        top_p=SETTINGS.top_p,
        generator=torch.Generator().manual_seed(seed),
    )
    new = result.sequences[:, len(PROMPT) :].numpy()
    return new[:, 0] * VOCAB + new[:, 1]


def p_value(cells, probabilities):
    counts = np.bincount(cells, minlength=probabilities.size).astype(float)
    if np.any(counts[probabilities == 0] > 0):
        return 0.0
    expected = probabilities * len(cells)
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    wanted = np.append(expected[big], expected[~big].sum())
    keep = wanted > 0
    return stats.chisquare(
        observed[keep], wanted[keep] * observed.sum() / wanted[keep].sum()
    ).pvalue


@pytest.mark.parametrize("spec", ["sps", "cactus:delta=0.1", "frontier:delta=0.1"])
def test_speculative_joint_law_of_two_tokens(pair, spec):
    verifier, draft = pair
    rule = rules.parse(spec)
    target_first, draft_first = processed(verifier, PROMPT), processed(draft, PROMPT)
    first = law.output_law(rule, target_first, draft_first)
    cells = sample_pairs(decode.speculative_generate, verifier, draft, rule, seed=21)
    assert p_value(cells, exact_joint(first, verifier)) > ALPHA
    # Negative control: as if the first token followed the draft's law.
    assert p_value(cells, exact_joint(draft_first, verifier)) < ALPHA
    if spec != "sps":  # a lossy rule is told apart from the lossless joint
        assert p_value(cells, exact_joint(target_first, verifier)) < ALPHA


def test_baseline_joint_law_of_two_tokens(pair):
    verifier, draft = pair
    cells = sample_pairs(decode.autoregressive_generate, verifier, draft, None, seed=22)
    assert p_value(cells, exact_joint(processed(verifier, PROMPT), verifier)) > ALPHA


@pytest.mark.parametrize("generate", [decode.speculative_generate, decode.autoregressive_generate])
@pytest.mark.parametrize("max_new", [0, 1, 2, 13])
def test_eos_and_max_new_tokens_are_exact(pair, generate, max_new):
    verifier, draft = pair
    eos, pad = 3, 7
    ids = torch.randint(0, VOCAB, (40, 5), generator=torch.Generator().manual_seed(1))
    result = generate(
        verifier,
        draft,
        ids.to(tiny.DEVICE),
        rule="cactus:delta=0.5",
        k=3,
        max_new_tokens=max_new,
        eos_token_id=eos,
        pad_token_id=pad,
        generator=torch.Generator().manual_seed(2),
    )
    generated = result.num_generated.tolist()
    assert result.sequences.shape == (40, 5 + max(generated))
    assert torch.equal(result.sequences[:, :5], ids)
    stopped_early = 0
    for row, length in zip(result.sequences[:, 5:].tolist(), generated, strict=True):
        tokens = row[:length]
        if eos in tokens:
            assert tokens.index(eos) == length - 1  # stops at the first EOS, which is kept
            stopped_early += length < max_new
        else:
            assert length == max_new
        assert row[length:] == [pad] * (len(row) - length)
    if max_new == 13:
        assert stopped_early > 0  # the EOS path was exercised


def test_same_seed_same_output_and_seed_matters(pair):
    verifier, draft = pair
    ids = torch.tensor([PROMPT] * 6, device=tiny.DEVICE)

    def run(seed):
        return decode.speculative_generate(
            verifier,
            draft,
            ids,
            rule="cactus:delta=0.5",
            k=3,
            max_new_tokens=10,
            generator=torch.Generator().manual_seed(seed),
        )

    first, again, other = run(5), run(5), run(6)
    assert torch.equal(first.sequences, again.sequences)
    assert torch.equal(first.accepted_lengths, again.accepted_lengths)
    assert not torch.equal(first.sequences, other.sequences)


def test_result_statistics(pair):
    verifier, draft = pair
    ids = torch.tensor([PROMPT] * 4, device=tiny.DEVICE)
    result = decode.speculative_generate(
        verifier,
        draft,
        ids,
        rule="sps",
        k=3,
        max_new_tokens=9,
        generator=torch.Generator().manual_seed(0),
    )
    valid = result.accepted_lengths[result.accepted_lengths >= 0]
    assert result.acceptance_length == pytest.approx(valid.float().mean().item())
    assert result.tokens_per_call == pytest.approx(1 + valid.float().mean().item())
    assert result.timing["verifier_calls"] == result.accepted_lengths.shape[0]
    assert result.total_tokens == 36 and result.tokens_per_second > 0
    assert [len(tokens) for tokens in result.new_tokens] == [9] * 4
    nll = decode.verifier_nll(verifier, result)
    assert 0 < nll < 10
