"""``model.generate(custom_generate=cactus_generate, tree=...)``: greedy equals plain
``generate``, the output carries the tree statistics, and a seed gives
``speculative_generate``'s tokens."""

import pytest
import torch
import torch_tiny_models as tiny

from cactus_theory import decode
from cactus_theory.decode.hf import cactus_generate

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_generate_with_a_tree():
    verifier = tiny.llama(seed=0)
    draft = tiny.perturbed(verifier)
    ids, mask = tiny.left_padded_prompts()
    plain = verifier.generate(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=0
    )
    out = verifier.generate(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=0,
        custom_generate=cactus_generate, draft_model=draft, rule="walk", tree="4,2,1",
        return_dict_in_generate=True,
    )  # fmt: skip
    assert torch.equal(out.sequences, plain)
    assert out.tree_outcomes.shape[1:] == (5, 3) and bool((out.acceptance_length > 0).all())
    sampled = verifier.generate(
        input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.8, top_k=10,
        max_new_tokens=12, pad_token_id=0, custom_generate=cactus_generate, draft_model=draft,
        rule="cactus:delta=1.0", tree="dynamic:6,depth=3,top=2",
        generator=torch.Generator().manual_seed(4), return_dict_in_generate=True,
    )  # fmt: skip
    direct = decode.speculative_generate(
        verifier, draft, ids, rule="cactus:delta=1.0", tree="dynamic:6,depth=3,top=2",
        attention_mask=mask, max_new_tokens=12, temperature=0.8, top_k=10, pad_token_id=0,
        generator=torch.Generator().manual_seed(4),
    )  # fmt: skip
    assert torch.equal(sampled.sequences.cpu(), direct.sequences)
    assert torch.equal(sampled.sequence_kl, direct.sequence_kl)
