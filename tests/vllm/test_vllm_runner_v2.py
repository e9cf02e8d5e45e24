"""The Model Runner V2 adapter on synthetic tensors in V2's layout (no GPU needed).

Layout (vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py): request b owns logits
rows cu[b] : cu[b+1] (its n_b draft positions, then the bonus position); the draft verified
at row cu[b] + i is draft_sampled[cu[b] + i + 1]; draft_logits [max_num_reqs, K, V] are raw
(the draft law is softmax(draft_logits / temperature)); temperature and seed are indexed by
request state (idx_mapping[b]).
"""

import numpy as np
import pytest
import torch

pytest.importorskip(
    "vllm.v1.sample.rejection_sampler",
    reason="vLLM is not installed here (scripts/test.sh runs tests/vllm)",
)

from goodness_of_fit import LEVEL, chi_square_pvalue  # noqa: E402

from cactus_theory import law, rules  # noqa: E402
from cactus_theory.vllm import config, runner_v2  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TARGET = np.array([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
DRAFT = np.array([0.05, 0.10, 0.15, 0.05, 0.45, 0.20])
BONUS = np.array([0.05, 0.05, 0.10, 0.20, 0.25, 0.35])


def v2_batch(counts, steps, temperature=2.0, seed=0, states=None):
    """V2's arguments for requests with ``counts`` drafts each (the same laws everywhere;
    drafts drawn from DRAFT). Request states are permuted, as V2's persistent slots are."""
    generator = torch.Generator().manual_seed(seed)
    batch = len(counts)
    slots = batch + 3
    states = torch.randperm(slots, generator=generator)[:batch] if states is None else states
    lengths = torch.tensor(counts, dtype=torch.int64)  # [B]
    cu = torch.tensor([0, *np.cumsum([n + 1 for n in counts])], dtype=torch.int32)
    total = int(cu[-1])
    request = torch.repeat_interleave(torch.arange(batch), lengths + 1)  # [L]
    local = torch.arange(total) - cu[:-1].to(torch.int64)[request]  # [L] 0..n_b
    is_bonus = local == lengths[request]  # [L]
    target_logits = torch.where(
        is_bonus[:, None], torch.tensor(BONUS).log(), torch.tensor(TARGET).log()
    ).to(torch.float32)
    drafts = torch.multinomial(torch.tensor(DRAFT), total, True, generator=generator)
    # Row r's input token is the draft verified at row r - 1 (local 0: the last sample).
    draft_sampled = torch.where(local > 0, drafts, 0).to(torch.int32)
    expanded_idx = states[request].to(torch.int32)
    local_pos = local.to(torch.int32)
    draft_logits = torch.randn(slots, steps, len(DRAFT), generator=generator)  # unused slots
    draft_logits[states] = (torch.tensor(DRAFT, dtype=torch.float32).log() * temperature)[
        None, None
    ]
    return dict(
        target_logits=target_logits,
        draft_logits=draft_logits,
        draft_sampled=draft_sampled,
        cu_num_logits=cu,
        pos=torch.arange(total, dtype=torch.int64) + 10,
        idx_mapping=states.to(torch.int32),
        expanded_idx_mapping=expanded_idx,
        expanded_local_pos=local_pos,
        temperature=torch.full((slots,), temperature),
        seed=torch.arange(slots, dtype=torch.int64) * 7 + seed,
        num_speculative_steps=steps,
    )


def run_v2(spec, arguments, original=None):
    with config.batch_rules([spec] * (arguments["cu_num_logits"].shape[0] - 1)):
        return runner_v2.rejection_sample(original, **arguments)


@pytest.mark.parametrize("spec", ["sps", "cactus:delta=0.1", "frontier:delta=0.3"])
def test_v2_emitted_law_and_bonus_law(spec):
    """One draft per request, 20,000 requests: the first token follows the exact law of the
    rule with p = softmax(draft_logits / T) (a wrong temperature would change it), the
    bonus after an accept follows the bonus row's q."""
    samples = 20_000
    arguments = v2_batch([1] * samples, steps=1, seed=1)
    sampled, num_sampled = run_v2(spec, arguments)
    assert sampled.shape == (samples, 2) and sampled.dtype == torch.int64
    assert num_sampled.dtype == torch.int32
    first = np.bincount(sampled[:, 0].numpy(), minlength=len(TARGET))
    wanted = law.output_law(rules.parse(spec), target=TARGET, draft=DRAFT)
    assert chi_square_pvalue(first, wanted) > LEVEL
    accepted = (num_sampled == 2).numpy()
    bonus = np.bincount(sampled[accepted, 1].numpy(), minlength=len(BONUS))
    assert chi_square_pvalue(bonus, BONUS) > LEVEL
    if spec != "sps":
        assert chi_square_pvalue(first, TARGET) < LEVEL  # negative control: not lossless


def test_v2_layout_ragged_rows_placeholders_and_seeds():
    counts = [3, 0, 2, 1, 3]
    arguments = v2_batch(counts, steps=3, seed=2)
    cu = arguments["cu_num_logits"]
    arguments["draft_sampled"][int(cu[4]) + 2] = -1  # request 4: its second draft is a placeholder
    sampled, num_sampled = run_v2("cactus:delta=0.5", arguments)
    assert sampled.shape == (5, 4)
    for b, n in enumerate(counts):
        used = int(num_sampled[b])
        limit = 1 if b == 4 else n  # the placeholder cuts request 4 to one draft
        assert 1 <= used <= limit + 1
        row = sampled[b].tolist()
        assert all(0 <= token < len(TARGET) for token in row[:used])
        assert row[used:] == [-1] * (4 - used)
        drafts = arguments["draft_sampled"][int(cu[b]) + 1 : int(cu[b]) + 1 + used - 1]
        assert row[: used - 1] == drafts.tolist()  # the accepted tokens are the drafts
    again, again_num = run_v2("cactus:delta=0.5", arguments)
    assert torch.equal(again, sampled) and torch.equal(again_num, num_sampled)  # seeded


def test_v2_greedy_rows_and_special_modes_keep_vllms_function():
    calls = []

    def original(*args, **kwargs):
        calls.append(args)
        batch = args[3].shape[0] - 1
        return torch.full((batch, args[10] + 1), 77), torch.ones(batch, dtype=torch.int32)

    arguments = v2_batch([2, 2, 2], steps=2, states=torch.tensor([0, 1, 2]))
    arguments["temperature"][1] = 0.0  # request 1 is greedy
    sampled, num_sampled = run_v2("sps", arguments, original)
    assert len(calls) == 1
    assert sampled[1].tolist() == [77, 77, 77] and int(num_sampled[1]) == 1
    assert not bool((sampled[[0, 2]] == 77).any())
    arguments["temperature"][:] = 0.0  # all greedy: vLLM alone
    sampled, _ = run_v2("cactus:delta=1.0", arguments, original)
    assert len(calls) == 2 and bool((sampled == 77).all())
    arguments["temperature"][:] = 1.0
    run_v2("sps", {**arguments, "use_block_verification": True}, original)
    assert len(calls) == 3
    with pytest.raises(ValueError, match="original"):
        run_v2(None, arguments)


def test_v2_one_hot_drafts_refused_for_cactus():
    arguments = v2_batch([1, 1], steps=1)
    arguments["draft_logits"] = None
    with pytest.raises(ValueError, match="draft_probs"):
        run_v2("cactus:delta=1.0", arguments)
    sampled, _ = run_v2("sps", arguments)  # SpS with one-hot drafts is vLLM's own rule
    assert sampled.shape == (2, 2)


def test_v2_install_patches_the_module_attribute():
    import importlib

    assert runner_v2.install()
    module = importlib.import_module(runner_v2.V2_MODULE)
    assert getattr(module.rejection_sample, runner_v2.MARK)
    assert runner_v2.install()  # idempotent
    assert not getattr(module.rejection_sample.__wrapped__, runner_v2.MARK, False)
