"""The feature draft (EAGLE-style): its cache gives exactly the laws of a fresh forward,
and speculative decoding with it keeps every guarantee of the decoder.

Cache test: three ragged rows, two rounds of drafting, verification with chosen accepted
counts and rollback. After each rollback the draft's law after the last committed token
must equal a fresh forward of the draft over the row's committed history fed with the
verifier's true features (computed by a fresh verifier forward); while drafting, each
next law must equal a fresh forward whose drafted positions carry the draft's own
predicted features. float64 models, tolerance 1e-10.
"""

import pytest
import torch
import torch_tiny_models as tiny

from cactus_theory import decode
from cactus_theory.decode.cache import CachedModel, FeatureDraftCache, positions_of_prompt
from cactus_theory.decode.feature_draft import FeatureDraft, FeatureDraftConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def config(rank, vocab_subset=None):
    return FeatureDraftConfig(
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        rank=rank,
        vocab_subset=vocab_subset,
    )


#: A reduced-vocabulary head's subset S of the tiny vocabulary (97 tokens).
SUBSET = torch.arange(3, 97, 2)  # 47 tokens


def subset_draft(verifier, seed):
    draft = FeatureDraft.build(verifier, config(None, len(SUBSET)), seed=seed)
    draft.set_subset(SUBSET)
    return draft


@pytest.fixture(scope="module")
def verifier():
    return tiny.llama(seed=0)


