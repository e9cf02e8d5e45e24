"""Self-distilled answers: the verifier's own replies to ShareGPT's first user turns,
generated in large batches, labelled while they are generated.

ShareGPT's replies are ChatGPT's text; decoding shows the draft the verifier's own text,
sampled with the paper's processors. A draft trained on ShareGPT alone accepts less on
the verifier's own answers than on ShareGPT's (measured on the previous draft: one-step
held-out α 0.36 on ShareGPT conversations, 0.29 on the verifier's MT-Bench answers). These
answers are that distribution, and their labels cost nothing extra: the generation's own
forwards give them.

1. **prompts** (``answer_prompts``): the first user turn of each training conversation in
   file order (never the held-out conversations; never MT-Bench or HumanEval), through the
   chat template with the generation prompt; a prompt longer than ``max_prompt_tokens`` is
   skipped, not cut.
2. **generation** (``generate_answers``): ``batch_rows`` prompts, left-padded, go through
   one prefill and then one forward per token with a KV cache (``decode.cache.CachedModel``).
   Each forward gives, per row,

       features[t]  = f_t, the verifier's last hidden state           [H]  bfloat16
       top_ids[t]   = the K most likely next tokens under q_{t+1}     [K]  int32
       top_probs[t] = q_{t+1}(top_ids[t])   (T = 1, unprocessed)      [K]  float16

   exactly what ``distill_labels`` takes from a teacher-forced prefill, and the next token
   is sampled from q̃_{t+1} (the paper's processors: T = 0.6, top-k 20, top-p 0.95). A row
   that samples EOS or reaches ``max_new_tokens`` leaves the batch (its cache rows are
   dropped); its last token is not fed, so an item is the prompt and the answer without
   its last token, labelled (``label_mask``) at the last prompt position and at every
   answer position: each predicts the next answer token.
3. **shards** of ``prompts_per_shard`` prompts, sorted by length into batches, sampled with
   a generator seeded by (seed, shard) and written atomically: an interrupted run resumes at
   the first missing shard and makes the same data. Shards are added until
   ``answer_tokens`` labelled positions are reached. The held-out conversations' first
   turns get answers the same way (``heldout``), for the learning curve on the verifier's
   own text.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from cactus_theory.util.files import atomic_write


@dataclass(frozen=True)
class AnswerSettings:
    """What determines the self-distilled answers (and so their cache key)."""

    answer_tokens: int = 800_000  # labelled positions to generate for training
    heldout_prompts: int = 64  # the held-out conversations' first turns
    max_prompt_tokens: int = 256
    max_new_tokens: int = 192
    batch_rows: int = 96
    prompts_per_shard: int = 384
    top_k_labels: int = 32
    temperature: float = 0.6  # the paper's processors (core.processors.PAPER_SETTING)
    top_k: int = 20
    top_p: float = 0.95
    seed: int = 0
    dtype: str = "bfloat16"  # the verifier's dtype while generating


def answer_prompts(tokenizer, conversations: list, settings: AnswerSettings, heldout: int):
    """(training prompts, held-out prompts) as token-id lists (module docstring, step 1):
    the last ``heldout`` conversations are held out, as in ``distill_labels``."""
    cut = len(conversations) - heldout

    def encode(turns) -> list[int] | None:
        messages = [{"role": "user", "content": turns[0][1]}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids if len(ids) <= settings.max_prompt_tokens else None

    training = [ids for ids in map(encode, conversations[:cut]) if ids is not None]
    held = [ids for ids in map(encode, conversations[cut:]) if ids is not None]
    return training, held[: settings.heldout_prompts]


@dataclass
class _Row:
    """One answer being generated: what its item will hold (module docstring)."""

    prompt: list[int]
    features: list  # [H] bfloat16 tensors, one per fed position
    top_ids: list  # [K] per fed position
    top_probs: list  # [K] per fed position
    answer: list[int]

    def item(self) -> dict:
        import torch

        ids = self.prompt + self.answer[:-1]  # the last answer token is never fed
        labelled = [False] * (len(self.prompt) - 1) + [True] * len(self.answer)
        return {
            "ids": torch.tensor(ids, dtype=torch.int32),
            "label_mask": torch.tensor(labelled),
            "features": torch.stack(self.features),  # [T, H]
            "top_ids": torch.stack(self.top_ids),  # [T, K]
            "top_probs": torch.stack(self.top_probs),  # [T, K]
        }


def generate_answers(verifier, prompts: list[list[int]], settings: AnswerSettings, pad_id: int,
                     eos: set[int], generator) -> list[dict]:  # fmt: skip
    """Answers to one batch of prompts (token-id lists) with their labels (module
    docstring, step 2): one item per prompt, in order, on the CPU (the verifier may be on
    any device; ``generator`` is a CPU generator)."""
    import torch

    from cactus_theory import sampler
    from cactus_theory.core.processors import SamplingSettings
    from cactus_theory.decode.cache import CachedModel, positions_of_prompt
    from cactus_theory.real.distill_labels import top_labels
    from cactus_theory.sampler.processors import process_logits

    processors = SamplingSettings(settings.temperature, settings.top_k, settings.top_p)
    device = next(verifier.parameters()).device
    batch, width = len(prompts), max(len(ids) for ids in prompts)
    ids = torch.full((batch, width), pad_id, dtype=torch.int64)  # [B, P] left-padded
    mask = torch.zeros(batch, width, dtype=torch.int64)  # [B, P]
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    rows = [_Row(prompt, [], [], [], []) for prompt in prompts]
    model = CachedModel(verifier, batch, ids.device)
    no_label = (torch.zeros(settings.top_k_labels, dtype=torch.int32),
                torch.zeros(settings.top_k_labels, dtype=torch.float16))  # fmt: skip
    with torch.inference_mode():
        logits, hidden = model.forward(ids, mask, positions_of_prompt(mask), keep=1, hidden=True)
        for row, prompt in enumerate(prompts):  # prompt features; no labels before its end
            rows[row].features.extend(hidden[row, width - len(prompt) :].to("cpu", torch.bfloat16))
            rows[row].top_ids.extend([no_label[0]] * (len(prompt) - 1))
            rows[row].top_probs.extend([no_label[1]] * (len(prompt) - 1))
        active = list(range(batch))  # the prompt index of each batch row
        count = mask.sum(dim=1)  # [A] tokens in the cache per row
        while True:
            last_logits = logits[:, -1]  # [A, V] the law of each row's next token
            top_probs, top_ids = top_labels(last_logits, settings.top_k_labels)  # [A, K]
            top_probs, top_ids = top_probs.cpu(), top_ids.cpu()
            probs = process_logits(last_logits, processors)  # [A, V] q̃
            uniforms = torch.rand(len(active), generator=generator, dtype=torch.float64)
            tokens = sampler.inverse_cdf(probs, uniforms.to(device)).cpu()  # [A]
            keep = []
            for index, row in enumerate(active):
                state, token = rows[row], int(tokens[index])
                state.top_ids.append(top_ids[index])
                state.top_probs.append(top_probs[index])
                state.answer.append(token)
                if token not in eos and len(state.answer) < settings.max_new_tokens:
                    keep.append(index)
            if not keep:
                break
            kept = torch.tensor(keep)
            if len(keep) < len(active):
                model.select_rows(kept.to(device))
                active, count = [active[index] for index in keep], count[kept.to(device)]
            fed = tokens[kept][:, None].to(device)  # [A, 1]
            logits, hidden = model.forward(fed, torch.ones_like(fed), count[:, None], hidden=True)
            count = count + 1
            for index, row in enumerate(active):
                rows[row].features.append(hidden[index, -1].to("cpu", torch.bfloat16))
    return [state.item() for state in rows]


def shard_batches(prompts: list[list[int]], rows: int) -> list[list[int]]:
    """Indices of ``prompts`` in batches of ``rows``, sorted by length (less padding)."""
    order = sorted(range(len(prompts)), key=lambda index: len(prompts[index]))
    return [order[start : start + rows] for start in range(0, len(order), rows)]


def labelled_count(items: list[dict]) -> int:
    """The labelled positions of a shard's items."""
    return sum(int(item["label_mask"].sum()) for item in items)


