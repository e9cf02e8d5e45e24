"""Real pools: the (q, p) rows of a verifier/draft pair at every position of real contexts.

A pool is what the exact trade-off (``real.tradeoff``) is computed on. It is built in two
passes per shard of prompts:

1. **contexts**: the verifier's own sampled continuations of the prompts under the pool's
   sampling settings (``decode.autoregressive_generate``: temperature, top-k, top-p, EOS),
   so the contexts have the law of lossless decoding (SpS emits exactly that law);
2. **rows**: one teacher-forced forward of each model over prompt + continuation
   (``teacher_forced_rows``): at the position before each generated token t, q is the
   verifier's law of t and p the draft's, both after the same processors. A feature draft
   reads the verifier's features of the positions before, exactly as at its **first draft
   position** in the decoder (``decode.cache.FeatureDraftCache`` refeeds every committed
   token with the verifier's true features before drafting); an independent draft reads
   the tokens alone.

Row r of the pool is therefore the (q, p) a verify step sees at its first drafted position
when it starts at that position of a lossless trajectory. What it does not describe:
- *deeper draft positions*: the feature draft's j-th draft (j >= 2) reads its own
  predicted features f̂ instead of the verifier's f, so its p is further from q and the
  acceptance at positions 2..k is lower than the pool's (a pool at depth j would need the
  draft unrolled j − 1 steps on its own features at every position);
- *where verify steps start*: the decoder starts a step only after the previous one ends,
  so its first positions are not a uniform sample of the trajectory's positions;
- *lossy rules*: a rule that emits another law moves the trajectory away from the
  verifier's, and the pool's contexts are the verifier's.

Storage: rows are kept packed to their support (the union of the tokens where q or p is
positive: at most 2·top-k columns after top-k), ``ids`` naming each column's token (the
vocabulary size pads); settings without truncation keep whole rows (``ids`` None),
processed in float32 chunks of ``ROW_CHUNK`` positions. Shards take the prompts in order,
``batch_size`` at a time, except that a shard takes no more prompts than the positions
still missing need (at ``max_new_tokens`` each: ``shard_size``), so the pool stops close
to ``positions`` instead of finishing a whole batch past it. Each shard is written
atomically as ``shard-SSSSS-NN.npz`` (its first prompt and its size) under a folder keyed
by the pair, the prompts, the settings, the device, the dtype and the code, so an
interrupted build resumes and a second run with the same key reads the shards back. Given
(pair, prompts, settings, dtype) the rows are the same in every run and at every thread
count (tests/real/test_pools.py builds a pool twice to show it). Shards also keep the
token sequences, so the same contexts can be teacher-forced again on another device
(``rows_for_sequences``).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cactus_theory.core import validate
from cactus_theory.core.processors import PAPER_SETTING, SamplingSettings
from cactus_theory.util import provenance
from cactus_theory.util.files import atomic_write

Array = np.ndarray

#: Positions processed (softmax, truncation, packing) per chunk of a shard.
ROW_CHUNK = 256
#: Rows wider than this share of the vocabulary are kept whole (no ids).
DENSE_SHARE = 0.5
#: The code the rows depend on.
CODE = provenance.source_fingerprint(
    "cactus_theory/sampler/processors.py",
    "cactus_theory/decode/feature_draft.py",
    "cactus_theory/decode/generate.py",
    "cactus_theory/real/pools.py",
)


@dataclass(frozen=True)
class PoolSettings:
    """What determines a pool's rows (and so its cache key), with ``positions``: build
    shards of ``batch_size`` prompts, in order, until the pool holds at least that many
    positions (or the ``num_prompts`` first prompts are used up)."""

    positions: int = 2000
    num_prompts: int = 80
    max_new_tokens: int = 128
    sampling: SamplingSettings = PAPER_SETTING
    batch_size: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("positions", "num_prompts", "max_new_tokens", "batch_size"):
            object.__setattr__(self, name, validate.positive_int(name, getattr(self, name)))
        if self.sampling.temperature == 0:
            raise ValueError(
                "temperature: a pool needs sampled continuations (temperature > 0); at "
                "temperature 0 every rule reduces to greedy matching"
            )

    def key_fields(self) -> dict:
        """The settings that change the rows (``positions`` only decides how many shards)."""
        fields = dataclasses.asdict(self)
        fields.pop("positions")
        return fields


@dataclass
class RealPool:
    """N positions of (q, p) rows, float32, packed to their support when ``ids`` is set.

    ``target_probs``, ``draft_probs``: [N, W]; ``ids``: [N, W] int32 token of each column
    (``vocab_size`` in padding columns, where both rows are 0), or None when W is the whole
    vocabulary; ``prompt`` [N], ``step`` [N] (0 = the first generated token), ``token`` [N]
    (the verifier's sampled token there); ``info``: pair, settings, timings.
    """

    target_probs: Array
    draft_probs: Array
    ids: Array | None
    vocab_size: int
    prompt: Array
    step: Array
    token: Array
    info: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return self.target_probs.shape[0]

    @property
    def width(self) -> int:
        return self.target_probs.shape[1]

    def rows(self, part: slice, full: bool = False) -> tuple[Array, Array]:
        """float64 (target, draft) rows of ``part``, each divided by its sum (float32
        rounding); with ``full`` (or when the pool keeps whole rows) over the whole
        vocabulary, [n, V], else packed, [n, W]."""
        target = self.target_probs[part].astype(np.float64)
        draft = self.draft_probs[part].astype(np.float64)
        target /= target.sum(axis=1, keepdims=True)
        draft /= draft.sum(axis=1, keepdims=True)
        if not full or self.ids is None:
            return target, draft
        ids = self.ids[part].astype(np.int64)
        wide = np.zeros((target.shape[0], self.vocab_size + 1))  # the last column: padding
        wide_draft = np.zeros_like(wide)
        np.put_along_axis(wide, ids, target, axis=1)
        np.put_along_axis(wide_draft, ids, draft, axis=1)
        return wide[:, :-1], wide_draft[:, :-1]

    def select(self, keep: Array) -> RealPool:
        """The positions where ``keep`` ([N] bool) is true, in order, with the same info."""
        keep = np.asarray(keep, dtype=bool)
        if keep.shape != (len(self),):
            raise ValueError(
                f"keep: must be a bool array of shape ({len(self)},), got {keep.shape}"
            )
        return RealPool(
            target_probs=self.target_probs[keep],
            draft_probs=self.draft_probs[keep],
            ids=None if self.ids is None else self.ids[keep],
            vocab_size=self.vocab_size,
            prompt=self.prompt[keep],
            step=self.step[keep],
            token=self.token[keep],
            info={**self.info, "positions": int(keep.sum())},
        )

    def chunks(self, size: int):
        """Slices of at most ``size`` positions covering the pool."""
        for start in range(0, len(self), size):
            yield slice(start, min(len(self), start + size))


# --- rows from models ---------------------------------------------------------------------


def pack_rows(target_rows, draft_rows, vocab_size: int):
    """(target [n, W], draft [n, W], ids [n, W] or None) from dense rows [n, V] (torch):
    each row's support (q > 0 or p > 0) in token order, padded with id ``vocab_size``."""
    import torch

    support = (target_rows > 0) | (draft_rows > 0)  # [n, V]
    counts = support.sum(dim=1)
    width = int(counts.max()) if len(counts) else 1
    if width > DENSE_SHARE * vocab_size:
        return target_rows.float().cpu().numpy(), draft_rows.float().cpu().numpy(), None
    rows, columns = support.nonzero(as_tuple=True)  # row-major: columns ascend within a row
    slot = support.cumsum(dim=1)[rows, columns] - 1
    ids = torch.full((len(counts), width), vocab_size, dtype=torch.int32, device=support.device)
    target = torch.zeros(len(counts), width, dtype=torch.float32, device=support.device)
    draft = torch.zeros_like(target)
    ids[rows, slot] = columns.to(torch.int32)
    target[rows, slot] = target_rows[rows, columns].float()
    draft[rows, slot] = draft_rows[rows, columns].float()
    return target.cpu().numpy(), draft.cpu().numpy(), ids.cpu().numpy()


def _kept_logits(model, generated: int) -> dict:
    """``logits_to_keep`` when the model takes it (the head runs on the last positions only)."""
    import inspect

    return (
        {"logits_to_keep": generated}
        if "logits_to_keep" in inspect.signature(model.forward).parameters
        else {}
    )


def teacher_forced_chunks(
    verifier,
    draft,
    sequences,  # [B, P + T] prompts (left-padded) then generated tokens
    prompt_mask,  # [B, P]
    num_generated,  # [B]
    sampling: SamplingSettings,
):
    """Yield (q rows [n, V], p rows [n, V]) torch float32 chunks of at most ``ROW_CHUNK``
    positions: every generated position in row-major order (row b's positions 0 ..
    num_generated[b] − 1), from one teacher-forced forward of each model (module docstring)."""
    import torch

    from cactus_theory.decode.cache import positions_of_prompt
    from cactus_theory.decode.feature_draft import FeatureDraft
    from cactus_theory.sampler.processors import process_logits

    device = sequences.device
    prompt = prompt_mask.shape[1]
    generated = sequences.shape[1] - prompt  # T
    steps = torch.arange(generated, device=device)[None, :]  # [1, T]
    valid = steps < num_generated[:, None].to(device)  # [B, T]
    mask = torch.cat([prompt_mask.to(device, torch.int64), valid.to(torch.int64)], dim=1)
    inputs, input_mask = sequences[:, :-1], mask[:, :-1]  # [B, L]; the last token predicts nothing
    positions = positions_of_prompt(input_mask)  # [B, L]
    is_feature_draft = isinstance(draft, FeatureDraft)
    with torch.inference_mode():
        output = verifier(
            input_ids=inputs,
            attention_mask=input_mask,
            position_ids=positions,
            output_hidden_states=is_feature_draft,
            **_kept_logits(verifier, generated),
        )
        target_logits = output.logits[:, -generated:]  # [B, T, V]: laws of tokens P .. P+T−1
        if is_feature_draft:
            features = output.hidden_states[-1]  # [B, L, H]: what lm_head reads
            before = torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], dim=1)
            before_valid = torch.cat(
                [torch.zeros_like(input_mask[:, :1]), input_mask[:, :-1]], dim=1
            )  # [B, L]
            before = before * before_valid[..., None].to(before.dtype)  # 0 after padding
            predicted = draft.predict_features(
                inputs, before, attention_mask=input_mask, position_ids=positions
            )  # [B, L, H]
            draft_source = predicted[:, -generated:]  # [B, T, H]
        else:
            draft_output = draft(
                input_ids=inputs,
                attention_mask=input_mask,
                position_ids=positions,
                **_kept_logits(draft, generated),
            )
            draft_source = draft_output.logits[:, -generated:]  # [B, T, V]
        rows, columns = valid.nonzero(as_tuple=True)  # row-major order
        for start in range(0, len(rows), ROW_CHUNK):
            part = slice(start, start + ROW_CHUNK)
            target = process_logits(target_logits[rows[part], columns[part]], sampling)
            source = draft_source[rows[part], columns[part]]
            logits = draft.logits(source) if is_feature_draft else source
            yield target, process_logits(logits, sampling)


