"""``cactus train-pair``: a small verifier and a smaller draft trained on standard-library text.

No pretrained weights can be downloaded, so the decoder's default pair is trained here, on
the train split of ``cactus_theory.real.corpus`` (the running Python's standard library), with the
corpus's byte-level BPE tokenizer (vocabulary 4096, ``<|endoftext|>`` = id 0). Both models
are standard ``transformers`` Llama configurations saved with ``save_pretrained`` next to
the tokenizer (wrapped as a ``PreTrainedTokenizerFast``), so ``AutoModelForCausalLM`` and
``AutoTokenizer`` load either folder like any checkpoint.

Determinism: the weights are initialised from ``seed`` (verifier: ``seed``, draft:
``seed + 1``), and the batch of step s is drawn from ``numpy.random.default_rng([seed, role,
s])``, so a run, and a run resumed from a checkpoint, gives the same weights for the same
settings, thread count and torch build.

Caching: everything lives in ``cache_dir()/pair-<key>/``, keyed by every setting, the
tokenizer and the corpus file list. Training saves a checkpoint (model, optimiser, step)
atomically every ``checkpoint_every`` steps, so an interrupted run resumes; finished models
are written to a temporary folder and renamed into place. The folder also holds
``pair.json`` (settings, held-out perplexities, training time) and
``heldout_prompts.jsonl`` (prompts cut from held-out files, used by ``cactus decode`` and
``cactus bench decode`` when no prompt file is given).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import shutil
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from cactus_theory.real import corpus
from cactus_theory.util.files import atomic_folder, atomic_write, atomic_write_bytes
from cactus_theory.util.provenance import fingerprint

ROLES = ("verifier", "draft")
PAIR_MANIFEST = "pair.json"
PROMPTS_FILE = "heldout_prompts.jsonl"


@dataclass(frozen=True)
class ModelSpec:
    """A Llama-style decoder: width, depth, heads and MLP width."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int


@dataclass(frozen=True)
class PairSettings:
    """Everything that determines the trained pair (and so its cache key)."""

    seed: int = 0
    vocab_size: int = 4096
    context: int = 256
    batch_size: int = 16
    verifier: ModelSpec = field(default_factory=lambda: ModelSpec(192, 4, 4, 512))
    draft: ModelSpec = field(default_factory=lambda: ModelSpec(96, 1, 2, 256))
    verifier_steps: int = 500
    draft_steps: int = 500
    verifier_lr: float = 1e-3
    draft_lr: float = 2e-3
    eval_windows: int = 64
    num_prompts: int = 32
    prompt_chars: int = 240
    checkpoint_every: int = 100
    threads: int = 1
    device: str = "cpu"
    corpus_root: str | None = None

    def model_spec(self, role: str) -> ModelSpec:
        return self.verifier if role == "verifier" else self.draft

    def steps(self, role: str) -> int:
        return self.verifier_steps if role == "verifier" else self.draft_steps

    def learning_rate(self, role: str) -> float:
        return self.verifier_lr if role == "verifier" else self.draft_lr


def _corpus_root(settings: PairSettings) -> Path | None:
    return None if settings.corpus_root is None else Path(settings.corpus_root)


def pair_dir(settings: PairSettings) -> Path:
    """The cache folder of the pair trained with ``settings``."""
    root = _corpus_root(settings)
    tokenizer = corpus.train_tokenizer(settings.vocab_size, root=root)
    tokenizer_hash = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()
    files = corpus.corpus_fingerprint(corpus.load_corpus("train", root=root))
    key = fingerprint(dataclasses.asdict(settings), tokenizer_hash, files)
    return corpus.cache_dir() / f"pair-{key}"