def fresh_draft_logits(verifier, draft, history, drafted=(), predicted=()):
    """The draft's logits after ``history`` (committed tokens, true features) followed by
    ``drafted`` tokens carrying the given ``predicted`` features; no cache."""
    ids = torch.tensor([history], device=tiny.DEVICE)
    with torch.no_grad():
        true = verifier(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
        features = torch.cat([torch.zeros_like(true[:1]), true[:-1]])  # f_{t-1}, 0 first
        tokens = list(history)
        if drafted:
            features = torch.cat([features, torch.stack(list(predicted))])
            tokens += list(drafted)
        logits, hidden = draft(torch.tensor([tokens], device=tiny.DEVICE), features[None])
    return logits[0, -1], hidden[0, -1]


@pytest.mark.parametrize("rank", [None, 8, "subset"])
def test_cached_laws_equal_fresh_forwards(verifier, rank):
    if rank == "subset":
        draft = subset_draft(verifier, seed=1)
    else:
        draft = FeatureDraft.build(verifier, config(rank), seed=1)
    if rank == 8:
        torch.nn.init.normal_(draft.projection)
    ids, mask = tiny.left_padded_prompts(batch=3, pads=(0, 2, 4))
    target = CachedModel(verifier, 3, tiny.DEVICE)
    drafter = FeatureDraftCache(draft, 3, tiny.DEVICE)
    prefix, prefix_mask = ids[:, :-1], mask[:, :-1]
    positions = positions_of_prompt(prefix_mask)
    _, hidden = target.forward(prefix, prefix_mask, positions, keep=1, hidden=True)
    drafter.prefill(prefix, prefix_mask, positions, hidden)
    histories = [ids[row][mask[row] == 1].tolist() for row in range(3)]
    last, count = ids[:, -1], mask.sum(dim=1)
    limit = count + 100
    generator = torch.Generator().manual_seed(0)
    for accepted_counts in ([3, 0, 1], [2, 3, 0]):
        logits = drafter.first(last, count, limit)
        drafted, predicted = [], []
        for row in range(3):
            expected, _ = fresh_draft_logits(verifier, draft, histories[row])
            torch.testing.assert_close(logits[row], expected, rtol=1e-10, atol=1e-10)
        for step in range(3):  # K = 3 drafts
            token = torch.randint(3, 97, (3,), generator=generator).to(tiny.DEVICE)
            drafted.append(token)
            predicted.append(drafter.predicted.clone())
            if step < 2:
                logits = drafter.next(token, count + step)
                for row in range(3):
                    expected, _ = fresh_draft_logits(
                        verifier,
                        draft,
                        histories[row],
                        [int(t[row]) for t in drafted],
                        [p[row] for p in predicted],
                    )
                    torch.testing.assert_close(logits[row], expected, rtol=1e-10, atol=1e-10)
        draft_ids = torch.stack(drafted, dim=1)  # [3, 3]
        block = torch.cat([last[:, None], draft_ids], dim=1)
        offsets = torch.arange(4, device=tiny.DEVICE)[None]
        _, features = target.forward(
            block, torch.ones_like(block), (count - 1)[:, None] + offsets, hidden=True
        )
        accepted = torch.tensor(accepted_counts, device=tiny.DEVICE)
        emitted = torch.randint(3, 97, (3,), generator=generator).to(tiny.DEVICE)
        target.keep(offsets <= accepted[:, None])
        drafter.rollback(draft_ids, accepted, emitted, features)
        for row in range(3):
            histories[row] += draft_ids[row, : accepted_counts[row]].tolist()
            histories[row].append(int(emitted[row]))
        count = count + accepted + 1
        last = emitted
    logits = drafter.first(last, count, limit)
    for row in range(3):
        expected, _ = fresh_draft_logits(verifier, draft, histories[row])
        torch.testing.assert_close(logits[row], expected, rtol=1e-10, atol=1e-10)


def test_save_and_load_round_trip(verifier, tmp_path):
    draft = FeatureDraft.build(verifier, config(8), seed=2)
    torch.nn.init.normal_(draft.projection)
    draft.save(tmp_path / "fd", dtype=torch.float64)
    loaded = FeatureDraft.load(tmp_path / "fd", verifier)
    ids = torch.randint(0, 97, (2, 5), device=tiny.DEVICE)
    features = torch.randn(2, 5, 32, dtype=torch.float64, device=tiny.DEVICE)
    torch.testing.assert_close(loaded(ids, features)[0], draft(ids, features)[0])
    assert loaded.head.data_ptr() == verifier.get_output_embeddings().weight.data_ptr()
    with pytest.raises(ValueError, match="^draft: cannot load a feature draft"):
        FeatureDraft.load(tmp_path / "missing", verifier)


def test_a_subset_head_is_the_full_head_restricted_to_its_tokens(verifier, tmp_path):
    """logits = head(f̂) on S (to float64 rounding: BLAS may sum a [|S|, H] product in
    another order than the [V, H] one) and exactly −inf elsewhere; saved and loaded with S."""
    draft = subset_draft(verifier, seed=4)
    full = FeatureDraft.build(verifier, config(None), seed=4)  # same seed: same weights
    ids = torch.randint(0, 97, (2, 5), device=tiny.DEVICE)
    features = torch.randn(2, 5, 32, dtype=torch.float64, device=tiny.DEVICE)
    logits, _ = draft(ids, features)  # [2, 5, 97]
    reference, _ = full(ids, features)
    outside = torch.ones(97, dtype=torch.bool)
    outside[SUBSET] = False
    torch.testing.assert_close(logits[..., SUBSET], reference[..., SUBSET], rtol=1e-12, atol=1e-12)
    assert torch.isneginf(logits[..., outside]).all()
    draft.save(tmp_path / "fd", dtype=torch.float64)
    loaded = FeatureDraft.load(tmp_path / "fd", verifier)
    assert torch.equal(loaded.subset_ids, SUBSET)
    assert torch.equal(loaded(ids, features)[0], logits)


def test_a_subset_is_checked():
    verifier = tiny.llama(seed=0)
    draft = FeatureDraft.build(verifier, config(None, 3), seed=0)
    with pytest.raises(ValueError, match="^token_ids: the subset holds a token twice"):
        draft.set_subset(torch.tensor([1, 1, 2]))
    with pytest.raises(ValueError, match=r"^token_ids: ids must lie in \[0, 97\)"):
        draft.set_subset(torch.tensor([1, 2, 97]))
    with pytest.raises(ValueError, match="^token_ids: expected 3 ids"):
        draft.set_subset(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="^config: choose a rank-r head or a vocabulary subset"):
        FeatureDraft.build(verifier, config(8, 3))
    with pytest.raises(ValueError, match=r"^config: vocab_subset must be in \[1, 97\]"):
        FeatureDraft.build(verifier, config(None, 98))


def test_decoding_with_a_feature_draft_keeps_the_guarantees(verifier):
    """Greedy equals ``generate``, batched and ragged; sampled runs keep EOS, lengths and
    the meter."""
    draft = FeatureDraft.build(verifier, config(None), seed=3)
    ids, mask = tiny.left_padded_prompts()
    reference = verifier.generate(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=16, pad_token_id=0
    )
    for rule in ("sps", "cactus:delta=1.0", "frontier:delta=0.5"):
        result = decode.speculative_generate(
            verifier, draft, ids, rule=rule, k=3, max_new_tokens=16, temperature=0,
            attention_mask=mask, pad_token_id=0, eos_token_id=[],
        )  # fmt: skip
        assert torch.equal(result.sequences, reference)
    sampled = decode.speculative_generate(
        verifier, draft, ids, rule="cactus:delta=1.0", k=4, max_new_tokens=12,
        attention_mask=mask, eos_token_id=[], generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    assert sampled.num_generated.tolist() == [12] * 5
    assert sampled.acceptance_length > 0 and sampled.kl_per_token >= 0
