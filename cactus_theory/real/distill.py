"""``cactus train-draft``: train the default pair's feature draft on SmolLM2-135M-Instruct's
teacher-forced labels over ShareGPT.

The draft (``cactus_theory.decode.feature_draft``) reads the verifier's last hidden state
f_{t−1} and the token x_t and predicts f̂_t, which the verifier's head rows of a token
subset S (``draft_vocab`` tokens, FR-Spec) turn into the draft law p. Three cached phases:

1. **labels** (``cactus_theory.real.distill_labels``): batched teacher-forced verifier
   forwards over ShareGPT conversations give f_t and the top-K of q_{t+1} at every
   position, about 1.2M labelled (assistant) positions; held-out conversations are labelled
   the same way.
2. **answers** (``cactus_theory.real.distill_answers``, ``--answer-tokens``, 0 = none): the
   verifier's own replies to ShareGPT first turns, generated in batches with the paper's
   processors and labelled by the generation's own forwards (about 0.8M labelled positions
   by default), with answers to the held-out first turns as a second held-out set.
3. **training**, ``epochs`` passes over both in a seeded order, teacher forcing on the true
   features (uniform noise on the inputs):

       loss_t = − Σ_{i ∈ topK(q_t) ∩ S} q_t(i) log p̂_t(i)  +  w · smoothL1(f̂_t, f_t)

   with the cross-entropy over labelled positions and the feature term over all of them;
   AdamW, linear warm-up and cosine decay, gradient clipping at 1. S is the ``draft_vocab``
   tokens with the most verifier mass Σ_t q_t(i) over the training labels. Every
   ``eval_every`` steps the soft cross-entropy and the acceptance on each held-out set
   α = Σ_x min(p̃_x, q̃_x) (p̃, q̃ after the paper's processors, T = 0.6, top-k 20,
   top-p 0.95, computed exactly from the top-32 labels since top-k 20 lies inside them)
   are recorded against the training tokens seen: the learning curve in ``distill.json``.

Everything lives under ``cache_root()/smollm2/`` (labels keyed by their settings, the
training checkpoint by its own), written atomically: finished label shards are kept and
the training checkpoint every ``checkpoint_every`` steps, so an interrupted run resumes.
The result is written to ``--out`` (by default the shipped ``cactus_theory/real/drafts/smollm2/``)
with a ``distill.json`` of the settings, counts, timings and the curve.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from cactus_theory.real.distill_answers import AnswerSettings
from cactus_theory.real.distill_labels import LabelSettings
from cactus_theory.util.files import atomic_write, atomic_write_json
from cactus_theory.util.provenance import fingerprint

DEFAULT_OUT = Path(__file__).resolve().parent / "drafts" / "smollm2"


@dataclass(frozen=True)
class DistillSettings:
    """Everything that determines the trained draft (and so its cache keys)."""

    labels: LabelSettings = field(default_factory=LabelSettings)
    answers: AnswerSettings | None = field(default_factory=AnswerSettings)  # None: none
    seed: int = 0
    num_layers: int = 1
    intermediate_size: int = 1536
    draft_vocab: int | None = 8192  # |S| of the reduced head; None: the full vocabulary
    epochs: int = 2
    batch_sequences: int = 2
    learning_rate: float = 2e-3
    warmup_steps: int = 20
    feature_weight: float = 0.1
    input_noise: float = 0.2  # uniform noise on input features, in units of their std
    eval_every: int = 200
    eval_conversations: int = 32
    checkpoint_every: int = 100
    threads: int = 2


# --- batches and loss ----------------------------------------------------------------------


def pad_batch(items: list[dict]):
    """Right-padded tensors of a batch of labelled sequences: ids [B, T], features
    [B, T, H], top_ids [B, T, K], top_probs [B, T, K], valid [B, T], labelled [B, T]."""
    import torch

    length = max(len(item["ids"]) for item in items)
    batch = len(items)
    hidden = items[0]["features"].shape[1]
    top = items[0]["top_ids"].shape[1]
    ids = torch.zeros(batch, length, dtype=torch.int64)  # [B, T]
    features = torch.zeros(batch, length, hidden)  # [B, T, H]
    top_ids = torch.zeros(batch, length, top, dtype=torch.int64)  # [B, T, K]
    top_probs = torch.zeros(batch, length, top)  # [B, T, K]
    valid = torch.zeros(batch, length, dtype=torch.bool)  # [B, T] real positions
    labelled = torch.zeros(batch, length, dtype=torch.bool)  # [B, T] positions with a CE term
    for row, item in enumerate(items):
        n = len(item["ids"])
        ids[row, :n] = item["ids"].long()
        features[row, :n] = item["features"].float()
        top_ids[row, :n] = item["top_ids"].long()
        top_probs[row, :n] = item["top_probs"].float()
        valid[row, :n] = True
        labelled[row, :n] = item["label_mask"]
    return ids, features, top_ids, top_probs, valid, labelled


def shifted_inputs(features, noise=None):
    """f_{t−1} per position [B, T, H] (0 at t = 0), optionally plus ``noise``."""
    import torch

    before = torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], dim=1)
    return before if noise is None else before + noise


def subset_index(draft):
    """[V] int64: the position of each token in the draft's subset S, −1 outside it."""
    import torch

    index = torch.full((draft.vocab_size,), -1, dtype=torch.int64)
    index[draft.subset_ids] = torch.arange(len(draft.subset_ids))
    return index


