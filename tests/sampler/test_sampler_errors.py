"""Bad inputs raise a ValueError naming the argument; edge cases emit documented tokens."""

import numpy as np
import pytest
import torch

from cactus_theory import rules, sampler
from cactus_theory.core import verify as reference

ALL_RULES = [
    "sps",
    "cactus:delta=0.5",
    "cactus-exact:delta=0.5",
    "frontier:delta=0.2",
    "pareto:spread=1.0",
    "interp:alpha=0.3",
    "tas",
    "topk:k=2",
    "greedy",
]
GSPS_RULES = ["sps", "cactus:delta=0.5", "cactus-exact:delta=0.5", "frontier:delta=0.2"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def block(batch=3, steps=2, vocab=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    target = torch.softmax(torch.randn(batch, steps + 1, vocab, generator=generator), -1)
    draft = torch.softmax(torch.randn(batch, steps, vocab, generator=generator), -1)
    ids = torch.randint(0, vocab, (batch, steps), generator=generator)
    return target, draft, ids


SPS = rules.parse("sps")


def _with(tensor, index, value):
    changed = tensor.clone()
    changed[index] = value
    return changed


@pytest.mark.parametrize(
    ("argument", "make"),
    [
        ("target_probs", lambda t, d, i: (t.numpy(), d, i)),
        ("target_probs", lambda t, d, i: (t.long(), d, i)),
        ("target_probs", lambda t, d, i: (t[0], d, i)),
        ("target_probs", lambda t, d, i: (t[:, :2], d, i)),
        ("target_probs", lambda t, d, i: (t[..., :4], d, i)),
        ("target_probs", lambda t, d, i: (_with(t, (0, 0, 0), float("nan")), d, i)),
        ("target_probs", lambda t, d, i: (_with(t, (1, 2, 3), float("inf")), d, i)),
        ("target_probs", lambda t, d, i: (_with(t, (0, 1, 1), -0.1), d, i)),
        ("target_probs", lambda t, d, i: (t * 1.01, d, i)),
        ("draft_probs", lambda t, d, i: (t, d.tolist(), i)),
        ("draft_probs", lambda t, d, i: (t, _with(d, (2, 1, 0), float("nan")), i)),
        ("draft_probs", lambda t, d, i: (t, d * 0.5, i)),
        ("draft_probs", lambda t, d, i: (t, _with(d, (0, 0, 4), -1e-3), i)),
        ("draft_ids", lambda t, d, i: (t, d, i.float())),
        ("draft_ids", lambda t, d, i: (t, d, i.bool())),
        ("draft_ids", lambda t, d, i: (t, d, i.numpy())),
        ("draft_ids", lambda t, d, i: (t, d, i[:, :1])),
        ("draft_ids", lambda t, d, i: (t, d, _with(i, (0, 0), 5))),
        ("draft_ids", lambda t, d, i: (t, d, _with(i, (2, 1), -1))),
    ],
)
def test_bad_blocks_name_the_argument(argument, make):
    target, draft, ids = block()
    with pytest.raises(ValueError, match=f"^{argument}"):
        sampler.verify(*make(target, draft, ids), SPS)


def test_half_precision_tolerance_is_per_dtype():
    target, draft, ids = block()
    sampler.verify(target.bfloat16(), draft.bfloat16(), ids, SPS)  # rounding is fine
    with pytest.raises(ValueError, match="^target_probs: rows must sum to 1 within 0.01"):
        sampler.verify((target * 1.05).bfloat16(), draft.bfloat16(), ids, SPS)


@pytest.mark.parametrize(
    ("argument", "uniforms"),
    [
        ("uniforms", torch.rand(3, 2)),
        ("uniforms", (torch.rand(3, 2),)),
        ("accept_uniforms", (torch.rand(3, 3), torch.rand(3))),
        ("accept_uniforms", (torch.ones(3, 2), torch.rand(3))),
        ("accept_uniforms", (torch.full((3, 2), float("nan")), torch.rand(3))),
        ("accept_uniforms", (torch.zeros(3, 2, dtype=torch.int64), torch.rand(3))),
        ("sample_uniforms", (torch.rand(3, 2), torch.rand(2))),
        ("sample_uniforms", (torch.rand(3, 2), -torch.rand(3) - 0.1)),
    ],
)
def test_bad_uniforms_name_the_argument(argument, uniforms):
    target, draft, ids = block()
    with pytest.raises(ValueError, match=f"^{argument}"):
        sampler.verify(target, draft, ids, SPS, uniforms=uniforms)


def test_generator_and_uniforms_together_and_bad_generator():
    target, draft, ids = block()
    with pytest.raises(ValueError, match="^uniforms: pass either"):
        sampler.verify(
            target,
            draft,
            ids,
            SPS,
            generator=torch.Generator(),
            uniforms=(torch.rand(3, 2), torch.rand(3)),
        )
    with pytest.raises(ValueError, match="^generator"):
        sampler.verify(target, draft, ids, SPS, generator=42)


@pytest.mark.parametrize("bad_rule", ["sps", None, object()])
def test_rule_must_be_a_rule(bad_rule):
    target, draft, ids = block()
    with pytest.raises(ValueError, match="^rule"):
        sampler.verify(target, draft, ids, bad_rule)


@pytest.mark.parametrize("spec", ALL_RULES)
def test_a_drafted_token_with_draft_probability_zero_is_rejected(spec):
    target, draft, _ = block(batch=4, steps=3, vocab=6, seed=1)
    draft[:, :, 2] = 0.0
    draft = draft / draft.sum(-1, keepdim=True)
    target[:, :, 2] = 0.9  # even a token the verifier loves is rejected if never draftable
    target = target / target.sum(-1, keepdim=True)
    ids = torch.full((4, 3), 2)
    for _ in range(5):
        tokens, accepted = sampler.verify(target, draft, ids, rules.parse(spec), generator=None)
        assert accepted.tolist() == [0, 0, 0, 0]
        assert bool(((tokens[:, 0] >= 0) & (tokens[:, 0] < 6)).all())
        assert tokens[:, 1:].tolist() == [[-1, -1, -1]] * 4


@pytest.mark.parametrize("spec", GSPS_RULES + ["interp:alpha=0.3"])
def test_all_zero_residual_emits_the_documented_token(spec):
    """draft = target, drafted token with draft probability 0: (h − p)_+ = 0, so the
    residual falls back to h = q and the token is inverse_cdf(q, u)."""
    target_row = torch.tensor([0.5, 0.0, 0.3, 0.2], dtype=torch.float64)
    target = target_row.expand(1, 2, 4).clone()
    draft = target_row.expand(1, 1, 4).clone()
    ids = torch.tensor([[1]])  # q_1 = p_1 = 0
    rule = rules.parse(spec)
    for u, expected in ((0.0, 0), (0.49, 0), (0.5, 2), (0.79, 2), (0.8, 3), (0.999, 3)):
        tokens, accepted = sampler.verify(
            target, draft, ids, rule, uniforms=(torch.tensor([[0.0]]), torch.tensor([u]))
        )
        assert accepted.tolist() == [0] and tokens.tolist() == [[expected, -1]]
        ref, _ = reference.verify_block(
            rule, target.numpy(), draft.numpy(), ids.numpy(), np.zeros((1, 1)), np.array([u])
        )
        assert ref.tolist() == tokens.tolist()


def test_inverse_cdf_never_draws_a_zero_mass_token_and_falls_back_to_the_last_positive():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0]] * 4, dtype=torch.float32)
    uniforms = torch.tensor([0.0, 0.2499, 0.25, 0.9999999])
    assert sampler.inverse_cdf(probs, uniforms).tolist() == [1, 1, 3, 3]
    # rounding past the end of the cumulative sum falls back to the last positive index
    assert sampler.inverse_cdf(probs[:1], torch.tensor([1.0])).tolist() == [3]
    assert sampler.inverse_cdf(torch.zeros(1, 5), torch.tensor([0.5])).tolist() == [0]


