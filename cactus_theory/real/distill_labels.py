"""Teacher-forced labels for draft training: the verifier's features and top-K laws over
ShareGPT conversations, from batched prefills instead of token-by-token generation.

EAGLE's recipe: a fixed conversation (ShareGPT's own replies) is rendered through the
verifier's chat template and read by the verifier in one forward pass; at every position t
that forward gives the feature f_t (the last hidden state, after the final norm) and the
verifier's next-token law q_{t+1} = softmax(head(f_t)) (T = 1, unprocessed). The draft is
trained on exactly these pairs, so the answers never have to be generated.

1. **sequences** (``encode_conversation``): the chat-template text of a conversation,
   tokenized with character offsets, cut to ``max_length`` tokens. ``label_mask[t]`` is
   true when token t + 1 belongs to an assistant reply (its text or its closing
   ``<|im_end|>``): the positions whose q the draft must learn. Conversations are taken in
   file order until ``train_tokens`` labelled positions are reached; the last
   ``heldout_conversations`` usable conversations of the file are held out.
2. **labels** (``label_batch``): sequences are sorted by length into fixed shapes
   [B, T] (T in ``BUCKETS``, B·T = ``batch_tokens``), right-padded (causal attention never
   lets a real position see the padding, so no mask is needed), and each batch goes
   through one compiled function: body forward, head, log-softmax, top-K. Per position:

       features[t]  = f_t                                   [H]   bfloat16
       top_ids[t]   = the K most likely next tokens under q  [K]   int32
       top_probs[t] = q_{t+1}(top_ids[t])                    [K]   float16

   Shards of about ``shard_tokens`` positions are written atomically, so an interrupted
   pass resumes at the first missing shard.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from cactus_theory.util.files import atomic_write

#: Padded lengths of the label batches (a sequence goes into the smallest that holds it).
BUCKETS = (128, 256, 512)


@dataclass(frozen=True)
class LabelSettings:
    """What determines the labels (and so their cache key)."""

    max_length: int = 512
    train_tokens: int = 1_200_000  # labelled positions to collect for training
    heldout_conversations: int = 64
    top_k_labels: int = 32
    batch_tokens: int = 4096
    shard_tokens: int = 65_536
    dtype: str = "bfloat16"  # the verifier's dtype in the label pass


@dataclass
class Sequence:
    ids: list[int]  # [T]
    label_mask: list[bool]  # [T]: token t + 1 is an assistant token


def encode_conversation(tokenizer, turns: list[tuple[str, str]], max_length: int) -> Sequence:
    """The chat-template tokens of ``turns`` (cut to ``max_length``) and the label mask
    (module docstring)."""
    messages = [{"role": role, "content": text} for role, text in turns]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []  # character spans of the assistant replies, each with its <|im_end|>
    cursor = 0
    end_marker = tokenizer.eos_token or ""
    for role, content in turns:
        start = text.index(content, cursor)
        cursor = start + len(content)
        if role == "assistant":
            stop = cursor + len(end_marker) if text.startswith(end_marker, cursor) else cursor
            spans.append((start, stop))
    encoded = tokenizer(
        text, add_special_tokens=False, return_offsets_mapping=True, truncation=False
    )
    ids = encoded["input_ids"][:max_length]
    offsets = encoded["offset_mapping"][:max_length]
    in_reply = []
    span = 0
    for start, _ in offsets:
        while span < len(spans) and spans[span][1] <= start:
            span += 1
        in_reply.append(span < len(spans) and spans[span][0] <= start < spans[span][1])
    label_mask = in_reply[1:] + [False]  # position t predicts token t + 1
    return Sequence(ids=ids, label_mask=label_mask)


def select_sequences(tokenizer, conversations: list, settings: LabelSettings):
    """(training sequences, held-out sequences): training takes conversations in order
    until ``train_tokens`` labelled positions; held out are the last
    ``heldout_conversations`` (never trained on)."""
    held = conversations[len(conversations) - settings.heldout_conversations :]
    pool = conversations[: len(conversations) - settings.heldout_conversations]
    heldout = [encode_conversation(tokenizer, turns, settings.max_length) for turns in held]
    training, labelled = [], 0
    for turns in pool:
        if labelled >= settings.train_tokens:
            break
        sequence = encode_conversation(tokenizer, turns, settings.max_length)
        count = sum(sequence.label_mask)
        if count == 0:
            continue
        training.append(sequence)
        labelled += count
    return training, heldout


def top_labels(logits, top_k: int):
    """(top_probs [..., K] float16, top_ids [..., K] int32): the K most likely tokens of
    q = softmax(logits [..., V]) (T = 1, unprocessed) and their probabilities."""
    import torch

    top_log_probs, top_ids = torch.log_softmax(logits.float(), dim=-1).topk(top_k, dim=-1)
    return top_log_probs.exp().to(torch.float16), top_ids.to(torch.int32)


def label_function(verifier, top_k: int, compile: bool = True):
    """ids [B, T] -> (features [B, T, H] bf16, top_probs [B, T, K] f16, top_ids [B, T, K]
    int32): the verifier's body, head, log-softmax and top-K, compiled (fixed shapes) when
    ``compile`` and a compiler is available."""
    import torch

    body = verifier.model
    head = verifier.get_output_embeddings()

    def labels(ids):
        features = body(input_ids=ids).last_hidden_state  # [B, T, H] after the final norm
        top_probs, top_ids = top_labels(head(features), top_k)  # [B, T, K]
        return features.to(torch.bfloat16), top_probs, top_ids

    if compile:
        try:
            return torch.compile(labels, dynamic=False)
        except Exception:  # no compiler on this machine: eager is exact, only slower
            return labels
    return labels


def plan_batches(sequences: list[Sequence], batch_tokens: int) -> list[tuple[int, list[int]]]:
    """(padded length T, sequence indices) per batch: sorted by length, each batch of the
    smallest bucket that holds its longest sequence, B = batch_tokens // T rows."""
    order = sorted(range(len(sequences)), key=lambda index: len(sequences[index].ids))
    buckets: dict[int, list[int]] = {}
    for index in order:
        length = len(sequences[index].ids)
        bucket = next((size for size in BUCKETS if size >= length), None)
        if bucket is None:
            raise ValueError(f"max_length: a sequence of {length} tokens exceeds {BUCKETS[-1]}")
        buckets.setdefault(bucket, []).append(index)
    plan = []
    for length, indices in sorted(buckets.items()):
        rows = max(1, batch_tokens // length)
        plan.extend((length, indices[i : i + rows]) for i in range(0, len(indices), rows))
    return plan


def label_batch(function, sequences: list[Sequence], length: int, rows: int, pad_id: int):
    """Run ``function`` on one padded batch; per sequence a dict of its labelled tensors."""
    import torch

    ids = torch.full((rows, length), pad_id, dtype=torch.int64)  # [B, T] right-padded
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence.ids)] = torch.tensor(sequence.ids)
    with torch.inference_mode():
        features, top_probs, top_ids = function(ids)
    items = []
    for row, sequence in enumerate(sequences):
        n = len(sequence.ids)
        items.append(
            {
                "ids": ids[row, :n].to(torch.int32),
                "label_mask": torch.tensor(sequence.label_mask),
                "features": features[row, :n].clone(),
                "top_ids": top_ids[row, :n].clone(),
                "top_probs": top_probs[row, :n].clone(),
            }
        )
    return items


