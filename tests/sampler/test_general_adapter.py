"""The generic torch adapter (``sampler.rules.general``) at a real workload: B = 8 rows,
k = 5 drafts, V = 49,152 (SmolLM2's vocabulary). Same tokens as the numpy reference
``core.verify.verify_block`` from the same uniforms, for each way a rule reaches it: an
array-API rule on tensors, a numpy-only rule through float64 copies, and a numpy branch
rule with γ from q_n (masses only)."""

import numpy as np
import pytest
import torch

from cactus_theory import rules, sampler
from cactus_theory.core.verify import inverse_cdf, verify_block
from cactus_theory.sampler.rules import TorchGeneral, TorchMassBranch

pytestmark = pytest.mark.usefixtures("one_torch_thread")
BATCH, STEPS, VOCAB = 8, 5, 49_152


class NumpyHalf(rules.Rule):
    """Numpy only: SpS's acceptance halved, recovery q (a general-family rule)."""

    name = "test-numpy-half"

    def accept_probs(self, target_probs, draft_probs):
        ratio = target_probs / np.where(draft_probs > 0, draft_probs, 1.0)
        return np.where(draft_probs > 0, 0.5 * np.minimum(1.0, ratio), 0.0)

    def residuals_for(self, target_probs, draft_probs, tokens):
        return target_probs


class NumpyMass(rules.BranchRule):
    """Numpy only, γ_n = min(1, 3 q_n) declared elementwise."""

    name = "test-numpy-mass"
    gamma_from_mass = True

    def raised_mass(self, target_mass, cap=None):
        raised = np.minimum(1.0, 3.0 * target_mass)
        return raised if cap is None else np.minimum(raised, cap)


def block(seed):
    """Peaked float64 rows like a model's (softmax of scaled normals), drafts from the draft
    rows, uniforms."""
    generator = np.random.default_rng(seed)
    logits = generator.normal(size=(BATCH, STEPS + 1, VOCAB)) * 4.0
    target = np.exp(logits - logits.max(-1, keepdims=True))
    target /= target.sum(-1, keepdims=True)
    noisy = logits[:, :STEPS] + generator.normal(size=(BATCH, STEPS, VOCAB))
    draft = np.exp(noisy - noisy.max(-1, keepdims=True))
    draft /= draft.sum(-1, keepdims=True)
    ids = inverse_cdf(draft, generator.random((BATCH, STEPS)))
    return target, draft, ids, generator.random((BATCH, STEPS)), generator.random(BATCH)


@pytest.mark.parametrize(
    ("rule", "adapter"),
    [
        (rules.parse("sglang:threshold_single=0.3,threshold_acc=0.4"), TorchGeneral),
        (rules.parse("relaxed:top_k=10,delta=0.6"), TorchGeneral),
        (NumpyHalf(), TorchGeneral),
        (NumpyMass(), TorchMassBranch),
    ],
    ids=lambda item: getattr(item, "name", getattr(item, "__name__", "")),
)
def test_same_tokens_as_numpy_at_a_real_workload(rule, adapter):
    assert type(sampler.for_rule(rule)) is adapter
    accepted_somewhere = rejected_somewhere = False
    for seed in range(3):
        parts = block(seed)
        expected, expected_count = verify_block(rule, *parts)
        tensors = [torch.as_tensor(part) for part in parts]
        tokens, count = sampler.verify(*tensors[:3], rule, uniforms=(tensors[3], tensors[4]))
        np.testing.assert_array_equal(tokens.numpy(), expected)
        np.testing.assert_array_equal(count.numpy(), expected_count)
        assert ((tokens >= 0) & (tokens < VOCAB) | (tokens == -1)).all()
        accepted_somewhere |= bool((count > 0).any())
        rejected_somewhere |= bool((count < STEPS).any())
    # The workload exercises both branches (a test that only ever rejects proves little).
    assert accepted_somewhere and rejected_somewhere