def wrapped_tokenizer(settings: PairSettings):
    """The corpus tokenizer as a ``PreTrainedTokenizerFast`` (EOS = pad = ``<|endoftext|>``)."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = corpus.train_tokenizer(settings.vocab_size, root=_corpus_root(settings))
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=corpus.END_OF_TEXT,
        pad_token=corpus.END_OF_TEXT,
        bos_token=corpus.END_OF_TEXT,
        model_max_length=settings.context,
    )


def model_config(settings: PairSettings, role: str):
    """The ``LlamaConfig`` of ``role`` ("verifier" or "draft")."""
    from transformers import LlamaConfig

    spec = settings.model_spec(role)
    end = 0  # <|endoftext|> is the tokenizer's first special token
    return LlamaConfig(
        vocab_size=settings.vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=max(2048, settings.context),
        tie_word_embeddings=True,
        bos_token_id=end,
        eos_token_id=end,
        pad_token_id=end,
    )


def _learning_rate(step: int, total: int, peak: float) -> float:
    """Linear warm-up over 5% of the steps, then cosine decay to 10% of the peak."""
    warmup = max(1, total // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def _batch(stream: np.ndarray, settings: PairSettings, role: str, step: int):
    import torch

    rng = np.random.default_rng([settings.seed, ROLES.index(role), step])
    starts = rng.integers(0, len(stream) - settings.context, size=settings.batch_size)
    windows = np.stack([stream[s : s + settings.context] for s in starts]).astype(np.int64)
    return torch.from_numpy(windows).to(settings.device)


def train_model(settings: PairSettings, role: str, folder: Path, progress: bool = True):
    """Train ``role`` (resuming from ``folder/<role>.ckpt``), returning the model."""
    import torch
    from tqdm.auto import tqdm
    from transformers import LlamaForCausalLM

    stream = corpus.token_stream("train", settings.vocab_size, root=_corpus_root(settings))
    if len(stream) <= settings.context:
        raise ValueError(f"context: the train split has only {len(stream)} tokens")
    torch.manual_seed(settings.seed + ROLES.index(role))
    model = LlamaForCausalLM(model_config(settings, role)).to(settings.device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings.learning_rate(role), betas=(0.9, 0.95), weight_decay=0.1
    )
    checkpoint = folder / f"{role}.ckpt"
    start = 0
    if checkpoint.exists():
        state = torch.load(checkpoint, map_location=settings.device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
    total = settings.steps(role)
    model.train()
    bar = tqdm(
        range(start, total),
        initial=start,
        total=total,
        desc=f"train {role}",
        disable=not progress,
        leave=False,
    )
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(step, total, settings.learning_rate(role))
        windows = _batch(stream, settings, role, step)
        loss = model(input_ids=windows, labels=windows).loss  # the model shifts the labels
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        done = step + 1
        if done % settings.checkpoint_every == 0 and done < total:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            atomic_write(checkpoint, partial(torch.save, {**state, "step": done}))
    model.eval()
    return model


def heldout_perplexity(model, settings: PairSettings) -> float:
    """exp(mean next-token NLL) over ``eval_windows`` evenly spaced held-out windows."""
    import torch

    stream = corpus.token_stream("heldout", settings.vocab_size, root=_corpus_root(settings))
    length = min(settings.context, len(stream) - 1)
    count = max(1, settings.eval_windows)
    starts = np.linspace(0, len(stream) - length - 1, count).astype(np.int64)
    windows = np.stack([stream[s : s + length + 1] for s in starts]).astype(np.int64)
    total, tokens = 0.0, 0
    with torch.no_grad():
        for chunk in np.array_split(windows, max(1, count // 16)):
            batch = torch.from_numpy(chunk).to(settings.device)
            logits = model(input_ids=batch[:, :-1]).logits.float()
            nll = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum"
            )
            total += float(nll)
            tokens += batch[:, 1:].numel()
    return math.exp(total / tokens)


def heldout_prompts(settings: PairSettings) -> list[str]:
    """Prompts cut from held-out files: each file's opening, up to a line boundary."""
    documents = corpus.load_corpus("heldout", root=_corpus_root(settings))
    prompts = []
    for text in documents.texts:
        head = text[: settings.prompt_chars]
        cut = head.rfind("\n")
        if cut > settings.prompt_chars // 3:
            head = head[: cut + 1]
        if head.strip():
            prompts.append(head)
        if len(prompts) == settings.num_prompts:
            break
    return prompts


def _save_model(model, tokenizer, destination: Path) -> None:
    """save_pretrained into a temporary folder, then rename it into place."""
    with atomic_folder(destination) as temporary:
        model.save_pretrained(temporary)
        tokenizer.save_pretrained(temporary)


def train(settings: PairSettings, progress: bool = True) -> dict:
    """Train (or finish training) the pair; returns the manifest (also written to pair.json)."""
    import torch

    folder = pair_dir(settings)
    if (folder / PAIR_MANIFEST).exists():
        return json.loads((folder / PAIR_MANIFEST).read_text())
    folder.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    if settings.device == "cpu":
        torch.set_num_threads(settings.threads)
    try:
        return _train_pair(settings, folder, progress)
    finally:
        torch.set_num_threads(threads)