def build_labels(verifier, sequences: list[Sequence], settings: LabelSettings, folder: Path,
                 pad_id: int, say=print, compile: bool = True) -> dict:  # fmt: skip
    """Label every sequence into shards under ``folder`` (resuming); returns timings."""
    import torch

    plan = plan_batches(sequences, settings.batch_tokens)
    shards, current, size = [], [], 0
    for batch in plan:
        current.append(batch)
        size += sum(len(sequences[i].ids) for i in batch[1])
        if size >= settings.shard_tokens:
            shards.append(current)
            current, size = [], 0
    if current:
        shards.append(current)
    function = None
    labelled_tokens, seconds = 0, 0.0
    for number, shard in enumerate(shards):
        path = folder / f"shard-{number:05d}.pt"
        if path.is_file():
            continue
        if function is None:
            function = label_function(verifier, settings.top_k_labels, compile)
        started = time.perf_counter()
        items = []
        for length, indices in shard:
            rows = max(1, settings.batch_tokens // length)
            items.extend(
                label_batch(function, [sequences[i] for i in indices], length, rows, pad_id)
            )
        spent = time.perf_counter() - started
        tokens = sum(len(item["ids"]) for item in items)
        if number > 0 or len(shards) == 1:  # the first shard pays for compiling
            labelled_tokens, seconds = labelled_tokens + tokens, seconds + spent
        atomic_write(path, lambda target, items=items: torch.save(items, target))
        rate = tokens / max(spent, 1e-9)
        say(f"  labels: shard {number + 1}/{len(shards)}, {tokens} tokens, {rate:.0f} tokens/s")
    return {
        "shards": len(shards),
        "tokens_per_s": labelled_tokens / seconds if seconds else None,
    }


def load_shards(folder: Path, limit: int | None = None) -> list[dict]:
    """The items of the shards in ``folder`` in order (the first ``limit`` shards)."""
    import torch

    items = []
    for path in sorted(folder.glob("shard-*.pt"))[:limit]:
        items.extend(torch.load(path, weights_only=True))
    return items


def labels_folder(settings: LabelSettings, verifier_path: Path) -> Path:
    """The labels' cache folder, keyed by their settings, the data set and the verifier."""
    import dataclasses
    import json

    from cactus_theory.real import smollm
    from cactus_theory.real.datasets import SHAREGPT
    from cactus_theory.util.provenance import fingerprint

    verifier_config = json.loads((Path(verifier_path) / "config.json").read_text())
    key = fingerprint(dataclasses.asdict(settings), SHAREGPT.wheel, verifier_config)
    return smollm.folder() / f"labels-{key}"


def prepare(settings: LabelSettings, verifier_path: Path, threads: int = 2, say=print) -> dict:
    """Build (or resume) the labels: the sequences, then every shard. Returns a summary
    (counts and the label pass's tokens/s, compile time excluded)."""
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cactus_theory.real.datasets import ShareGptStats, conversations
    from cactus_theory.util.files import atomic_write_json

    torch.set_num_threads(threads)
    folder = labels_folder(settings, verifier_path)
    summary_path = folder / "summary.json"
    if summary_path.is_file():
        return json.loads(summary_path.read_text())
    tokenizer = AutoTokenizer.from_pretrained(verifier_path)
    stats = ShareGptStats()
    usable = list(conversations(stats=stats))
    training, heldout = select_sequences(tokenizer, usable, settings)
    dtype = getattr(torch, settings.dtype)
    verifier = AutoModelForCausalLM.from_pretrained(verifier_path, dtype=dtype).eval()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    say(f"  labels: {len(training)} training and {len(heldout)} held-out conversations")
    started = time.perf_counter()
    train_timing = build_labels(verifier, training, settings, folder / "train", pad_id, say)
    build_labels(verifier, heldout, settings, folder / "heldout", pad_id, say)
    summary = {
        "sharegpt_records": stats.records,
        "sharegpt_usable": stats.kept,
        "sharegpt_user_turns": stats.user_turns,
        "train_conversations": len(training),
        "train_positions": sum(len(s.ids) for s in training),
        "train_labelled": sum(sum(s.label_mask) for s in training),
        "heldout_conversations": len(heldout),
        "heldout_labelled": sum(sum(s.label_mask) for s in heldout),
        "label_tokens_per_s": train_timing["tokens_per_s"],
        "label_pass_s": round(time.perf_counter() - started, 1),
        "threads": threads,
    }
    atomic_write_json(summary_path, summary, indent=2)
    return summary
