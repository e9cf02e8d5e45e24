"""``cactus train-draft`` (``cactus_theory.real.distill_labels`` and ``cactus_theory.real.distill``)
on a tiny random verifier and a character-level ChatML tokenizer.

- the label mask marks exactly the tokens of assistant replies (oracle: the reply text);
- batched, right-padded labels equal each sequence's own unpadded forward (features to
  bfloat16 rounding, top-K ids exactly, probabilities to float16 rounding);
- an interrupted label pass resumes to the same shards, bit for bit;
- the subset S holds the tokens of most label mass; the held-out α equals
  ``law.acceptance(sps)`` of the processed laws in numpy (1e-6); training lowers the
  held-out soft cross-entropy; an interrupted run resumes to the same draft bit for bit.
"""

import dataclasses

import numpy as np
import pytest
import torch

from cactus_theory import law, rules
from cactus_theory.core.processors import PAPER_SETTING
from cactus_theory.real import distill, distill_labels
from cactus_theory.sampler.processors import process_logits

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LABELS = distill_labels.LabelSettings(
    max_length=64, train_tokens=60, heldout_conversations=2, top_k_labels=24,
    batch_tokens=128, shard_tokens=100, dtype="float64",
)  # fmt: skip
SETTINGS = distill.DistillSettings(
    labels=LABELS, intermediate_size=48, draft_vocab=40, batch_sequences=2, epochs=4,
    learning_rate=1e-2, warmup_steps=1, eval_every=2, eval_conversations=2,
    checkpoint_every=2, input_noise=0.1,
)  # fmt: skip
CONVERSATIONS = [
    [("user", "Hi"), ("assistant", "Yo!")],
    [("user", "What is 2+2?"), ("assistant", "4."), ("user", "Sure?"), ("assistant", "Yes, 4.")],
    [("user", "Name a colour."), ("assistant", "Blue, like the sky at noon.")],
    [("user", "Spell cat"), ("assistant", "c-a-t")],
    [("user", "Count to five"), ("assistant", "1 2 3 4 5")],
    [("user", "Say hello"), ("assistant", "hello there, friend")],
    [("user", "A long one please"), ("assistant", "x" * 80)],
    [("user", "Last"), ("assistant", "held out")],
    [("user", "Really last"), ("assistant", "also held out")],
]


@pytest.fixture(scope="module")
def sequences(tokenizer):
    return distill_labels.select_sequences(tokenizer, CONVERSATIONS, LABELS)


def labelled_text(tokenizer, sequence):
    next_ids = [sequence.ids[t + 1] for t in range(len(sequence.ids) - 1) if sequence.label_mask[t]]
    return "".join(tokenizer.convert_ids_to_tokens(next_ids))


def test_the_label_mask_marks_the_assistant_replies(tokenizer):
    one = distill_labels.encode_conversation(tokenizer, CONVERSATIONS[1], 1000)
    assert labelled_text(tokenizer, one) == "4.<|im_end|>Yes, 4.<|im_end|>"
    assert len(one.ids) == len(one.label_mask)
    cut = distill_labels.encode_conversation(tokenizer, CONVERSATIONS[6], 64)
    # 36 template tokens come first, and the last position has no next token
    assert len(cut.ids) == 64 and labelled_text(tokenizer, cut) == "x" * 28


def test_selection_stops_at_the_token_budget_and_holds_out_the_last(sequences, tokenizer):
    training, heldout = sequences
    counts = [sum(s.label_mask) for s in training]
    assert sum(counts[:-1]) < LABELS.train_tokens <= sum(counts)
    assert [labelled_text(tokenizer, s) for s in heldout] == [
        "held out<|im_end|>",
        "also held out<|im_end|>",
    ]


def test_batched_labels_equal_each_sequences_own_forward(verifier, sequences):
    training, _ = sequences
    function = distill_labels.label_function(verifier, LABELS.top_k_labels, compile=False)
    items = distill_labels.label_batch(function, training[:3], length=64, rows=3, pad_id=0)
    for sequence, item in zip(training[:3], items, strict=True):
        with torch.no_grad():
            output = verifier(input_ids=torch.tensor([sequence.ids]), output_hidden_states=True)
        features = output.hidden_states[-1][0]  # [T, H]
        top = torch.softmax(output.logits[0], -1).topk(LABELS.top_k_labels, dim=-1)
        torch.testing.assert_close(item["features"].double(), features, rtol=2**-7, atol=1e-6)
        assert torch.equal(item["top_ids"].long(), top.indices)
        torch.testing.assert_close(item["top_probs"].double(), top.values, rtol=2**-10, atol=1e-6)
        assert item["label_mask"].tolist() == sequence.label_mask


def test_batches_use_the_smallest_bucket():
    lengths = [5, 128, 129, 300, 7]
    fake = [distill_labels.Sequence([0] * n, [False] * n) for n in lengths]
    plan = distill_labels.plan_batches(fake, batch_tokens=256)
    assert plan == [(128, [0, 4]), (128, [1]), (256, [2]), (512, [3])]
    with pytest.raises(ValueError, match="^max_length: a sequence of 600 tokens exceeds 512"):
        distill_labels.plan_batches([distill_labels.Sequence([0] * 600, [False] * 600)], 256)