@pytest.mark.parametrize("spec", ALL_RULES)
def test_unchecked_garbage_never_emits_an_out_of_range_id(spec):
    target, draft, ids = block(batch=6, steps=3, vocab=7, seed=2)
    target[0] = float("nan")
    draft[1] = float("inf")
    target[2] = 0.0
    draft[3] = -1.0
    ids = ids.clone()
    ids[4, 0], ids[5, 1] = 7, -3
    tokens, accepted = sampler.verify(
        target,
        draft,
        ids,
        rules.parse(spec),
        generator=torch.Generator().manual_seed(0),
        check=False,
    )
    assert bool(((tokens == -1) | ((tokens >= 0) & (tokens < 7))).all())
    assert accepted[4].item() == 0 and accepted[5].item() <= 1  # out-of-range ids rejected
    # -1 only as padding after the emitted token
    for row, count in zip(tokens.tolist(), accepted.tolist(), strict=True):
        assert -1 not in row[: count + 1] and set(row[count + 1 :]) <= {-1}


@pytest.mark.parametrize(
    "num_drafts",
    [
        [0, 1],
        torch.tensor([0.0, 1.0, 2.0]),
        torch.tensor([0, 1, 3]),
        torch.tensor([[0, 1, 2]]),
        torch.tensor([-1, 0, 0]),
    ],
    ids=["list", "float", "above-k", "shape", "negative"],
)
def test_bad_draft_counts_name_themselves(num_drafts):
    target, draft, ids = block()
    with pytest.raises(ValueError, match="^num_drafts"):
        sampler.verify(target, draft, ids, SPS, num_drafts=num_drafts)
