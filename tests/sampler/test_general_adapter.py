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


def test_results_become_tensors_without_a_copy_and_without_torchs_warning():
    """``back``: a writable array is shared with the tensor (no copy); a read-only view
    (``np.broadcast_to``, as rules may return) is copied, so torch does not warn."""
    from cactus_theory.sampler.rules.general import back

    like = torch.zeros(3, dtype=torch.float64)
    writable = np.array([0.2, 0.3, 0.5])
    assert back(writable, like).data_ptr() == writable.ctypes.data
    view = np.broadcast_to(np.array([0.2, 0.3, 0.5]), (4, 3))
    assert not view.flags.writeable
    tensor = back(view, like)
    np.testing.assert_array_equal(tensor.numpy(), view)


BROADCAST_RULE = """
import warnings

import numpy as np
import torch

from cactus_theory import rules, sampler


class Broadcast(rules.Rule):
    name = "test-broadcast"

    def accept_probs(self, target_probs, draft_probs):
        return np.broadcast_to(np.where(draft_probs > 0, 0.5, 0.0), target_probs.shape)

    def residuals_for(self, target_probs, draft_probs, tokens):
        return np.broadcast_to(target_probs, target_probs.shape)


warnings.simplefilter("error")
target = torch.softmax(torch.randn(2, 3, 7, dtype=torch.float64), dim=-1)
draft = torch.softmax(torch.randn(2, 2, 7, dtype=torch.float64), dim=-1)
ids = torch.multinomial(draft.reshape(-1, 7), 1).reshape(2, 2)
tokens, accepted = sampler.verify(target, draft, ids, Broadcast(), generator=torch.Generator())
print("ok", tokens.shape[1])
"""


def test_a_rule_returning_read_only_views_runs_without_a_warning(tmp_path):
    """In a fresh process (torch warns once per process): every warning is an error."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "broadcast.py"
    script.write_text(BROADCAST_RULE)
    root = str(Path(__file__).resolve().parents[2])  # this checkout's cactus_theory
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": root},
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok 3", done.stderr[-2000:]
