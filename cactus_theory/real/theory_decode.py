"""The decodes the theory is compared with (``cactus_theory.real.theory``): what one
comparison decodes (``TheorySettings``), and a speculative decode of its prompts with one
rule, batch by batch and cached, kept with its verify steps (``real.verify_steps``) and its
sequences teacher-forced (``Decoded``: the exact rows at every decoded position).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cactus_theory.core import validate
from cactus_theory.core.processors import PAPER_SETTING, SamplingSettings
from cactus_theory.core.rules import Rule, parse, spec_of
from cactus_theory.real import pools
from cactus_theory.real.pools import RealPool
from cactus_theory.real.verify_steps import VerifySteps, step_starts
from cactus_theory.util import provenance

Array = np.ndarray

#: Bumped when what a cached decode holds changes.
DECODE_FORMAT = 1
#: The code a cached decode depends on (beside ``DECODE_FORMAT``).
DECODE_CODE = provenance.source_fingerprint(
    "cactus_theory/decode",
    "cactus_theory/sampler",
    "cactus_theory/core/rules",
    "cactus_theory/real/pools.py",
)


@dataclass(frozen=True)
class TheorySettings:
    """What one comparison decodes: k drafts per step, ``num_prompts`` prompts of
    ``max_new_tokens`` tokens, in batches of ``batch_size`` (a row's law does not depend
    on the batch), from ``seed``."""

    k: int = 3
    num_prompts: int = 24
    max_new_tokens: int = 64
    sampling: SamplingSettings = PAPER_SETTING
    batch_size: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("k", "num_prompts", "max_new_tokens", "batch_size"):
            object.__setattr__(self, name, validate.positive_int(name, getattr(self, name)))
        if self.sampling.temperature == 0:
            raise ValueError("temperature: the comparison needs sampled decoding (temperature > 0)")

    def pool_settings(self) -> pools.PoolSettings:
        """The pool of the same prompts and settings (every prompt, every position)."""
        return pools.PoolSettings(
            positions=self.num_prompts * self.max_new_tokens,
            num_prompts=self.num_prompts,
            max_new_tokens=self.max_new_tokens,
            sampling=self.sampling,
            batch_size=self.batch_size,
            seed=self.seed,
        )


@dataclass
class Decoded:
    """A speculative decode of prompts with one rule: per decoded row its ``prompt``
    index and ``num_generated``; its verify steps (``steps``, rows indexing the decoded
    rows); and ``rows``, its sequences teacher-forced (a ``RealPool`` whose ``prompt`` is
    the decoded row and ``step`` the generated position)."""

    prompt: Array
    num_generated: Array
    steps: VerifySteps
    rows: RealPool
    info: dict = field(default_factory=dict)

    def position_index(self, row: Array, start: Array) -> Array:
        """Index into ``rows`` of generated position ``start`` of decoded row ``row``."""
        offsets = np.concatenate([[0], np.cumsum(self.num_generated)[:-1]])
        return offsets[row] + start


def decode_generator(seed: int, batch: int):
    """The torch generator of batch ``batch`` of a decode from ``seed``."""
    import torch

    stream = int(provenance.fingerprint("theory-decode", seed, batch), 16) % (2**62)
    return torch.Generator().manual_seed(stream)  # apart from the pools' streams


def decode_batch(setup, prompts: list[str], settings: TheorySettings, rule: Rule, batch: int):
    """One batch decoded speculatively, then its sequences teacher-forced (arrays)."""
    import time

    from cactus_theory.decode import speculative_generate
    from cactus_theory.decode.checks import vocab_size
    from cactus_theory.decode.runs import encode

    input_ids, mask = encode(setup, prompts)
    input_ids, mask = input_ids.to(setup.device), mask.to(setup.device)
    started = time.perf_counter()
    result = speculative_generate(
        setup.verifier,
        setup.draft,
        input_ids,
        rule=rule,
        k=settings.k,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.sampling.temperature,
        top_k=settings.sampling.top_k,
        top_p=settings.sampling.top_p,
        eos_token_id=setup.tokenizer.eos_token_id,
        pad_token_id=setup.tokenizer.pad_token_id,
        generator=decode_generator(settings.seed, batch),
        attention_mask=mask,
        divergence=False,
    )
    decoded_seconds = time.perf_counter() - started
    started = time.perf_counter()
    target, draft, ids = pools.rows_for_sequences(
        setup.verifier,
        setup.draft,
        result.sequences.to(setup.device),
        mask,
        result.num_generated.to(setup.device),
        settings.sampling,
        vocab_size(setup.verifier),
    )
    return {
        "num_generated": result.num_generated.numpy(),
        "accepted": result.accepted_lengths.numpy(),
        "drafts": result.draft_counts.numpy(),
        "target": target,
        "draft": draft,
        "ids": np.zeros((0, 0), np.int32) if ids is None else ids,
        "dense": np.array(ids is None),
        "seconds": np.array([decoded_seconds, time.perf_counter() - started]),
        "vocab": np.array(vocab_size(setup.verifier)),
    }


def decode_key(setup, settings: TheorySettings, rule: Rule, device: str, dtype: str) -> str:
    """The cached decode's key: the pair, the prompts and chat setting, the settings, the
    rule, device and dtype, and the code."""
    from cactus_theory.real.decode_table import pair_identity

    return provenance.fingerprint(
        "theory-decode",
        DECODE_FORMAT,
        {**settings.__dict__, "sampling": settings.sampling.label},
        spec_of(rule),
        pair_identity(setup),
        setup.prompts[: settings.num_prompts],
        setup.chat,
        device,
        dtype,
        DECODE_CODE,
    )


def decode(
    setup,
    settings: TheorySettings,
    rule: Rule | str,
    cache: Path | None,
    *,
    device: str,
    dtype: str,
    progress: bool = True,
) -> Decoded:
    """The first ``settings.num_prompts`` prompts of ``setup`` decoded with ``rule``,
    batch by batch, each batch cached under ``cache`` (None: no cache) and read back."""
    from tqdm.auto import tqdm

    chosen = parse(rule) if isinstance(rule, str) else rule
    prompts = setup.prompts[: settings.num_prompts]
    if not prompts:
        raise ValueError("prompts: the decode needs at least one prompt")
    folder = None
    if cache is not None:
        folder = Path(cache) / f"decode-{decode_key(setup, settings, chosen, device, dtype)}"
    count = -(-len(prompts) // settings.batch_size)
    shards, built, seconds = [], 0, np.zeros(2)
    for batch in tqdm(range(count), desc=f"decode {chosen.label}", disable=not progress):
        chunk = prompts[batch * settings.batch_size : (batch + 1) * settings.batch_size]
        path = None if folder is None else folder / f"batch-{batch:05d}.npz"
        arrays = None if path is None else pools._load(path)
        if arrays is None:
            arrays = decode_batch(setup, chunk, settings, chosen, batch)
            built += 1
            seconds += arrays["seconds"]
            if path is not None:
                pools._save(path, arrays)
        arrays["first_prompt"] = batch * settings.batch_size
        shards.append(arrays)
    return _assemble(shards, {"batches_decoded": built, "seconds": seconds.tolist()})


def _assemble(shards: list[dict], info: dict) -> Decoded:
    prompt, generated, rows, starts, accepted, drafts = [], [], [], [], [], []
    offset = 0
    for shard in shards:
        batch_rows = len(shard["num_generated"])
        steps = step_starts(shard["accepted"], shard["drafts"])
        prompt.append(shard["first_prompt"] + np.arange(batch_rows))
        generated.append(shard["num_generated"].astype(np.int64))
        rows.append(steps.row + offset)
        starts.append(steps.start)
        accepted.append(steps.accepted)
        drafts.append(steps.drafts)
        offset += batch_rows
    num_generated = np.concatenate(generated)
    owners = np.repeat(np.arange(offset), num_generated)
    positions = np.concatenate([np.arange(n) for n in num_generated]) if offset else np.zeros(0)
    vocab = int(shards[0]["vocab"])
    target, draft, ids = pools._join(
        [
            (s["target"], s["draft"], None if bool(s["dense"]) else s["ids"])
            for s in shards
            if len(s["target"])
        ],
        vocab,
    )
    teacher_forced = RealPool(
        target_probs=target,
        draft_probs=draft,
        ids=ids,
        vocab_size=vocab,
        prompt=owners,
        step=positions.astype(np.int64),
        token=np.zeros(len(owners), np.int64),
    )
    steps = VerifySteps(*(np.concatenate(part) for part in (rows, starts, accepted, drafts)))
    if np.any(steps.start >= num_generated[steps.row]):
        raise ValueError("accepted_lengths: a step starts past its row's generated tokens")
    return Decoded(np.concatenate(prompt), num_generated, steps, teacher_forced, info)