def draft_log_probs(draft, hidden):
    """log p̂ over the draft's support: [B, T, |S|] with a subset, else [B, T, V]."""
    import torch

    if draft.config.vocab_subset is not None:
        return torch.log_softmax(draft.subset_logits(hidden).float(), dim=-1)
    return torch.log_softmax(draft.logits(hidden).float(), dim=-1)


def gather_labels(values, top_ids, index):
    """``values`` [..., |S| or V] over the draft's support, read at the label ids
    [..., K] (0 where a label lies outside S), and whether each lies inside [..., K]."""
    if index is None:
        return values.gather(-1, top_ids), top_ids >= 0
    position = index[top_ids]  # [..., K], −1 outside S
    inside = position >= 0
    return values.gather(-1, position.clamp(min=0)) * inside, inside


def draft_loss(draft, batch, settings, generator=None, feature_std: float = 1.0, index=None):
    """(total, soft cross-entropy, feature loss) of one batch (module docstring)."""
    import torch
    import torch.nn.functional as functional

    ids, features, top_ids, top_probs, valid, labelled = batch
    positions = torch.arange(ids.shape[1])[None, :].expand_as(ids)  # [B, T]
    noise = None
    if generator is not None and settings.input_noise:
        uniform = torch.rand(features.shape, generator=generator) * 2 - 1  # [B, T, H] U(−1, 1)
        noise = settings.input_noise * feature_std * uniform
    inputs = shifted_inputs(features, noise)
    predicted = draft.predict_features(
        ids, inputs, attention_mask=valid.long(), position_ids=positions
    )  # [B, T, H]
    log_probs = draft_log_probs(draft, predicted)  # [B, T, |S| or V]
    at_labels, _ = gather_labels(log_probs, top_ids, index)  # [B, T, K]
    soft_ce = -(top_probs * at_labels).sum(-1)[labelled].mean()
    feature = functional.smooth_l1_loss(predicted[valid], features[valid])
    return soft_ce + settings.feature_weight * feature, soft_ce, feature


