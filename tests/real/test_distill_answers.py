"""Self-distilled answers (``cactus_theory.real.distill_answers``) on a tiny random verifier and a
character-level ChatML tokenizer.

- prompts: first user turns through the chat template, long ones skipped, the last
  conversations held out;
- the labels taken while generating equal a teacher-forced forward over the finished
  sequence (oracle: the verifier's own forward; float64, tolerance 1e-9), with the label
  mask on the last prompt position and every answer position;
- the first answer token follows the processed law q̃ (chi-square at the suite's level on
  4,000 rows, with the unprocessed law as the negative control that must be rejected);
- rows leave the batch at EOS or ``max_new_tokens`` without changing the other rows;
- an interrupted pass resumes to the same shards, bit for bit, and stops at the token target.
"""

import dataclasses

import numpy as np
import pytest
import torch
import torch_tiny_models as tiny
from goodness_of_fit import LEVEL, chi_square_pvalue

from cactus_theory.core.processors import SamplingSettings
from cactus_theory.real import distill_answers
from cactus_theory.sampler.processors import process_logits

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SETTINGS = distill_answers.AnswerSettings(
    answer_tokens=40, heldout_prompts=2, max_prompt_tokens=40, max_new_tokens=12,
    batch_rows=3, prompts_per_shard=4, top_k_labels=16, dtype="float64",
)  # fmt: skip
CONVERSATIONS = [
    [("user", "Hi"), ("assistant", "Yo!")],
    [("user", "What is 2+2?"), ("assistant", "4."), ("user", "Sure?"), ("assistant", "Yes")],
    [("user", "x" * 60), ("assistant", "too long a prompt")],
    [("user", "Name a colour."), ("assistant", "Blue")],
    [("user", "Spell cat"), ("assistant", "c-a-t")],
    [("user", "Count"), ("assistant", "1 2 3")],
    [("user", "Say hello"), ("assistant", "hello")],
    [("user", "More"), ("assistant", "more")],
    [("user", "Last"), ("assistant", "held out")],
    [("user", "Really last"), ("assistant", "also held out")],
]
EOS = 2  # <|im_end|>


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return distill_answers.answer_prompts(tokenizer, CONVERSATIONS, SETTINGS, heldout=2)