def teacher_forced_rows(verifier, draft, sequences, prompt_mask, num_generated, sampling):
    """(q rows [n, V], p rows [n, V]): every chunk of ``teacher_forced_chunks`` joined."""
    import torch

    chunks = list(
        teacher_forced_chunks(verifier, draft, sequences, prompt_mask, num_generated, sampling)
    )
    if not chunks:
        return None, None
    return torch.cat([chunk[0] for chunk in chunks]), torch.cat([chunk[1] for chunk in chunks])


def rows_for_sequences(verifier, draft, sequences, prompt_mask, num_generated, sampling, vocab):
    """Packed rows (target [n, W], draft [n, W], ids [n, W] or None) of
    ``teacher_forced_chunks``, packed chunk by chunk (``pack_rows``), so whole-vocabulary
    rows never exist for more than ``ROW_CHUNK`` positions at a time before packing."""
    parts = [
        pack_rows(target, draft_rows, vocab)
        for target, draft_rows in teacher_forced_chunks(
            verifier, draft, sequences, prompt_mask, num_generated, sampling
        )
    ]
    if not parts:
        empty = np.zeros((0, 1), np.float32)
        return empty, empty.copy(), np.zeros((0, 1), np.int32)
    return _join(parts, vocab)


def _join(parts, vocab: int):
    """One (target, draft, ids) of packed parts of different widths (padding appended)."""
    if any(ids is None for _, _, ids in parts):
        if not all(ids is None for _, _, ids in parts):
            parts = [_widen(target, draft, ids, vocab) for target, draft, ids in parts]
        return (
            np.concatenate([part[0] for part in parts]),
            np.concatenate([part[1] for part in parts]),
            None,
        )
    width = max(part[0].shape[1] for part in parts)
    targets, drafts, ids = [], [], []
    for target, draft, columns in parts:
        extra = width - target.shape[1]
        targets.append(np.pad(target, ((0, 0), (0, extra))))
        drafts.append(np.pad(draft, ((0, 0), (0, extra))))
        ids.append(np.pad(columns, ((0, 0), (0, extra)), constant_values=vocab))
    return np.concatenate(targets), np.concatenate(drafts), np.concatenate(ids)


