"""A feature draft with a reduced-vocabulary head (p = 0 outside its subset S) keeps every
rule exact: the emitted law is ``law.output_law(rule, q, p)`` for the p it sampled from,
and the meter reads the exact KL of that law.

Setting: a vocabulary-8 verifier, a feature draft whose head covers S = {0, 2, 3, 5, 7}
(the verifier's top token is outside S, so a decoder that used the full head would be
caught), processors T = 1, top-k 6, top-p 0.97. Every row decodes 2 tokens with k = 1
after the same prompt, so its first token is a verified position. Oracle: the exact laws
from numpy (``law.output_law``) with q and p from fresh float64 forwards. Pearson
chi-square at ALPHA = 1e-3 on ROWS first tokens, fixed seeds; negative controls: SpS's
sample against p and cactus's against q must be rejected. The meter: equality to 1e-9.
"""

import numpy as np
import pytest
import torch
import torch_tiny_models as tiny
from scipy import stats

from cactus_theory import decode, divergences, law, rules
from cactus_theory.core.processors import SamplingSettings
from cactus_theory.decode.feature_draft import FeatureDraft, FeatureDraftConfig
from cactus_theory.sampler.processors import process_logits

ALPHA = 1e-3
VOCAB = 8
ROWS = 20_000
SUBSET = torch.tensor([0, 2, 3, 5, 7])
SETTINGS = SamplingSettings(temperature=1.0, top_k=6, top_p=0.97)
PROMPT = [5, 1, 6, 2]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pair():
    verifier = tiny.llama(seed=10, vocab=VOCAB, hidden=16, init=0.3)
    config = FeatureDraftConfig(
        hidden_size=16, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=32,
        max_position_embeddings=512, vocab_subset=len(SUBSET),
    )  # fmt: skip
    draft = FeatureDraft.build(verifier, config, seed=11)
    for parameter in draft.parameters():
        torch.nn.init.normal_(parameter, std=0.3)
    draft.set_subset(SUBSET)
    return verifier, draft


@pytest.fixture(scope="module")
def laws(pair):
    """(q, p) after PROMPT, processed, float64 numpy; p from the draft fed the verifier's
    true features."""
    verifier, draft = pair
    ids = torch.tensor([PROMPT], device=tiny.DEVICE)
    with torch.no_grad():
        output = verifier(input_ids=ids, output_hidden_states=True)
        true = output.hidden_states[-1]  # [1, P, H]
        before = torch.cat([torch.zeros_like(true[:, :1]), true[:, :-1]], dim=1)
        draft_logits, _ = draft(ids, before)
    q = process_logits(output.logits[0, -1], SETTINGS).double().cpu().numpy()
    p = process_logits(draft_logits[0, -1], SETTINGS).double().cpu().numpy()
    return q, p


def first_tokens(pair, spec, seed):
    verifier, draft = pair
    ids = torch.tensor([PROMPT] * ROWS, device=tiny.DEVICE)
    result = decode.speculative_generate(
        verifier, draft, ids, rule=spec, k=1, max_new_tokens=2, eos_token_id=[],
        temperature=SETTINGS.temperature, top_k=SETTINGS.top_k, top_p=SETTINGS.top_p,
        generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    return result, result.sequences[:, len(PROMPT)].cpu().numpy()


def p_value(tokens, probabilities):
    counts = np.bincount(tokens, minlength=VOCAB).astype(float)
    if np.any(counts[probabilities == 0] > 0):
        return 0.0
    keep = probabilities > 0
    return stats.chisquare(counts[keep], probabilities[keep] * len(tokens)).pvalue


def test_the_draft_puts_no_mass_outside_its_subset(laws):
    q, p = laws
    outside = np.setdiff1d(np.arange(VOCAB), SUBSET.numpy())
    assert np.all(p[outside] == 0)
    assert int(np.argmax(q)) in outside  # the verifier's favourite is out of the draft's reach


def test_sps_emits_the_verifier_law(pair, laws):
    q, p = laws
    _, tokens = first_tokens(pair, "sps", seed=3)
    assert p_value(tokens, q) > ALPHA
    assert p_value(tokens, p) < ALPHA  # negative control


def test_cactus_emits_its_exact_law_and_the_meter_reads_its_kl(pair, laws):
    q, p = laws
    rule = rules.parse("cactus:delta=0.5")
    expected = law.output_law(rule, q, p)
    result, tokens = first_tokens(pair, "cactus:delta=0.5", seed=4)
    assert p_value(tokens, expected) > ALPHA
    assert p_value(tokens, q) < ALPHA  # negative control: it is not q
    np.testing.assert_allclose(
        result.token_kl[:, 0].numpy(), divergences.kl(expected, q), rtol=1e-9
    )
