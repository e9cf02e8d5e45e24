"""The divergence meter token by token, the per-sequence KL cap, generation-config
defaults and the context-length check."""

import numpy as np
import pytest
import torch
import torch_tiny_models as tiny

from cactus_theory import decode, divergences, law, rules
from cactus_theory.core.processors import SamplingSettings
from cactus_theory.sampler.processors import process_logits

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB = 8
SETTINGS = dict(temperature=1.0, top_k=6, top_p=0.97)


@pytest.fixture(scope="module")
def pair():
    verifier = tiny.llama(seed=10, vocab=VOCAB, hidden=16, init=0.3)
    draft = tiny.llama(seed=11, vocab=VOCAB, hidden=16, layers=1, init=0.3)
    return verifier, draft


def run(pair, rule, rows=200, max_new=12, k=3, seed=0, **kwargs):
    verifier, draft = pair
    ids = torch.randint(0, VOCAB, (rows, 5), generator=torch.Generator().manual_seed(seed))
    return decode.speculative_generate(
        verifier,
        draft,
        ids.to(tiny.DEVICE),
        rule=rule,
        k=k,
        max_new_tokens=max_new,
        eos_token_id=[],
        generator=torch.Generator().manual_seed(seed + 1),
        **SETTINGS,
        **kwargs,
    )


def test_first_token_kl_is_the_exact_kl_of_the_rules_law(pair):
    """Every row's first token is a verified position after the same prompt: its KL is
    KL(output_law(rule, q, p) ‖ q) computed in numpy, to 1e-9."""
    verifier, draft = pair
    prompt = torch.tensor([[5, 1, 6, 2]] * 3, device=tiny.DEVICE)
    rule = rules.parse("cactus-exact:delta=0.4")
    result = decode.speculative_generate(
        verifier, draft, prompt, rule=rule, k=2, max_new_tokens=4, eos_token_id=[], **SETTINGS
    )
    settings = SamplingSettings(**SETTINGS)
    with torch.no_grad():
        q = process_logits(verifier(input_ids=prompt[:1]).logits[0, -1], settings).double()
        p = process_logits(draft(input_ids=prompt[:1]).logits[0, -1], settings).double()
    expected = divergences.kl(law.output_law(rule, q.numpy(), p.numpy()), q.numpy())
    np.testing.assert_allclose(result.token_kl[:, 0].numpy(), expected, rtol=1e-9)
    assert (result.token_tv[:, 0] > 0).all()


def test_frontier_never_exceeds_its_budget_at_any_token(pair):
    delta = 0.05
    result = run(pair, f"frontier:delta={delta}")
    assert float(result.token_kl.max()) <= delta * (1 + 1e-9)
    assert float(result.token_kl.max()) > 0.5 * delta  # the budget is really spent
    assert result.sequence_kl.shape == (200,) and result.kl_per_token > 0


def test_sps_and_the_baseline_read_zero(pair):
    assert float(run(pair, "sps").token_kl.abs().max()) == 0.0
    verifier, _ = pair
    baseline = decode.autoregressive_generate(
        verifier, None, torch.zeros(4, 3, dtype=torch.int64, device=tiny.DEVICE), max_new_tokens=5
    )
    assert baseline.token_kl.shape == (4, 5) and float(baseline.token_kl.abs().max()) == 0.0


def test_the_meter_can_be_switched_off(pair):
    result = run(pair, "cactus:delta=1.0", divergence=False)
    assert result.token_kl is None and result.sequence_kl is None
    assert result.kl_per_token is None and "meter" not in result.timing


@pytest.mark.parametrize(
    "spec",
    [
        "cactus:delta=2.0",
        "cactus-exact:delta=1.0",
        "frontier:delta=0.5",
        # Ladders from what the rule declares: sglang's thresholds move halfway to their
        # lossless (1, 1); relaxed declares none and falls back to SpS at once.
        "sglang:threshold_single=0.05,threshold_acc=0.05",
        "relaxed:top_k=4,delta=0.9",
    ],
)
def test_max_kl_caps_every_row(pair, spec):
    cap = 0.15
    free = run(pair, spec, seed=4)
    capped = run(pair, spec, seed=4, max_kl=cap)
    # Negative control: without the cap most rows spend more than it.
    assert float((free.sequence_kl > cap).float().mean()) > 0.5
    assert float(capped.sequence_kl.max()) <= cap * (1 + 1e-9)
    # The cap binds (rows get close to it) and decoding still accepts drafts.
    assert float(capped.sequence_kl.max()) > 0.5 * cap
    assert capped.acceptance_length > 0 and capped.num_generated.tolist() == [12] * 200


def test_max_kl_zero_is_sps_and_bad_caps_are_errors(pair):
    assert float(run(pair, "cactus:delta=1.0", max_kl=0.0).token_kl.abs().max()) == 0.0
    for bad, match in ((-1.0, "^max_kl"), ("x", "^max_kl"), (float("nan"), "^max_kl")):
        with pytest.raises(ValueError, match=match):
            run(pair, "cactus:delta=1.0", max_kl=bad)
    # SpS is its own ladder: the cap never binds and the KL stays exactly 0.
    assert float(run(pair, "sps", max_kl=1.0).token_kl.abs().max()) == 0.0
    with pytest.raises(ValueError, match="^max_kl: needs the divergence meter"):
        run(pair, "frontier:delta=1.0", max_kl=1.0, divergence=False)


def test_eos_and_pad_default_to_the_generation_config():
    verifier = tiny.llama(seed=12, vocab=VOCAB, hidden=16, init=0.3)
    draft = tiny.perturbed(verifier)
    ids = torch.randint(0, VOCAB, (60, 4), generator=torch.Generator().manual_seed(3))
    verifier.generation_config.eos_token_id = [2, 5]
    verifier.generation_config.pad_token_id = 7
    result = decode.speculative_generate(
        verifier, draft, ids.to(tiny.DEVICE), k=3, max_new_tokens=10
    )
    assert result.eos_token_id == [2, 5] and result.pad_token_id == 7
    stopped = 0
    for row, length in zip(
        result.sequences[:, 4:].tolist(), result.num_generated.tolist(), strict=True
    ):
        tokens = row[:length]
        if length < 10:
            stopped += 1
            assert tokens[-1] in (2, 5) and not {2, 5} & set(tokens[:-1])
            assert set(row[length:]) == {7}
    assert stopped > 0
    # An explicit empty list means no EOS at all.
    none = decode.speculative_generate(
        verifier, draft, ids.to(tiny.DEVICE), k=3, max_new_tokens=10, eos_token_id=[]
    )
    assert none.num_generated.tolist() == [10] * 60 and none.eos_token_id == []


@pytest.mark.parametrize("build", [tiny.llama, tiny.gpt2], ids=["rope", "learned-positions"])
def test_prompt_plus_new_tokens_beyond_the_context_is_an_error(build):
    model = build(seed=0)
    limit = 512  # both tiny configs
    ids = torch.randint(3, 97, (2, 20), device=tiny.DEVICE)
    for generate in (decode.speculative_generate, decode.autoregressive_generate):
        with pytest.raises(ValueError, match="^max_new_tokens: a prompt of 20 tokens"):
            generate(model, model, ids, max_new_tokens=limit - 19)
    # Exactly at the limit is fine (the last position is limit − 1).
    result = decode.autoregressive_generate(model, None, ids[:, :2], max_new_tokens=limit - 2)
    assert result.num_generated.tolist() == [limit - 2] * 2