def build_answers(verifier, prompts: list[list[int]], settings: AnswerSettings, folder: Path,
                  pad_id: int, eos: set[int], target_tokens: int | None,
                  say=print) -> dict:  # fmt: skip
    """Generate shards under ``folder`` (resuming) until ``target_tokens`` labelled positions
    (None: every prompt); returns counts and the generation rate."""
    import torch

    per_shard = settings.prompts_per_shard
    labelled, generated, seconds, number = 0, 0, 0.0, 0
    while number * per_shard < len(prompts):
        if target_tokens is not None and labelled >= target_tokens:
            break
        path = folder / f"shard-{number:05d}.pt"
        if path.is_file():
            count = labelled_count(torch.load(path, weights_only=True))
        else:
            chosen = prompts[number * per_shard : (number + 1) * per_shard]
            generator = torch.Generator().manual_seed(settings.seed * 1_000_003 + number)
            started = time.perf_counter()
            items = [None] * len(chosen)
            for batch in shard_batches(chosen, settings.batch_rows):
                made = generate_answers(
                    verifier, [chosen[i] for i in batch], settings, pad_id, eos, generator
                )
                for index, item in zip(batch, made, strict=True):
                    items[index] = item
            spent = time.perf_counter() - started
            atomic_write(path, lambda target, items=items: torch.save(items, target))
            count = labelled_count(items)
            generated, seconds = generated + count, seconds + spent
            rate = count / max(spent, 1e-9)
            say(f"  answers: shard {number + 1}, {count} tokens, {rate:.0f} tokens/s")
        labelled += count
        number += 1
    return {
        "shards": number,
        "prompts": min(number * per_shard, len(prompts)),
        "labelled": labelled,
        "tokens_per_s": generated / seconds if seconds else None,
    }