def _train_pair(settings: PairSettings, folder: Path, progress: bool) -> dict:
    tokenizer = wrapped_tokenizer(settings)
    perplexity, seconds, parameters = {}, {}, {}
    for role in ROLES:
        destination = folder / role
        started = time.perf_counter()
        if not (destination / "config.json").exists():
            model = train_model(settings, role, folder, progress)
            model.generation_config.eos_token_id = 0
            model.generation_config.pad_token_id = 0
            _save_model(model, tokenizer, destination)
            (folder / f"{role}.ckpt").unlink(missing_ok=True)
        seconds[role] = time.perf_counter() - started
        from transformers import AutoModelForCausalLM

        loaded = AutoModelForCausalLM.from_pretrained(destination).to(settings.device)
        perplexity[role] = heldout_perplexity(loaded.eval(), settings)
        parameters[role] = sum(p.numel() for p in loaded.parameters())
    prompts = heldout_prompts(settings)
    atomic_write_bytes(
        folder / PROMPTS_FILE, "".join(json.dumps(p) + "\n" for p in prompts).encode()
    )
    manifest = {
        "settings": dataclasses.asdict(settings),
        "verifier": str(folder / "verifier"),
        "draft": str(folder / "draft"),
        "heldout_perplexity": perplexity,
        "train_seconds": seconds,
        "parameters": parameters,
        "prompts": str(folder / PROMPTS_FILE),
    }
    atomic_write_bytes(folder / PAIR_MANIFEST, json.dumps(manifest, indent=2).encode())
    return manifest


def ensure_pair(settings: PairSettings | None = None, progress: bool = True) -> tuple[str, str]:
    """(verifier_path, draft_path) of the trained pair, training it on first use (cached)."""
    manifest = train(settings or PairSettings(), progress=progress)
    return manifest["verifier"], manifest["draft"]


def configure(parser: argparse.ArgumentParser) -> None:
    defaults = PairSettings()
    parser.add_argument("--seed", type=int, default=defaults.seed, help="initialisation seed")
    parser.add_argument(
        "--verifier-steps", type=int, default=defaults.verifier_steps, help="verifier steps"
    )
    parser.add_argument("--draft-steps", type=int, default=defaults.draft_steps, help="draft steps")
    parser.add_argument(
        "--batch-size", type=int, default=defaults.batch_size, help="windows per training step"
    )
    parser.add_argument(
        "--context", type=int, default=defaults.context, help="training window length (tokens)"
    )
    parser.add_argument(
        "--threads", type=int, default=defaults.threads, help="CPU threads (part of the key)"
    )
    parser.add_argument(
        "--device", default=defaults.device, help="cpu or cuda (a different cached pair)"
    )
    parser.add_argument(
        "--force", action="store_true", help="delete the cached pair with these settings first"
    )


def settings_from_args(args: argparse.Namespace) -> PairSettings:
    for name in ("verifier_steps", "draft_steps", "batch_size", "context", "threads"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name}: must be >= 1, got {getattr(args, name)}")
    if args.device not in ("cpu", "cuda"):
        raise ValueError(f"device: must be 'cpu' or 'cuda', got {args.device!r}")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("device: CUDA was requested but torch.cuda.is_available() is False")
    return dataclasses.replace(
        PairSettings(),
        seed=args.seed,
        verifier_steps=args.verifier_steps,
        draft_steps=args.draft_steps,
        batch_size=args.batch_size,
        context=args.context,
        threads=args.threads,
        device=args.device,
    )


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    folder = pair_dir(settings)
    if args.force and folder.exists():
        shutil.rmtree(folder)
    manifest = train(settings)
    perplexity = manifest["heldout_perplexity"]
    parameters = manifest["parameters"]
    print(f"pair: {folder}")
    for role in ROLES:
        print(
            f"  {role:<8} {manifest[role]}\n"
            f"           {parameters[role] / 1e6:.2f}M parameters, held-out perplexity "
            f"{perplexity[role]:.2f}, trained in {manifest['train_seconds'][role]:.0f} s"
        )
    ratio = perplexity["draft"] / perplexity["verifier"]
    print(f"  draft/verifier perplexity ratio: {ratio:.2f}")
    return 0


def interrupted_message(args: argparse.Namespace) -> str:
    return (
        f"interrupted; training is checkpointed every {PairSettings().checkpoint_every} steps "
        "and a rerun resumes from the last checkpoint"
    )
