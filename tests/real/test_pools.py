"""Real pools (``cactus_theory.real.pools``) on tiny random models and a character-level
ChatML tokenizer.

- every row equals what the decoder sees at its first draft position: q from the verifier's
  KV cache and p from the drafter's own cache path (``DraftCache``, ``FeatureDraftCache``),
  prefix by prefix, unpadded (oracle: the decoder's code; float64, tolerance 1e-9), for an
  independent draft and a feature draft, truncated and untruncated;
- packed rows unpack to the dense rows exactly; the pool's token is the sampled one;
- a build is cached per shard, resumes after a lost shard to the same arrays, and stops
  once it holds ``positions``.
"""

import dataclasses

import numpy as np
import pytest
import torch
import torch_tiny_models as tiny

from cactus_theory.core.processors import SamplingSettings
from cactus_theory.decode.cache import (
    CachedModel,
    DraftCache,
    FeatureDraftCache,
    positions_of_prompt,
)
from cactus_theory.decode.feature_draft import FeatureDraft, FeatureDraftConfig
from cactus_theory.decode.runs import Pair, Setup
from cactus_theory.real import pools
from cactus_theory.sampler.processors import process_logits

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = ["Hi", "What is 2+2?", "Name a colour.", "Spell cat", "Count to three", "Say yes"]
TRUNCATED = SamplingSettings(temperature=0.8, top_k=7, top_p=0.9)
PLAIN = SamplingSettings(temperature=1.0)


@pytest.fixture(scope="module")
def independent_draft(verifier):
    return tiny.perturbed(verifier, scale=0.3)


@pytest.fixture(scope="module")
def feature_draft(verifier):
    config = FeatureDraftConfig(hidden_size=32, num_heads=4, num_kv_heads=2, intermediate_size=64)
    draft = FeatureDraft.build(verifier, config, seed=3)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.mul_(8.0)  # a draft far enough from uniform to disagree with q
    return draft.eval()


def _setup(verifier, draft, tokenizer, prompts=PROMPTS):
    tokenizer.padding_side = "left"
    return Setup(verifier, draft, tokenizer, list(prompts), tiny.DEVICE, Pair("v", "d"), True)


@torch.inference_mode()
def _decoder_first_rows(verifier, draft, tokens: list[int], sampling):
    """(q, p) [V] the decoder computes at its first draft position after ``tokens``."""
    ids = torch.tensor([tokens], device=tiny.DEVICE)
    prefix, last = ids[:, :-1], ids[:, -1]
    mask = torch.ones_like(prefix)
    positions = positions_of_prompt(mask)
    target = CachedModel(verifier, 1, tiny.DEVICE)
    kind = FeatureDraftCache if isinstance(draft, FeatureDraft) else DraftCache
    drafter = kind(draft, 1, tiny.DEVICE)
    output = target.forward(prefix, mask, positions, keep=1, hidden=drafter.needs_features)
    features = output[1] if drafter.needs_features else None
    drafter.prefill(prefix, mask, positions, features)
    count = torch.tensor([len(tokens)], device=tiny.DEVICE)
    draft_logits = drafter.first(last, count, count + 100)  # [1, V]
    target_logits = target.forward(
        last[:, None], torch.ones_like(last[:, None]), count[:, None] - 1
    )
    return (
        process_logits(target_logits[0, -1], sampling).cpu().numpy(),
        process_logits(draft_logits[0], sampling).cpu().numpy(),
    )


@pytest.mark.parametrize("kind", ["independent", "feature"])
@pytest.mark.parametrize("sampling", [TRUNCATED, PLAIN], ids=["truncated", "plain"])
def test_rows_are_the_decoders_first_draft_position(
    kind, sampling, verifier, independent_draft, feature_draft, tokenizer
):
    draft = independent_draft if kind == "independent" else feature_draft
    setup = _setup(verifier, draft, tokenizer, PROMPTS[:3])
    settings = pools.PoolSettings(
        positions=1000, num_prompts=3, max_new_tokens=9, sampling=sampling, batch_size=3
    )
    pool = pools.build_pool(setup, settings, None, device="cpu", dtype="float64", progress=False)
    assert (pool.ids is None) == (sampling is PLAIN)  # 99 tokens: plain rows stay whole
    target, draft_rows = pool.rows(slice(None), full=True)
    shard = pools.build_shard(setup, PROMPTS[:3], settings, 0)  # the same seed: same tokens
    sequences, mask = shard["sequences"], shard["prompt_mask"].astype(bool)
    prompt_width = mask.shape[1]
    checked = 0
    for row in range(len(pool)):
        b, step = int(pool.prompt[row]), int(pool.step[row])
        prompt = sequences[b, :prompt_width][mask[b]].tolist()
        tokens = prompt + sequences[b, prompt_width : prompt_width + step].tolist()
        q, p = _decoder_first_rows(verifier, draft, tokens, sampling)
        np.testing.assert_allclose(target[row], q, atol=1e-9)
        np.testing.assert_allclose(draft_rows[row], p, atol=1e-9)
        assert int(pool.token[row]) == int(sequences[b, prompt_width + step])
        assert q[int(pool.token[row])] > 0  # the continuation was sampled from q
        checked += 1
    assert checked == len(pool) >= 10
    assert not np.allclose(target, draft_rows, atol=1e-3)  # the draft does disagree


