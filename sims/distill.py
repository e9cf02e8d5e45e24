"""``cactus train-draft``: distil the default pair's feature draft from SmolLM2-135M-Instruct.

The draft (``cactus_theory.decode.feature_draft``) reads the verifier's last hidden state
f_{t−1} and the token x_t and predicts f̂_t, which the verifier's own head (or its rank-r
factor) turns into the draft law p. The recipe, in three cached phases:

1. **answers.** The verifier answers every training prompt (``sims.train_prompts``, none
   of them held out) through its chat template, in the paper's sampling setting
   (T = 0.6, top-k 20, top-p 0.95), in chunks of ``chunk`` prompts; chunk c is seeded by
   (seed, c).
2. **labels.** One teacher-forced verifier forward over each prompt + answer gives, at
   every position t, the feature f_t [H] and the top-K of q_{t+1} = softmax(head(f_t))
   (T = 1, the unprocessed law: the decoder applies the same processors to p and q).
3. **training.** Teacher forcing on the true features (with uniform noise on the inputs):

       loss_t = − Σ_{i ∈ topK(q_t)} q_t(i) log p̂_t(i)  +  w · smoothL1(f̂_t, f_t)

   averaged over ``unroll`` passes (pass j > 1 feeds the previous pass's f̂ as the
   features, as drafting past the first token does); AdamW with a cosine schedule; the
   batch of step s is drawn from (seed, s). The head's rank-r factor P starts at the top-r
   principal directions of the features.

Everything lives under ``cache_root()/smollm2/distill-<key>/`` (``key``: the answers'
settings, the prompts and the verifier; labels and training checkpoints are keyed by their
own settings), written atomically: finished chunks are kept and training checkpoints every
``checkpoint_every`` steps, so an interrupted run resumes where it stopped. The result is
written to ``--out`` (by default the shipped ``sims/drafts/smollm2/``) with a
``distill.json`` of the settings, timings and held-out losses. On 2 CPU cores shared with
other jobs the whole run took about an hour (answers 19 min, labels 13, training 27); it
is reproducible from the seed on the same machine, thread count and torch build
(sampling in bfloat16 depends on the order of floating-point sums).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from cactus_theory.util.files import atomic_write, atomic_write_json
from cactus_theory.util.provenance import fingerprint

DEFAULT_OUT = Path(__file__).resolve().parent / "drafts" / "smollm2"


@dataclass(frozen=True)
class DistillSettings:
    """Everything that determines the distilled draft (and so its cache key)."""

    seed: int = 0
    max_new_tokens: int = 128
    chunk: int = 32
    top_k_labels: int = 32
    num_layers: int = 1
    intermediate_size: int = 1024
    rank: int | None = 256
    steps: int = 360
    batch_sequences: int = 8
    learning_rate: float = 1e-3
    feature_weight: float = 0.1
    input_noise: float = 0.2  # uniform noise on input features, in units of their std
    unroll: int = 1  # passes per batch; pass j > 1 reads the draft's own features
    heldout_sequences: int = 16
    checkpoint_every: int = 40
    threads: int = 2


# --- phase 1: answers ----------------------------------------------------------------------


def generate_answers(verifier, tokenizer, prompts: list[str], settings, chunk: int) -> list:
    """Prompt + answer ids (a list of int lists) for one chunk of prompts; ``tokenizer``
    pads on the left."""
    import torch

    from cactus_theory.core.processors import PAPER_SETTING
    from cactus_theory.decode.checks import eos_ids
    from cactus_theory.decode.runs import encode_prompts

    ids, mask = encode_prompts(tokenizer, prompts, chat=True)  # [C, P] each, left-padded
    width = ids.shape[1]
    torch.manual_seed(settings.seed * 1_000_003 + chunk)
    with torch.no_grad():
        output = verifier.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=settings.max_new_tokens,
            do_sample=True,
            temperature=PAPER_SETTING.temperature,
            top_k=PAPER_SETTING.top_k,
            top_p=PAPER_SETTING.top_p,
            pad_token_id=tokenizer.pad_token_id,
        )  # [C, P + n]
    eos = set(eos_ids(verifier.generation_config.eos_token_id, verifier.config.vocab_size))
    sequences = []
    for row, answer_row in enumerate(output[:, width:].tolist()):
        answer = []
        for token in answer_row:
            answer.append(token)
            if token in eos:
                break
        sequences.append(ids[row][mask[row].bool()].tolist() + answer)
    return sequences


# --- phase 2: labels -----------------------------------------------------------------------


def label_sequences(verifier, sequences: list, settings) -> list[dict]:
    """Per sequence: ids [T], features f [T, H] (bf16), top-K ids [T, K] and probs [T, K]."""
    import torch

    labelled = []
    with torch.no_grad():
        for sequence in sequences:
            ids = torch.tensor([sequence])  # [1, T]
            output = verifier(input_ids=ids, output_hidden_states=True)
            features = output.hidden_states[-1][0]  # [T, H] after the final norm
            probs = torch.softmax(output.logits[0].float(), dim=-1)  # [T, V]
            top_probs, top_ids = probs.topk(settings.top_k_labels, dim=-1)  # [T, K]
            labelled.append(
                {
                    "ids": ids[0].to(torch.int32),
                    "features": features.to(torch.bfloat16),
                    "top_ids": top_ids.to(torch.int32),
                    "top_probs": top_probs.to(torch.float16),
                }
            )
    return labelled


# --- phase 3: training ---------------------------------------------------------------------


def _pad_batch(items: list[dict]):
    """Right-padded tensors of a batch of labelled sequences."""
    import torch

    length = max(len(item["ids"]) for item in items)
    batch = len(items)
    hidden = items[0]["features"].shape[1]
    top = items[0]["top_ids"].shape[1]
    ids = torch.zeros(batch, length, dtype=torch.int64)  # [B, T]
    features = torch.zeros(batch, length, hidden)  # [B, T, H]
    top_ids = torch.zeros(batch, length, top, dtype=torch.int64)  # [B, T, K]
    top_probs = torch.zeros(batch, length, top)  # [B, T, K]
    mask = torch.zeros(batch, length, dtype=torch.int64)  # [B, T]
    for row, item in enumerate(items):
        n = len(item["ids"])
        ids[row, :n] = item["ids"].long()
        features[row, :n] = item["features"].float()
        top_ids[row, :n] = item["top_ids"].long()
        top_probs[row, :n] = item["top_probs"].float()
        mask[row, :n] = 1
    return ids, features, top_ids, top_probs, mask


def draft_loss(draft, batch, settings, generator=None, feature_std: float = 1.0):
    """(total, soft cross-entropy, feature loss) of one batch (module docstring), averaged
    over ``settings.unroll`` passes: pass j > 1 reads, as each position's previous feature,
    the prediction f̂ of pass j − 1 (detached), as the draft does past its first token."""
    import torch
    import torch.nn.functional as functional

    ids, features, top_ids, top_probs, mask = batch
    valid = mask.bool()  # [B, T]
    positions = torch.arange(ids.shape[1])[None, :].expand_as(ids)  # [B, T]
    previous = features  # [B, T, H] the features fed one position later
    totals = []
    for _ in range(settings.unroll):
        before = torch.cat([torch.zeros_like(previous[:, :1]), previous[:, :-1]], dim=1)
        if generator is not None and settings.input_noise:
            noise = torch.rand(before.shape, generator=generator) * 2 - 1  # [B, T, H] U(-1, 1)
            before = before + settings.input_noise * feature_std * noise
        logits, predicted = draft(ids, before, attention_mask=mask, position_ids=positions)
        log_probs = torch.log_softmax(logits.float(), dim=-1)  # [B, T, V]
        soft_ce = -(top_probs * log_probs.gather(-1, top_ids)).sum(-1)[valid].mean()
        feature = functional.smooth_l1_loss(predicted[valid], features[valid])
        totals.append((soft_ce + settings.feature_weight * feature, soft_ce, feature))
        previous = predicted.detach()  # [B, T, H]
    total, soft_ce, feature = (sum(parts) / len(totals) for parts in zip(*totals, strict=True))
    return total, soft_ce, feature


def principal_directions(items: list[dict], rank: int):
    """P [H, r]: the top-r eigenvectors of the features' second moment."""
    import torch

    features = torch.cat([item["features"].float() for item in items])  # [N, H]
    moment = features.T @ features / len(features)  # [H, H]
    _, vectors = torch.linalg.eigh(moment)  # ascending
    return vectors[:, -rank:].flip(-1).contiguous()  # [H, r]