def _widen(target: Array, draft: Array, ids: Array | None, vocab: int):
    if ids is None:
        return target, draft, None
    wide_target = np.zeros((target.shape[0], vocab + 1), dtype=np.float32)
    wide_draft = np.zeros_like(wide_target)
    np.put_along_axis(wide_target, ids.astype(np.int64), target, axis=1)
    np.put_along_axis(wide_draft, ids.astype(np.int64), draft, axis=1)
    return wide_target[:, :-1], wide_draft[:, :-1], None


# --- building, caching, loading -----------------------------------------------------------


def cache_key(setup, settings: PoolSettings, prompts: list[str], device: str, dtype: str) -> str:
    """The pool folder's key: the pair (names, file sizes and times), the prompts and the
    chat setting, the settings, the device and dtype, and the code."""
    from cactus_theory.real.decode_table import pair_identity

    return provenance.fingerprint(
        "pool",
        settings.key_fields(),
        pair_identity(setup),
        prompts,
        setup.chat,
        device,
        dtype,
        CODE,
    )


def shard_size(settings: PoolSettings, positions: int, prompts_left: int) -> int:
    """The prompts of the next shard: ``batch_size``, or fewer when the positions still
    missing (``settings.positions − positions``) need fewer prompts at ``max_new_tokens``
    positions each; never more than ``prompts_left``, never fewer than one."""
    missing = max(settings.positions - positions, 1)
    needed = -(-missing // settings.max_new_tokens)
    return max(1, min(settings.batch_size, needed, prompts_left))


def _generator(settings: PoolSettings, shard: int):
    import torch

    return torch.Generator().manual_seed(settings.seed * 1_000_003 + shard)


def build_shard(setup, prompts: list[str], settings: PoolSettings, shard: int) -> dict:
    """One shard's arrays: continuations sampled from the verifier, then the rows."""
    from cactus_theory.decode import autoregressive_generate
    from cactus_theory.decode.runs import encode

    input_ids, mask = encode(setup, prompts)
    input_ids, mask = input_ids.to(setup.device), mask.to(setup.device)
    started = time.perf_counter()
    result = autoregressive_generate(
        setup.verifier,
        input_ids=input_ids,
        attention_mask=mask,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.sampling.temperature,
        top_k=settings.sampling.top_k,
        top_p=settings.sampling.top_p,
        eos_token_id=setup.tokenizer.eos_token_id,
        pad_token_id=setup.tokenizer.pad_token_id,
        generator=_generator(settings, shard),
        divergence=False,
    )
    generated_seconds = time.perf_counter() - started
    started = time.perf_counter()
    sequences = result.sequences.to(setup.device)
    num_generated = result.num_generated.to(setup.device)
    target, draft, ids = rows_for_sequences(
        setup.verifier,
        setup.draft,
        sequences,
        mask,
        num_generated,
        settings.sampling,
        _vocab(setup),
    )
    forced_seconds = time.perf_counter() - started
    counts = result.num_generated.tolist()
    steps = np.concatenate([np.arange(count) for count in counts]) if counts else np.zeros(0)
    owners = np.repeat(np.arange(len(counts)), counts)
    generated = sequences[:, mask.shape[1] :].cpu().numpy()
    tokens = generated[owners, steps.astype(np.int64)] if len(owners) else np.zeros(0)
    return {
        "target": target,
        "draft": draft,
        "ids": np.zeros((0, 0), np.int32) if ids is None else ids,
        "dense": np.array(ids is None),
        "prompt_local": owners.astype(np.int32),
        "step": steps.astype(np.int32),
        "token": tokens.astype(np.int64),
        "sequences": sequences.cpu().numpy(),
        "prompt_mask": mask.cpu().numpy().astype(np.int8),
        "num_generated": result.num_generated.cpu().numpy(),
        "seconds": np.array([generated_seconds, forced_seconds]),
    }


def _save(path: Path, arrays: dict) -> None:
    def write(temporary: Path) -> None:
        with temporary.open("wb") as handle:
            np.savez(handle, **arrays)

    atomic_write(path, write)


def _load(path: Path) -> dict | None:
    """A shard's arrays, or None when missing or damaged (then it is rebuilt)."""
    if not path.is_file():
        return None
    try:
        with np.load(path) as stored:
            return {key: stored[key] for key in stored.files}
    except (OSError, ValueError, KeyError, EOFError):
        return None


def build_pool(
    setup,
    settings: PoolSettings,
    cache: Path | None,
    *,
    device: str,
    dtype: str,
    progress: bool = True,
    name: str = "pool",
    on_shard=None,
) -> RealPool:
    """The pool of ``setup`` (a ``decode.runs.Setup``: models, tokenizer, prompts) with
    ``settings``, built shard by shard (module docstring), reading finished shards from
    ``cache`` (None: no cache). ``on_shard(shards, positions, fresh)`` is called after each
    shard (``fresh``: computed now, not read back), e.g. for progress lines."""
    from tqdm.auto import tqdm

    prompts = setup.prompts[: settings.num_prompts]
    if not prompts:
        raise ValueError("prompts: the pool needs at least one prompt")
    folder = None
    if cache is not None:
        key = cache_key(setup, settings, prompts, device, dtype)
        folder = Path(cache) / f"pool-{key}"
    shards, total, seconds, built, start = [], 0, np.zeros(2), 0, 0
    bar = tqdm(total=settings.positions, desc=f"{name} positions", disable=not progress)
    while total < settings.positions and start < len(prompts):
        size = shard_size(settings, total, len(prompts) - start)
        chunk = prompts[start : start + size]
        shard = len(shards)
        path = None if folder is None else folder / f"shard-{start:05d}-{size:02d}.npz"
        arrays = None if path is None else _load(path)
        fresh = arrays is None
        if fresh:
            arrays = build_shard(setup, chunk, settings, shard)
            built += 1
            seconds += arrays["seconds"]
            if path is not None:
                _save(path, arrays)
        arrays["prompt"] = arrays["prompt_local"] + start
        shards.append(arrays)
        bar.update(min(len(arrays["step"]), settings.positions - total))
        total += len(arrays["step"])
        start += size
        if on_shard is not None:
            on_shard(shard + 1, total, fresh)
    bar.close()
    vocab = _vocab(setup)
    if folder is not None:
        _write_manifest(folder, setup, settings, device, dtype)
    return _assemble(
        shards,
        vocab,
        {
            "pair": setup.pair.name,
            "verifier": setup.pair.verifier,
            "draft": setup.pair.draft,
            "settings": {**dataclasses.asdict(settings), "sampling": settings.sampling.label},
            "device": device,
            "dtype": dtype,
            "prompts": len({int(i) for shard in shards for i in np.unique(shard["prompt"])}),
            "shards_built": built,
            "generation_seconds": float(seconds[0]),
            "teacher_forcing_seconds": float(seconds[1]),
            "folder": None if folder is None else str(folder),
        },
    )


def _vocab(setup) -> int:
    from cactus_theory.decode.checks import vocab_size

    return vocab_size(setup.verifier)


def _write_manifest(folder: Path, setup, settings: PoolSettings, device: str, dtype: str) -> None:
    from cactus_theory.util.files import atomic_write_json

    manifest = folder / "pool.json"
    if not manifest.exists():
        atomic_write_json(
            manifest,
            {
                "verifier": setup.pair.verifier,
                "draft": setup.pair.draft,
                "settings": {**settings.key_fields(), "sampling": settings.sampling.label},
                "device": device,
                "dtype": dtype,
            },
            indent=1,
        )


def _assemble(shards: list[dict], vocab: int, info: dict) -> RealPool:
    if not shards or not sum(len(shard["step"]) for shard in shards):
        raise ValueError("prompts: the continuations hold no generated position")
    parts = [
        (shard["target"], shard["draft"], None if bool(shard["dense"]) else shard["ids"])
        for shard in shards
    ]
    target, draft, ids = _join(parts, vocab)
    info = {**info, "positions": int(target.shape[0])}
    return RealPool(
        target_probs=target,
        draft_probs=draft,
        ids=ids,
        vocab_size=vocab,
        prompt=np.concatenate([shard["prompt"] for shard in shards]),
        step=np.concatenate([shard["step"] for shard in shards]),
        token=np.concatenate([shard["token"] for shard in shards]),
        info=info,
    )


def describe(pool: RealPool) -> str:
    """One line: positions, prompts, width, timings."""
    info = pool.info
    packed = f"packed to {pool.width} columns" if pool.ids is not None else "whole rows"
    head = f"{len(pool):,} positions from {info.get('prompts', '?')} prompts ({packed})"
    if not info.get("shards_built", 1):
        return f"{head}; read from the cache ({info.get('folder')})"
    return (
        f"{head}; generation {info.get('generation_seconds', 0):.1f} s, teacher forcing "
        f"{info.get('teacher_forcing_seconds', 0):.1f} s this run"
    )