def test_packed_rows_unpack_to_the_dense_rows(verifier, independent_draft):
    ids, mask = tiny.left_padded_prompts(batch=3, length=6, vocab=99, pads=(0, 2, 1))
    generated = torch.randint(3, 99, (3, 5), generator=torch.Generator().manual_seed(1))
    sequences = torch.cat([ids, generated.to(ids.device)], dim=1)
    counts = torch.tensor([5, 3, 4])
    dense_target, dense_draft = pools.teacher_forced_rows(
        verifier, independent_draft, sequences, mask, counts, TRUNCATED
    )
    target, draft, columns = pools.rows_for_sequences(
        verifier, independent_draft, sequences, mask, counts, TRUNCATED, 99
    )
    assert target.shape[0] == 12 and target.shape[1] <= 2 * TRUNCATED.top_k
    pool = pools.RealPool(target, draft, columns, 99, np.zeros(12), np.zeros(12), np.zeros(12))
    full_target, full_draft = pool.rows(slice(None), full=True)
    expected = dense_target.double().cpu().numpy()
    np.testing.assert_allclose(full_target, expected / expected.sum(1, keepdims=True), atol=1e-7)
    expected = dense_draft.double().cpu().numpy()
    np.testing.assert_allclose(full_draft, expected / expected.sum(1, keepdims=True), atol=1e-7)
    assert np.all(columns[target + draft == 0] == 99)  # padding columns carry the pad id


def test_a_build_is_cached_resumes_and_stops_at_the_positions(
    verifier, independent_draft, tokenizer, tmp_path
):
    setup = _setup(verifier, independent_draft, tokenizer)
    settings = pools.PoolSettings(
        positions=1000, num_prompts=6, max_new_tokens=8, sampling=TRUNCATED, batch_size=2
    )
    build = dict(device="cpu", dtype="float64", progress=False)
    first = pools.build_pool(setup, settings, tmp_path, **build)
    assert first.info["shards_built"] == 3 and first.info["prompts"] == 6
    shards = sorted(tmp_path.glob("pool-*/shard-*.npz"))
    assert len(shards) == 3
    again = pools.build_pool(setup, settings, tmp_path, **build)
    assert again.info["shards_built"] == 0
    shards[1].unlink()  # an interrupted build lost this shard
    resumed = pools.build_pool(setup, settings, tmp_path, **build)
    assert resumed.info["shards_built"] == 1
    for name in ("target_probs", "draft_probs", "ids", "prompt", "step", "token"):
        np.testing.assert_array_equal(getattr(resumed, name), getattr(first, name))
    few = pools.build_pool(setup, dataclasses.replace(settings, positions=3), tmp_path, **build)
    # one shard of one prompt is enough: 3 positions need one prompt of 8 new tokens
    assert 3 <= len(few) < len(first) and few.info["prompts"] == 1
    other = dataclasses.replace(settings, seed=1)
    assert pools.build_pool(setup, other, tmp_path, **build).info["shards_built"] == 3


def test_a_shard_takes_no_more_prompts_than_the_missing_positions_need():
    settings = pools.PoolSettings(positions=2000, max_new_tokens=128, batch_size=8)
    assert pools.shard_size(settings, 0, 80) == 8
    assert pools.shard_size(settings, 1700, 64) == 3  # 300 positions: 3 prompts of 128
    assert pools.shard_size(settings, 1999, 64) == 1
    assert pools.shard_size(settings, 2500, 64) == 1  # never fewer than one
    assert pools.shard_size(settings, 0, 2) == 2  # never more than are left


def test_a_pool_is_the_same_in_every_run_and_at_every_thread_count(
    verifier, independent_draft, tokenizer
):
    """Deterministic given (pair, prompts, settings, dtype): two builds from scratch (no
    cache), one on one thread and one on two, hold the same rows to the last bit; the
    negative control, another seed, does not."""
    setup = _setup(verifier, independent_draft, tokenizer)
    settings = pools.PoolSettings(
        positions=30, num_prompts=6, max_new_tokens=8, sampling=TRUNCATED, batch_size=3
    )
    build = dict(device="cpu", dtype="float64", progress=False)
    first = pools.build_pool(setup, settings, None, **build)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        second = pools.build_pool(setup, settings, None, **build)
    finally:
        torch.set_num_threads(previous)
    for name in ("target_probs", "draft_probs", "ids", "prompt", "step", "token"):
        np.testing.assert_array_equal(getattr(second, name), getattr(first, name))
    other = pools.build_pool(setup, dataclasses.replace(settings, seed=1), None, **build)
    assert not np.array_equal(other.token, first.token[: len(other.token)]) or len(other) != len(
        first
    )


def test_bad_settings_name_the_argument():
    with pytest.raises(ValueError, match="positions"):
        pools.PoolSettings(positions=0)
    with pytest.raises(ValueError, match="temperature"):
        pools.PoolSettings(sampling=SamplingSettings(temperature=0.0))