def answers_folder(settings: AnswerSettings, verifier_path: Path) -> Path:
    """The answers' cache folder, keyed by their settings (but ``answer_tokens``, which only
    says how many of the same shards to make), the data set and the verifier."""
    import dataclasses
    import json

    from cactus_theory.real import smollm
    from cactus_theory.real.datasets import SHAREGPT
    from cactus_theory.util.provenance import fingerprint

    verifier_config = json.loads((Path(verifier_path) / "config.json").read_text())
    shards = dataclasses.replace(settings, answer_tokens=0)
    key = fingerprint(dataclasses.asdict(shards), SHAREGPT.wheel, verifier_config)
    return smollm.folder() / f"answers-{key}"


def prepare(settings: AnswerSettings, verifier_path: Path, heldout_conversations: int,
            threads: int = 2, say=print) -> dict:  # fmt: skip
    """Generate (or resume) the training and held-out answers; returns a summary. The held
    out conversations are the last ``heldout_conversations`` of ShareGPT, as for the
    labels."""
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cactus_theory.real.datasets import conversations
    from cactus_theory.util.files import atomic_write_json

    torch.set_num_threads(threads)
    folder = answers_folder(settings, verifier_path)
    summary_path = folder / f"summary-{settings.answer_tokens}.json"
    if summary_path.is_file():
        return json.loads(summary_path.read_text())
    tokenizer = AutoTokenizer.from_pretrained(verifier_path)
    training, heldout = answer_prompts(
        tokenizer, list(conversations()), settings, heldout_conversations
    )
    dtype = getattr(torch, settings.dtype)
    verifier = AutoModelForCausalLM.from_pretrained(verifier_path, dtype=dtype).eval()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    configured = verifier.generation_config.eos_token_id
    configured = configured if isinstance(configured, list) else [configured]
    eos = {tokenizer.eos_token_id, *configured} - {None}
    say(f"  answers: {len(training)} usable training prompts, {len(heldout)} held out")
    started = time.perf_counter()
    train = build_answers(
        verifier, training, settings, folder / "train", pad_id, eos, settings.answer_tokens, say
    )
    held = build_answers(verifier, heldout, settings, folder / "heldout", pad_id, eos, None, say)
    summary = {
        "usable_prompts": len(training),
        "train_shards": train["shards"],
        "train_prompts": train["prompts"],
        "train_labelled": train["labelled"],
        "heldout_prompts": held["prompts"],
        "heldout_labelled": held["labelled"],
        "answer_tokens_per_s": train["tokens_per_s"],
        "answer_pass_s": round(time.perf_counter() - started, 1),
        "threads": threads,
    }
    atomic_write_json(summary_path, summary, indent=2)
    return summary
