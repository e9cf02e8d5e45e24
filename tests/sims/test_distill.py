"""``sims.distill`` (``cactus train-draft``) on a tiny random verifier: labels are the
verifier's own, training lowers the soft cross-entropy, an interrupted run resumes to the
same draft bit for bit, and the principal directions are orthonormal.

Oracle: a fresh verifier forward (labels), the uninterrupted run (resume), the identity
(P^T P); tolerances are exact equality except P^T P (1e-5, float32 eigh).
"""

import dataclasses

import pytest
import torch
import torch_tiny_models as tiny

from sims import distill

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SETTINGS = distill.DistillSettings(
    top_k_labels=4,
    intermediate_size=48,
    rank=8,
    steps=6,
    batch_sequences=2,
    checkpoint_every=2,
    heldout_sequences=1,
    input_noise=0.1,
)


@pytest.fixture(scope="module")
def verifier():
    return tiny.llama(seed=0, dtype=torch.float32)


@pytest.fixture(scope="module")
def labelled(verifier):
    generator = torch.Generator().manual_seed(1)
    sequences = [torch.randint(1, 97, (n,), generator=generator).tolist() for n in (9, 12, 7, 10)]
    return distill.label_sequences(verifier, sequences, SETTINGS)


def test_labels_are_the_verifiers_features_and_top_k(verifier, labelled):
    item = labelled[1]
    with torch.no_grad():
        output = verifier(input_ids=item["ids"][None].long(), output_hidden_states=True)
    features = output.hidden_states[-1][0]  # [T, H]
    assert torch.equal(item["features"], features.to(torch.bfloat16))
    top = torch.softmax(output.logits[0], -1).topk(4, dim=-1)
    assert torch.equal(item["top_ids"].long(), top.indices)
    assert torch.equal(item["top_probs"], top.values.to(torch.float16))


def test_training_lowers_the_loss_and_resumes_to_the_same_draft(
    verifier, labelled, tmp_path, monkeypatch
):
    items, heldout = labelled[1:], labelled[:1]
    untrained = dataclasses.replace(SETTINGS, steps=1, learning_rate=0.0)
    _, before = distill.train_draft(verifier, items, heldout, untrained, tmp_path / "a", print)
    reference, after = distill.train_draft(
        verifier, items, heldout, SETTINGS, tmp_path / "b", print
    )
    assert after["heldout_soft_ce"] < before["heldout_soft_ce"]

    real_loss, calls = distill.draft_loss, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # step 4: the checkpoint of step 2 is on disk
            raise KeyboardInterrupt
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(distill, "draft_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        distill.train_draft(verifier, items, heldout, SETTINGS, tmp_path / "c", print)
    monkeypatch.setattr(distill, "draft_loss", real_loss)
    resumed, _ = distill.train_draft(verifier, items, heldout, SETTINGS, tmp_path / "c", print)
    for (name, value), (_, other) in zip(
        reference.own_state().items(), resumed.own_state().items(), strict=True
    ):
        assert torch.equal(value, other), name


def test_principal_directions_are_orthonormal(labelled):
    directions = distill.principal_directions(labelled, 8)  # [H, 8]
    assert directions.shape == (32, 8)
    torch.testing.assert_close(directions.T @ directions, torch.eye(8), atol=1e-5, rtol=0)


def test_training_prompts_are_many_and_never_held_out():
    from sims.train_prompts import _heldout, training_prompts

    prompts = training_prompts()
    assert len(prompts) >= 300 and len(set(prompts)) == len(prompts)
    assert not set(prompts) & _heldout()
