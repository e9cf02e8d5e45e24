"""KV-cache rollback: logits after a ragged rollback equal a fresh forward pass.

The decoder's cache keeps slots; rejected slots are cropped when every row rejects them,
and rows that still end in holes are right-aligned, so each row's valid slots stay
contiguous at the end (left padding). After two rounds of ragged rollbacks the logits of
the next token in every row must equal a forward pass without cache over that row's valid
tokens.
"""

import pytest
import torch
import torch_tiny_models as tiny

from cactus_theory.decode.cache import CachedModel, positions_of_prompt

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("build", [tiny.llama, tiny.gpt2])
def test_logits_after_rollback_equal_a_fresh_forward(build):
    model = build(seed=3)
    ids, mask = tiny.left_padded_prompts(batch=3, pads=(0, 2, 4))
    cached = CachedModel(model, 3, tiny.DEVICE)
    prefix_mask = mask[:, :-1]
    cached.forward(ids[:, :-1], prefix_mask, positions_of_prompt(prefix_mask))
    histories = [ids[row, :-1][prefix_mask[row] == 1].tolist() for row in range(3)]
    last = ids[:, -1]
    count = mask.sum(dim=1)
    generator = torch.Generator().manual_seed(0)
    for keep in ([1, 4, 2], [3, 3, 1]):  # new slots each row keeps, per round
        drafts = torch.randint(3, 97, (3, 4), generator=generator).to(tiny.DEVICE)
        block = torch.cat([last[:, None], drafts], dim=1)
        positions = (count - 1)[:, None] + torch.arange(5, device=tiny.DEVICE)[None]
        cached.forward(block, torch.ones_like(block), positions)
        kept = torch.tensor(keep, device=tiny.DEVICE)
        cached.keep(torch.arange(5, device=tiny.DEVICE)[None] < kept[:, None])
        assert cached.slots == cached.cache.get_seq_length()
        # Right-aligned: every row's valid slots are one run ending at the last slot.
        valid = cached.slot_mask.bool()
        assert bool(valid[:, -1].all())
        assert bool((valid[:, 1:].int() >= valid[:, :-1].int()).all())
        assert cached.slots == int(valid.sum(dim=1).max())
        for row in range(3):
            histories[row] += block[row, : keep[row]].tolist()
        count = count + kept
        last = torch.randint(3, 97, (3,), generator=generator).to(tiny.DEVICE)
    # The cache is as wide as the longest row's valid history, no wider.
    assert cached.slots == max(len(history) for history in histories) == 11
    logits = cached.forward(last[:, None], torch.ones_like(last[:, None]), (count - 1)[:, None])
    for row in range(3):
        tokens = torch.tensor([histories[row] + [int(last[row])]], device=tiny.DEVICE)
        fresh = model(input_ids=tokens).logits[0, -1]
        torch.testing.assert_close(logits[row, -1], fresh, rtol=1e-10, atol=1e-10)


def test_rows_leave_the_batch_without_disturbing_the_others():
    model = tiny.llama(seed=4)
    ids, mask = tiny.left_padded_prompts(batch=3, pads=(0, 1, 2))
    cached = CachedModel(model, 3, tiny.DEVICE)
    cached.forward(ids[:, :-1], mask[:, :-1], positions_of_prompt(mask[:, :-1]))
    keep = torch.tensor([0, 2], device=tiny.DEVICE)
    cached.select_rows(keep)
    count = mask.sum(dim=1)[keep]
    last = ids[keep, -1]
    logits = cached.forward(last[:, None], torch.ones_like(last[:, None]), (count - 1)[:, None])
    for index, row in enumerate(keep.tolist()):
        tokens = ids[row][mask[row] == 1][None]
        fresh = model(input_ids=tokens).logits[0, -1]
        torch.testing.assert_close(logits[index, -1], fresh, rtol=1e-10, atol=1e-10)