def heldout_metrics(draft, heldout: list[dict], settings, index=None) -> dict:
    """Soft cross-entropy and acceptance α under the paper's processors (module docstring)
    over the labelled positions of ``heldout``: {"soft_ce": ..., "alpha": ...}."""
    import torch

    from cactus_theory.core.processors import PAPER_SETTING
    from cactus_theory.sampler.processors import process_logits

    ce_sum, alpha_sum, count = 0.0, 0.0, 0
    with torch.no_grad():
        for start in range(0, len(heldout), 4):
            batch = pad_batch(heldout[start : start + 4])
            ids, features, top_ids, top_probs, valid, labelled = batch
            positions = torch.arange(ids.shape[1])[None, :].expand_as(ids)
            inputs = shifted_inputs(features)
            predicted = draft.predict_features(
                ids, inputs, attention_mask=valid.long(), position_ids=positions
            )  # [B, T, H]
            log_probs = draft_log_probs(draft, predicted)  # [B, T, |S| or V]
            at_labels, _ = gather_labels(log_probs, top_ids, index)  # [B, T, K]
            ce_sum += float(-(top_probs * at_labels).sum(-1)[labelled].sum())
            # p̃ over the draft's support (−inf outside S changes no processor's result)
            draft_probs = process_logits(log_probs[labelled], PAPER_SETTING)  # [N, |S| or V]
            target_probs = process_logits(top_probs[labelled].log(), PAPER_SETTING)  # [N, K]
            at_ids, _ = gather_labels(draft_probs, top_ids[labelled], index)
            overlap = torch.minimum(at_ids, target_probs)
            alpha_sum += float(overlap.sum())
            count += int(labelled.sum())
    return {"soft_ce": ce_sum / max(count, 1), "alpha": alpha_sum / max(count, 1)}


def evaluate(draft, heldout: dict[str, list[dict]], settings, index=None, limit=None) -> dict:
    """``heldout_metrics`` of each held-out set (its first ``limit`` items), flat:
    {"<set>_soft_ce": ..., "<set>_alpha": ...}."""
    metrics = {}
    for name, items in heldout.items():
        for key, value in heldout_metrics(draft, items[:limit], settings, index).items():
            metrics[f"{name}_{key}"] = value
    return metrics


def choose_subset(items: list[dict], vocab_size: int, size: int):
    """S [size]: the tokens with the most label mass Σ_t q_t(i) over labelled positions."""
    import torch

    mass = torch.zeros(vocab_size, dtype=torch.float64)
    for item in items:
        mask = item["label_mask"]
        mass.index_add_(0, item["top_ids"][mask].flatten().long(),
                        item["top_probs"][mask].flatten().double())  # fmt: skip
    return mass.topk(size).indices.sort().values


def subset_coverage(items: list[dict], subset) -> float:
    """The share of the top-K label mass that falls inside ``subset``."""
    import torch

    total, covered = 0.0, 0.0
    for item in items:
        mask = item["label_mask"]
        ids, probs = item["top_ids"][mask].long(), item["top_probs"][mask].double()
        hit = torch.isin(ids, subset)  # [N, K]
        total += float(probs.sum())
        covered += float((probs * hit).sum())
    return covered / max(total, 1e-12)


# --- training ------------------------------------------------------------------------------


def draft_config(verifier, settings: DistillSettings):
    from cactus_theory.decode.feature_draft import FeatureDraftConfig

    config = verifier.config
    return FeatureDraftConfig(
        hidden_size=config.hidden_size,
        num_layers=settings.num_layers,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        intermediate_size=settings.intermediate_size,
        vocab_subset=settings.draft_vocab,
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"],
        max_position_embeddings=config.max_position_embeddings,
    )


