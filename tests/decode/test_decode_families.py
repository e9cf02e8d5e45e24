"""Greedy speculative decoding, batched, equals each row's own greedy ``generate``, for
every ``transformers`` family in ``model_families`` (sliding windows included).

A batch of 4 ragged, left-padded prompts is decoded with a perturbed copy of the verifier
as the draft (rows accept different numbers of drafts, so the caches go ragged and are
right-aligned) and compared, token for token, with ``generate`` on each prompt alone
(no padding). The sliding-window cases use a window of 4 slots, far shorter than the
prompts plus the 16 new tokens, so a cache with holes would attend to the wrong tokens.
"""

import pytest
import torch
import torch_tiny_models as tiny
from model_families import CASES, build

from cactus_theory import decode

MAX_NEW = 16
PADS = (0, 3, 1, 5)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def alone(model, ids, mask):
    """Each prompt decoded by ``generate`` by itself, without padding."""
    rows = []
    for row in range(ids.shape[0]):
        prompt = ids[row][mask[row] == 1][None]
        out = model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=False,
            max_new_tokens=MAX_NEW,
            pad_token_id=0,
        )
        rows.append(out[0, prompt.shape[1] :].tolist())
    return rows


@pytest.mark.parametrize(("family", "window"), CASES, ids=[f"{f}-w{w}" for f, w in CASES])
@pytest.mark.parametrize("rule", ["sps", "cactus:delta=1.0"])
def test_batched_greedy_equals_each_row_alone(family, window, rule):
    verifier = build(family, window)
    ids, mask = tiny.left_padded_prompts(batch=4, length=7, pads=PADS)
    result = decode.speculative_generate(
        verifier,
        tiny.perturbed(verifier),
        ids,
        rule=rule,
        k=3,
        max_new_tokens=MAX_NEW,
        temperature=0,
        attention_mask=mask,
        eos_token_id=[],
        pad_token_id=0,
        generator=torch.Generator().manual_seed(0),
    )
    assert result.new_tokens == alone(verifier, ids, mask)
    # The batch was ragged: in some step the rows accepted different numbers of drafts.
    steps = result.accepted_lengths
    assert any(len(set(row[row >= 0].tolist())) > 1 for row in steps)
