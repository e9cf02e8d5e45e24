"""Greedy tree decoding, batched and ragged, equals each row's own greedy ``generate`` for
every ``transformers`` family the tree masks support (``decode.tree_cache.TREE_FAMILIES``),
and a family's sliding window is honoured when it cannot cut (window = the whole run)."""

import pytest
import torch
import torch_tiny_models as tiny
from model_families import CASES, build
from test_decode_families import MAX_NEW, PADS, alone

from cactus_theory import decode
from cactus_theory.decode.tree_cache import TREE_FAMILIES, text_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: Every family without a window, and Mistral with a window the run never reaches.
TREE_CASES = [(family, None) for family, window in CASES if window is None] + [("mistral", 64)]


@pytest.mark.parametrize(("family", "window"), TREE_CASES, ids=[f for f, _ in TREE_CASES])
def test_batched_greedy_trees_equal_each_row_alone(family, window):
    verifier = build(family, window)
    assert text_config(verifier).model_type in TREE_FAMILIES
    ids, mask = tiny.left_padded_prompts(batch=4, length=7, pads=PADS)
    result = decode.speculative_generate(
        verifier, tiny.perturbed(verifier, scale=0.2), ids, rule="walk",
        tree="2,1,1,1",
        attention_mask=mask,
        max_new_tokens=MAX_NEW, temperature=0, eos_token_id=[], pad_token_id=0,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    assert result.new_tokens == alone(verifier, ids, mask)
    steps = result.accepted_lengths
    assert any(len(set(row[row >= 0].tolist())) > 1 for row in steps)  # ragged paths