def learning_rate(settings: DistillSettings, step: int, steps: int) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine decay to 0 at ``steps``."""
    warm = min(1.0, (step + 1) / settings.warmup_steps)
    return settings.learning_rate * warm * 0.5 * (1 + math.cos(math.pi * step / steps))


def train_draft(verifier, items: list[dict], heldout: dict[str, list[dict]], settings,
                folder: Path, say):  # fmt: skip
    """Train (resuming from the checkpoint in ``folder``); returns (draft, summary) with
    the metrics on each held-out set (``evaluate``; the first set's name leads the
    progress lines) and the learning curve."""
    import numpy as np
    import torch

    from cactus_theory.decode.feature_draft import FeatureDraft

    verifier = verifier.float()
    draft = FeatureDraft.build(verifier, draft_config(verifier, settings), seed=settings.seed)
    index = None
    if settings.draft_vocab is not None:
        draft.set_subset(choose_subset(items, draft.vocab_size, settings.draft_vocab))
        index = subset_index(draft)
    optimiser = torch.optim.AdamW(
        [p for p in draft.parameters() if p.requires_grad], lr=settings.learning_rate
    )
    per_epoch = math.ceil(len(items) / settings.batch_sequences)
    steps = settings.epochs * per_epoch
    checkpoint = folder / f"train-{train_key(settings)}.pt"
    step, curve, seen = 0, [], 0
    if checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=True)
        draft.load_state_dict(state["draft"], strict=False)
        optimiser.load_state_dict(state["optimiser"])
        step, curve = state["step"], state["curve"]
        seen = state.get("seen", curve[-1]["train_tokens"] if curve else 0)
        say(f"  resuming training at step {step}/{steps}")
    feature_std = float(torch.cat([item["features"].float() for item in items[:64]]).std())
    lead = next(iter(heldout))
    started = time.perf_counter()
    while step < steps:
        epoch, offset = divmod(step, per_epoch)
        order = np.random.default_rng([settings.seed, epoch]).permutation(len(items))
        chosen = order[offset * settings.batch_sequences : (offset + 1) * settings.batch_sequences]
        generator = torch.Generator().manual_seed(settings.seed * 7919 + step)
        for group in optimiser.param_groups:
            group["lr"] = learning_rate(settings, step, steps)
        draft.train()
        batch = pad_batch([items[i] for i in chosen])
        loss, soft_ce, _ = draft_loss(draft, batch, settings, generator, feature_std, index)
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimiser.step()
        step += 1
        seen += int(batch[5].sum())
        if step % settings.eval_every == 0 or step == steps:
            draft.eval()
            metrics = evaluate(draft, heldout, settings, index, settings.eval_conversations)
            curve.append({"step": step, "train_tokens": seen, **metrics})
            spent = time.perf_counter() - started
            ce, alpha = metrics[f"{lead}_soft_ce"], metrics[f"{lead}_alpha"]
            say(
                f"  step {step}/{steps}: {seen} labelled tokens, {lead} soft CE {ce:.3f}, "
                f"α {alpha:.3f} ({spent:.0f} s)"
            )
        if step % settings.checkpoint_every == 0 or step == steps:
            state = {
                "draft": draft.state_dict(),
                "optimiser": optimiser.state_dict(),
                "step": step,
                "curve": curve,
                "seen": seen,
            }
            atomic_write(checkpoint, lambda path, state=state: torch.save(state, path))
    draft.eval()
    summary = evaluate(draft, heldout, settings, index)
    summary["curve"] = curve
    if settings.draft_vocab is not None:
        for name, held in heldout.items():
            summary[f"subset_coverage_{name}"] = subset_coverage(held, draft.subset_ids)
    return draft, summary


def train_key(settings: DistillSettings) -> str:
    training = {k: v for k, v in dataclasses.asdict(settings).items() if k != "threads"}
    return fingerprint(training)


# --- the command ---------------------------------------------------------------------------


def training_data(settings: DistillSettings, verifier_path: Path, say=print):
    """(training items, {held-out set: items}, summary): the ShareGPT labels and, with
    ``settings.answers``, the self-distilled answers (each built or resumed in the cache)."""
    from cactus_theory.real import distill_answers, distill_labels

    started = time.perf_counter()
    labels = distill_labels.prepare(settings.labels, verifier_path, settings.threads, say)
    summary = {"labels": labels, "labels_s_this_run": round(time.perf_counter() - started, 1)}
    folder = distill_labels.labels_folder(settings.labels, verifier_path)
    items = distill_labels.load_shards(folder / "train")
    heldout = {"heldout": distill_labels.load_shards(folder / "heldout")}
    if settings.answers is not None:
        started = time.perf_counter()
        answers = distill_answers.prepare(
            settings.answers, verifier_path, settings.labels.heldout_conversations,
            settings.threads, say,
        )  # fmt: skip
        summary["answers"] = answers
        summary["answers_s_this_run"] = round(time.perf_counter() - started, 1)
        answer_folder = distill_answers.answers_folder(settings.answers, verifier_path)
        items += distill_labels.load_shards(answer_folder / "train", answers["train_shards"])
        heldout["answers"] = distill_labels.load_shards(answer_folder / "heldout")
    return items, heldout, summary


def distill(settings: DistillSettings, out: Path, say=print) -> dict:
    """Build (or resume) the labels, train (or resume) the draft and write it to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM

    from cactus_theory.real import distill_labels, smollm

    torch.set_num_threads(settings.threads)
    verifier_path = smollm.verifier_folder(say)
    items, heldout, data = training_data(settings, verifier_path, say)
    verifier = AutoModelForCausalLM.from_pretrained(verifier_path, dtype=torch.float32).eval()
    started = time.perf_counter()
    folder = distill_labels.labels_folder(settings.labels, verifier_path)
    draft, metrics = train_draft(verifier, items, heldout, settings, folder, say)
    training_s = time.perf_counter() - started
    out = Path(out)
    draft.save(out)
    summary = {
        "settings": dataclasses.asdict(settings),
        **data,
        **metrics,
        "training_s_this_run": round(training_s, 1),
    }
    atomic_write_json(out / "distill.json", summary, indent=2)
    return summary