def train_draft(verifier, items: list[dict], heldout: list[dict], settings, folder: Path, say):
    """Train (resuming from ``folder/train.pt``); returns the draft and its held-out losses."""
    import numpy as np
    import torch

    from cactus_theory.decode.feature_draft import FeatureDraft, FeatureDraftConfig

    verifier = verifier.float()
    config = FeatureDraftConfig(
        hidden_size=verifier.config.hidden_size,
        num_layers=settings.num_layers,
        num_heads=verifier.config.num_attention_heads,
        num_kv_heads=verifier.config.num_key_value_heads,
        intermediate_size=settings.intermediate_size,
        rank=settings.rank,
        rms_norm_eps=verifier.config.rms_norm_eps,
        rope_theta=getattr(verifier.config, "rope_theta", None)
        or verifier.config.rope_parameters["rope_theta"],
        max_position_embeddings=verifier.config.max_position_embeddings,
    )
    draft = FeatureDraft.build(verifier, config, seed=settings.seed)
    if draft.projection is not None:
        draft.projection.data.copy_(principal_directions(items, settings.rank))
    optimiser = torch.optim.AdamW(
        [p for p in draft.parameters() if p.requires_grad], lr=settings.learning_rate
    )
    checkpoint = folder / f"train-{train_key(settings)}.pt"
    step = 0
    if checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=True)
        draft.load_state_dict(state["draft"], strict=False)
        optimiser.load_state_dict(state["optimiser"])
        step = state["step"]
        say(f"  resuming training at step {step}/{settings.steps}")
    feature_std = float(torch.cat([item["features"].float() for item in items[:64]]).std())
    draft.train()
    started = time.perf_counter()
    while step < settings.steps:
        rng = np.random.default_rng([settings.seed, step])
        chosen = rng.choice(len(items), size=settings.batch_sequences, replace=False)
        generator = torch.Generator().manual_seed(settings.seed * 7919 + step)
        rate = settings.learning_rate * (
            min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / settings.steps))
        )
        for group in optimiser.param_groups:
            group["lr"] = rate
        loss, soft_ce, feature = draft_loss(
            draft, _pad_batch([items[i] for i in chosen]), settings, generator, feature_std
        )
        optimiser.zero_grad()
        loss.backward()
        soft_ce = soft_ce.detach()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimiser.step()
        step += 1
        if step % 20 == 0 or step == settings.steps:
            spent = time.perf_counter() - started
            say(f"  step {step}/{settings.steps}: soft CE {soft_ce.item():.3f} ({spent:.0f} s)")
        if step % settings.checkpoint_every == 0 or step == settings.steps:
            state = {"draft": draft.state_dict(), "optimiser": optimiser.state_dict(), "step": step}
            atomic_write(checkpoint, lambda path, state=state: torch.save(state, path))
    draft.eval()
    with torch.no_grad():
        losses = [draft_loss(draft, _pad_batch([item]), settings)[1].item() for item in heldout]
    return draft, {"heldout_soft_ce": sum(losses) / max(len(losses), 1)}