def test_prompts_are_first_turns_with_long_ones_skipped_and_the_last_held_out(tokenizer, prompts):
    training, heldout = prompts
    text = ["".join(tokenizer.convert_ids_to_tokens(ids)) for ids in training]
    assert len(training) == 7  # 8 conversations before the held-out two, one too long
    assert text[1].endswith("What is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert "Sure?" not in text[1]
    held_text = ["".join(tokenizer.convert_ids_to_tokens(ids)) for ids in heldout]
    assert ["Last" in item for item in held_text] == [True, False]


def generate(verifier, prompts, settings=SETTINGS, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return distill_answers.generate_answers(verifier, prompts, settings, 0, {EOS}, generator)


def test_labels_taken_while_generating_equal_a_teacher_forced_forward(verifier, prompts):
    training, _ = prompts
    items = generate(verifier, training[:4])
    lengths = {
        len(item["ids"]) - len(prompt) for item, prompt in zip(items, training[:4], strict=True)
    }
    assert len(lengths) > 1  # a row left the batch early (EOS): the cache rows were dropped
    for prompt, item in zip(training[:4], items, strict=True):
        ids = item["ids"].long()
        assert ids[: len(prompt)].tolist() == prompt
        answer = len(ids) - len(prompt) + 1  # the last answer token is not in the item
        assert 1 <= answer <= SETTINGS.max_new_tokens
        mask = [False] * (len(prompt) - 1) + [True] * answer
        assert item["label_mask"].tolist() == mask
        with torch.no_grad():
            output = verifier(input_ids=ids[None].to(tiny.DEVICE), output_hidden_states=True)
        features = output.hidden_states[-1][0].cpu()  # [T, H]
        top = torch.softmax(output.logits[0].cpu(), -1).topk(SETTINGS.top_k_labels, dim=-1)
        torch.testing.assert_close(item["features"].double(), features, rtol=2**-7, atol=1e-6)
        labelled = item["label_mask"]
        assert torch.equal(item["top_ids"][labelled].long(), top.indices[labelled])
        torch.testing.assert_close(
            item["top_probs"][labelled].double(), top.values[labelled], rtol=2**-10, atol=1e-6
        )


def test_the_first_answer_token_follows_the_processed_law(verifier, prompts):
    training, _ = prompts
    prompt = training[0]
    settings = dataclasses.replace(SETTINGS, max_new_tokens=2, temperature=0.7, top_k=8)
    items = generate(verifier, [prompt] * 4000, settings, seed=3)
    first = np.array([int(item["ids"][len(prompt)]) for item in items if len(item["ids"]) > 1])
    eos_first = sum(len(item["ids"]) == len(prompt) for item in items)  # EOS came first
    counts = np.bincount(first, minlength=99).astype(float)
    counts[EOS] += eos_first
    with torch.no_grad():
        logits = verifier(input_ids=torch.tensor([prompt], device=tiny.DEVICE)).logits[0, -1].cpu()
    law = process_logits(logits, SamplingSettings(0.7, 8, settings.top_p)).numpy()
    plain = torch.softmax(logits, -1).numpy()
    assert chi_square_pvalue(counts, law) > LEVEL
    assert chi_square_pvalue(counts, plain) < LEVEL  # negative control


def test_rows_leave_at_eos_or_the_limit(verifier, prompts):
    """No EOS inside an answer (EOS is the last, dropped token), no answer over the limit,
    and a shorter limit cuts the same answers (leaving rows do not disturb the others
    before they leave)."""
    training, _ = prompts
    long = generate(verifier, training[:4], seed=5)
    short = generate(verifier, training[:4], dataclasses.replace(SETTINGS, max_new_tokens=3), 5)
    for item, cut, prompt in zip(long, short, training[:4], strict=True):
        assert EOS not in item["ids"][len(prompt) :].tolist()
        assert len(item["ids"]) - len(prompt) + 1 <= SETTINGS.max_new_tokens
        assert len(cut["ids"]) - len(prompt) + 1 <= 3
        assert torch.equal(cut["ids"], item["ids"][: len(cut["ids"])])


def test_an_interrupted_pass_resumes_to_the_same_shards(verifier, prompts, tmp_path):
    training, _ = prompts

    def run(target):
        return distill_answers.build_answers(
            verifier, training, SETTINGS, tmp_path, 0, {EOS}, target, say=print
        )

    summary = run(SETTINGS.answer_tokens)
    shards = sorted(tmp_path.glob("shard-*.pt"))
    assert len(shards) == summary["shards"] >= 1
    assert summary["labelled"] >= SETTINGS.answer_tokens or summary["prompts"] == len(training)
    reference = [torch.load(path, weights_only=True) for path in shards]
    shards[-1].unlink()  # as if stopped before the last shard
    again = run(SETTINGS.answer_tokens)
    assert again["labelled"] == summary["labelled"]
    for old, new in zip(reference, [torch.load(p, weights_only=True) for p in shards], strict=True):
        for left, right in zip(old, new, strict=True):
            assert all(torch.equal(left[key], right[key]) for key in left)
    everything = run(None)
    assert everything["prompts"] == len(training)


def test_training_data_joins_labels_and_the_answer_shards_it_asked_for(
    verifier, tokenizer, tmp_path, monkeypatch
):
    """``distill.training_data`` on a saved tiny verifier and stand-in conversations: the
    ShareGPT labels, then the first ``train_shards`` answer shards (the folder may hold
    more, made for a larger target), and both held-out sets."""
    from cactus_theory.real import datasets, distill, distill_labels

    monkeypatch.setenv("CACTUS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(datasets, "conversations", lambda stats=None: iter(CONVERSATIONS))
    real_function = distill_labels.label_function

    def eager(model, top_k, compile=True):
        return real_function(model, top_k, compile=False)

    monkeypatch.setattr(distill_labels, "label_function", eager)
    folder = tmp_path / "verifier"
    verifier.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    labels = distill_labels.LabelSettings(
        max_length=64, train_tokens=30, heldout_conversations=2, top_k_labels=16,
        batch_tokens=128, shard_tokens=100, dtype="float64",
    )  # fmt: skip
    small = dataclasses.replace(SETTINGS, answer_tokens=10, prompts_per_shard=2)
    settings = distill.DistillSettings(labels=labels, answers=small, threads=1)
    larger = dataclasses.replace(settings, answers=dataclasses.replace(small, answer_tokens=10**6))
    distill.training_data(larger, folder, print)  # every prompt: more shards on disk
    items, heldout, summary = distill.training_data(settings, folder, print)
    shards = summary["answers"]["train_shards"]
    answer_items = distill_labels.load_shards(
        distill_answers.answers_folder(small, folder) / "train", shards
    )
    assert shards < len(sorted((distill_answers.answers_folder(small, folder) / "train").glob("*")))
    label_count = summary["labels"]["train_conversations"]
    assert len(items) == label_count + len(answer_items) == label_count + 2 * shards
    assert summary["answers"]["train_labelled"] == sum(
        int(item["label_mask"].sum()) for item in answer_items
    )
    assert sorted(heldout) == ["answers", "heldout"]
    assert len(heldout["answers"]) == 2 and len(heldout["heldout"]) == 2