def configure(parser: argparse.ArgumentParser) -> None:
    defaults = DistillSettings()
    parser.description = (
        "Train the feature draft of the default real pair on SmolLM2-135M-Instruct's "
        "teacher-forced labels over ShareGPT (labels, then training; cached and resumable)."
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="draft folder to write (default: the shipped one)",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of training")
    parser.add_argument(
        "--train-tokens",
        type=int,
        default=defaults.labels.train_tokens,
        help="labelled ShareGPT positions to train on (default %(default)s)",
    )
    parser.add_argument(
        "--answer-tokens",
        type=int,
        default=defaults.answers.answer_tokens,
        help="labelled positions of the verifier's own answers to ShareGPT prompts, generated "
        "in batches (0: none; default %(default)s)",
    )
    parser.add_argument(
        "--draft-vocab",
        type=int,
        default=defaults.draft_vocab,
        help="tokens of the reduced-vocabulary head (0: the full vocabulary; default %(default)s)",
    )
    parser.add_argument("--epochs", type=int, default=defaults.epochs, help="passes over the data")
    parser.add_argument(
        "--layers", type=int, default=defaults.num_layers, help="Llama layers of the draft"
    )
    parser.add_argument("--threads", type=int, default=defaults.threads, help="CPU threads")


def settings_from(args: argparse.Namespace) -> DistillSettings:
    for name in ("epochs", "layers", "threads", "train_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.draft_vocab < 0:
        raise ValueError("--draft-vocab must be 0 (the full vocabulary) or positive")
    if args.answer_tokens < 0:
        raise ValueError("--answer-tokens must be 0 (no self-distilled answers) or positive")
    defaults = DistillSettings()
    answers = None
    if args.answer_tokens:
        answers = dataclasses.replace(defaults.answers, answer_tokens=args.answer_tokens)
    return dataclasses.replace(
        defaults,
        labels=dataclasses.replace(defaults.labels, train_tokens=args.train_tokens),
        answers=answers,
        seed=args.seed,
        draft_vocab=args.draft_vocab or None,
        epochs=args.epochs,
        num_layers=args.layers,
        threads=args.threads,
    )


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    print("training the feature draft (labels, answers, then training; cached and resumable)")
    summary = distill(settings, args.out)
    print(json.dumps({key: value for key, value in summary.items() if key != "curve"}, indent=1))
    return 0


def interrupted_message(args: argparse.Namespace) -> str:
    return (
        "interrupted: finished label and answer shards and the last checkpoint are kept; "
        "rerun to resume"
    )