# --- the command ---------------------------------------------------------------------------


#: The settings each phase depends on (its cache key); training restarts only when its own
#: settings change, answers only when theirs do.
ANSWER_FIELDS = ("seed", "max_new_tokens", "chunk")
TRAIN_FIELDS = tuple(f.name for f in dataclasses.fields(DistillSettings) if f.name != "threads")


def work_folder(settings: DistillSettings, verifier_path: Path) -> Path:
    """The answers' folder, keyed by their settings, the prompts and the verifier."""
    from sims import smollm
    from sims.train_prompts import training_prompts

    answer_settings = {name: getattr(settings, name) for name in ANSWER_FIELDS}
    verifier_config = json.loads((verifier_path / "config.json").read_text())
    key = fingerprint(answer_settings, training_prompts(), verifier_config)
    return smollm.folder() / f"distill-{key}"


def train_key(settings: DistillSettings) -> str:
    return fingerprint({name: getattr(settings, name) for name in TRAIN_FIELDS})


def distill(settings: DistillSettings, out: Path, say=print) -> dict:
    """Run (or resume) the three phases and write the draft to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sims import smollm
    from sims.train_prompts import training_prompts

    torch.set_num_threads(settings.threads)
    verifier_path = smollm.verifier_folder(say)
    folder = work_folder(settings, verifier_path)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(verifier_path)
    tokenizer.padding_side = "left"
    verifier = AutoModelForCausalLM.from_pretrained(verifier_path, dtype=torch.bfloat16).eval()
    prompts = training_prompts()
    chunks = [prompts[i : i + settings.chunk] for i in range(0, len(prompts), settings.chunk)]
    timings = {}
    started = time.perf_counter()
    sequences = []
    for index, chunk in enumerate(chunks):
        path = folder / f"answers-{index:03d}.json"
        if not path.is_file():
            say(f"  answers: chunk {index + 1}/{len(chunks)} ({len(chunk)} prompts)")
            answers = generate_answers(verifier, tokenizer, chunk, settings, index)
            atomic_write(path, lambda p, answers=answers: p.write_text(json.dumps(answers)))
        sequences.extend(json.loads(path.read_text()))
    timings["answers_s"] = time.perf_counter() - started

    started = time.perf_counter()
    labels_path = folder / f"labels-top{settings.top_k_labels}.pt"
    if not labels_path.is_file():
        say(f"  labels: one verifier forward over each of {len(sequences)} sequences")
        labelled = label_sequences(verifier, sequences, settings)
        atomic_write(labels_path, lambda p: torch.save(labelled, p))
    labelled = torch.load(labels_path, weights_only=True)
    timings["labels_s"] = time.perf_counter() - started

    heldout = labelled[: settings.heldout_sequences]
    items = labelled[settings.heldout_sequences :]
    started = time.perf_counter()
    draft, losses = train_draft(verifier, items, heldout, settings, folder, say)
    timings["training_s"] = time.perf_counter() - started
    draft.save(out)
    summary = {
        "settings": dataclasses.asdict(settings),
        "num_prompts": len(prompts),
        "train_tokens": sum(len(item["ids"]) for item in items),
        **losses,
        **{key: round(value, 1) for key, value in timings.items()},
    }
    atomic_write_json(Path(out) / "distill.json", summary, indent=2)
    return summary


def configure(parser: argparse.ArgumentParser) -> None:
    defaults = DistillSettings()
    parser.description = (
        "Distil the feature draft of the default real pair from SmolLM2-135M-Instruct "
        "(answers, labels, training; cached and resumable). About an hour on 2 cores."
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="draft folder to write (default: the shipped one)",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of every phase")
    parser.add_argument("--steps", type=int, default=defaults.steps, help="training steps")
    parser.add_argument("--rank", type=int, default=defaults.rank, help="head rank (0: full)")
    parser.add_argument(
        "--layers", type=int, default=defaults.num_layers, help="Llama layers of the draft"
    )
    parser.add_argument("--threads", type=int, default=defaults.threads, help="CPU threads")


def run(args: argparse.Namespace) -> int:
    for name in ("steps", "layers", "threads"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be at least 1")
    if args.rank < 0:
        raise ValueError("--rank must be 0 (full head) or positive")
    settings = dataclasses.replace(
        DistillSettings(),
        seed=args.seed,
        steps=args.steps,
        rank=args.rank or None,
        num_layers=args.layers,
        threads=args.threads,
    )
    print("training the feature draft (cached and resumable; about an hour on 2 cores)")
    summary = distill(settings, args.out)
    print(json.dumps(summary, indent=1))
    return 0


def interrupted_message(args: argparse.Namespace) -> str:
    return "interrupted: finished chunks and the last checkpoint are kept; rerun to resume"