def test_an_interrupted_label_pass_resumes_to_the_same_shards(verifier, sequences, tmp_path):
    training, _ = sequences
    run = lambda folder: distill_labels.build_labels(  # noqa: E731
        verifier, training, LABELS, folder, pad_id=0, say=print, compile=False
    )
    run(tmp_path / "a")
    shards = sorted((tmp_path / "a").glob("shard-*.pt"))
    assert len(shards) >= 2
    reference = [torch.load(path, weights_only=True) for path in shards]
    shards[-1].unlink()  # as if stopped before the last shard
    run(tmp_path / "a")
    again = [torch.load(path, weights_only=True) for path in shards]
    for old, new in zip(reference, again, strict=True):
        for left, right in zip(old, new, strict=True):
            assert all(torch.equal(left[key], right[key]) for key in left)
    items = distill_labels.load_shards(tmp_path / "a")
    assert sorted(len(item["ids"]) for item in items) == sorted(len(s.ids) for s in training)


@pytest.fixture(scope="module")
def labelled(verifier, sequences):
    training, heldout = sequences
    function = distill_labels.label_function(verifier, LABELS.top_k_labels, compile=False)

    def label(group):
        batches = [group[start : start + 2] for start in range(0, len(group), 2)]
        return [item for b in batches for item in distill_labels.label_batch(function, b, 64, 2, 0)]

    return label(training), label(heldout)


def test_the_subset_holds_the_tokens_of_most_label_mass(labelled):
    items, _ = labelled
    subset = distill.choose_subset(items, 99, 40)
    mass = np.zeros(99)
    for item in items:
        mask = item["label_mask"]
        np.add.at(
            mass,
            item["top_ids"][mask].numpy().ravel(),
            item["top_probs"][mask].double().numpy().ravel(),
        )
    assert set(subset.tolist()) == set(np.argsort(-mass, kind="stable")[:40].tolist())
    assert distill.subset_coverage(items, subset) == pytest.approx(mass[subset].sum() / mass.sum())


def test_heldout_alpha_is_the_exact_sps_acceptance(verifier, labelled):
    from cactus_theory.decode.feature_draft import FeatureDraft

    _, heldout = labelled
    draft = FeatureDraft.build(verifier, distill.draft_config(verifier, SETTINGS), seed=1)
    draft.set_subset(distill.choose_subset(heldout, 99, 40))
    metrics = distill.heldout_metrics(draft, heldout[:1], SETTINGS, distill.subset_index(draft))
    item = heldout[0]
    ids = item["ids"][None].long()
    before = distill.shifted_inputs(item["features"][None].double())
    with torch.no_grad():
        logits, _ = draft(ids, before)
    rule, alphas = rules.make("sps"), []
    for t in np.flatnonzero(item["label_mask"].numpy()):
        draft_probs = process_logits(logits[0, t], PAPER_SETTING).double().numpy()
        target = np.zeros(99)
        target[item["top_ids"][t].numpy()] = item["top_probs"][t].double().numpy()
        with np.errstate(divide="ignore"):
            target_logits = torch.tensor(np.log(target))  # −inf outside the top-K
        target_probs = process_logits(target_logits, PAPER_SETTING).numpy()
        alphas.append(law.acceptance(rule, target=target_probs, draft=draft_probs))
    assert metrics["alpha"] == pytest.approx(np.mean(alphas), abs=1e-6)


def test_training_lowers_the_loss_and_resumes_to_the_same_draft(
    verifier, labelled, tmp_path, monkeypatch
):
    items, held = labelled
    heldout = {"heldout": held, "again": held[:1]}
    untrained = dataclasses.replace(SETTINGS, learning_rate=0.0)
    _, before = distill.train_draft(verifier, items, heldout, untrained, tmp_path / "a", print)
    reference, after = distill.train_draft(
        verifier, items, heldout, SETTINGS, tmp_path / "b", print
    )
    assert after["heldout_soft_ce"] < before["heldout_soft_ce"]
    assert after["again_soft_ce"] < before["again_soft_ce"]  # every held-out set is measured
    assert {"heldout_alpha", "again_alpha"} <= set(after["curve"][-1])
    steps = 4 * -(-len(items) // 2)  # 4 epochs of batches of 2
    assert [point["step"] for point in after["curve"]] == list(range(2, steps + 1, 2))

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


def test_bad_command_settings_are_errors():
    import argparse

    parser = argparse.ArgumentParser()
    distill.configure(parser)
    with pytest.raises(ValueError, match="^--epochs must be at least 1"):
        distill.settings_from(parser.parse_args(["--epochs", "0"]))
    with pytest.raises(ValueError, match="^--draft-vocab must be 0"):
        distill.settings_from(parser.parse_args(["--draft-vocab", "-1"]))
    with pytest.raises(ValueError, match="^--answer-tokens must be 0"):
        distill.settings_from(parser.parse_args(["--answer-tokens", "-5"]))
    settings = distill.settings_from(parser.parse_args(["--draft-vocab", "0"]))
    assert settings.draft_vocab is None
    assert settings.answers == distill.DistillSettings().answers
    assert distill.settings_from(parser.parse_args(["--answer-tokens", "0"])).answers is None
