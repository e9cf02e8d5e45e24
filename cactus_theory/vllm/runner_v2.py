"""The accept step for vLLM's Model Runner V2 (the CUDA default in vLLM 0.32).

V2 calls ``vllm.v1.worker.gpu.spec_decode.rejection_sampler.rejection_sample`` (imported
there from ``rejection_sampler_utils``) with a layout unlike V1's:

- ``target_logits [L, V]``: processed logits (temperature, top-k, top-p applied) of every
  logits row; request b owns rows ``cu_num_logits[b] : cu_num_logits[b+1]``, its n_b draft
  positions then its bonus position (L = Σ (n_b + 1));
- ``draft_sampled [L]``: the input token of each row, so the draft verified at row
  start + i is ``draft_sampled[start + i + 1]`` (-1 marks a placeholder);
- ``draft_logits [max_num_reqs, K, V]`` or None: the draft's raw logits (before
  temperature) by request-state index ``idx_mapping[b]`` and step; the draft law is
  softmax(draft_logits / temperature);
- ``temperature``, ``seed [max_num_reqs]`` by request-state index; ``pos [L]`` positions.

It returns ``(sampled [B, K+1] int64, num_sampled [B] int32)``: accepted drafts and the
emitted token, num_sampled = accepted + 1; vLLM never reads past num_sampled, and this
adapter fills the rest with -1. V2 samples the bonus token inside the accept step, so the
adapter draws it here from the bonus row. Randomness: a CPU ``torch.Generator`` per row
seeded from (seed, position of the row's first logits row), so a request's draws depend on
its seed and position only, as in V2.

Greedy rows (temperature 0), block verification, synthetic acceptance and watermarking keep
vLLM's own function; rows are routed by ``router``, the row router shared with V1. The rule
is the engine default (``CACTUS_VLLM_RULE``); V2 does not expose the requests'
``SamplingParams`` here, so there is no per-request rule in V2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cactus_theory.core.rules.base import Rule
from cactus_theory.sampler.verify_step import inverse_cdf
from cactus_theory.vllm import accept, config, router
from cactus_theory.vllm.config import MARK

Tensor = torch.Tensor

#: Where V2 looks the accept function up at call time.
V2_MODULE = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"


def row_generator(seed: int, position: int) -> torch.Generator:
    """A CPU generator determined by a request's seed and a position."""
    mixed = (int(seed) * 0x9E3779B97F4A7C15 + int(position) * 0xBF58476D1CE4E5B9) % (1 << 63)
    return torch.Generator().manual_seed(mixed)


def rejection_sample(
    original: Callable[..., tuple[Tensor, Tensor]] | None,
    target_logits: Tensor,  # [L, V]
    draft_logits: Tensor | None,  # [max_num_reqs, K, V]
    draft_sampled: Tensor,  # [L]
    cu_num_logits: Tensor,  # [B+1]
    pos: Tensor,  # [L]
    idx_mapping: Tensor,  # [B]
    expanded_idx_mapping: Tensor,  # [L]
    expanded_local_pos: Tensor,  # [L]
    temperature: Tensor,  # [max_num_reqs]
    seed: Tensor,  # [max_num_reqs]
    num_speculative_steps: int,
    synthetic_conditional_rates: Tensor | None = None,
    use_fp64: bool = False,
    use_block_verification: bool = False,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """Model Runner V2's ``rejection_sample`` with the engine's rule (see the module
    docstring); ``original`` is vLLM's function (None: every row must have a rule).

    Returns (sampled [B, K+1] int64 padded with -1, num_sampled [B] int32).
    """
    args = (
        target_logits,
        draft_logits,
        draft_sampled,
        cu_num_logits,
        pos,
        idx_mapping,
        expanded_idx_mapping,
        expanded_local_pos,
        temperature,
        seed,
        num_speculative_steps,
        synthetic_conditional_rates,
        use_fp64,
        use_block_verification,
    )
    batch = int(cu_num_logits.shape[0]) - 1
    device = target_logits.device
    special = (
        synthetic_conditional_rates is not None
        or use_block_verification
        or kwargs.get("contexts") is not None
    )
    states = idx_mapping.to(torch.int64)  # [B]
    greedy = (temperature[states] == 0).tolist()
    bounds = cu_num_logits.to(torch.int64).tolist()
    counts = [bounds[b + 1] - bounds[b] - 1 for b in range(batch)]  # drafts per row
    routing = router.route(greedy, counts)
    if special or not routing.ours:
        if original is None:
            raise ValueError("original: vLLM's function is needed for rows without a rule")
        return original(*args, **kwargs)
    steps = int(num_speculative_steps)
    if routing.theirs:
        if original is None:
            raise ValueError("original: vLLM's function is needed for greedy rows")
        sampled, num_sampled = original(*args, **kwargs)
        sampled, num_sampled = sampled.clone(), num_sampled.clone()
    else:
        sampled = torch.full((batch, steps + 1), accept.PAD_ID, dtype=torch.int64, device=device)
        num_sampled = torch.zeros(batch, dtype=torch.int32, device=device)

    vocab = int(target_logits.shape[1])
    if draft_logits is not None:
        vocab = min(vocab, int(draft_logits.shape[-1]))
    meter = config.current_meter()

    def verify_group(rule: Rule, group: list[int]) -> accept.FlatResult:
        group_counts = [counts[b] for b in group]
        draft_rows = torch.cat([torch.arange(bounds[b], bounds[b + 1] - 1) for b in group]).to(
            device
        )  # [Ng] logits rows of the drafted positions
        bonus_rows = torch.tensor([bounds[b + 1] - 1 for b in group], device=device)  # [G]
        group_states = states[group]  # [G]
        temps = temperature[group_states].to(torch.float32)  # [G]
        target_probs = target_logits[draft_rows, :vocab].softmax(-1, dtype=torch.float32)
        bonus_probs = target_logits[bonus_rows, :vocab].softmax(-1, dtype=torch.float32)
        ids = draft_sampled[draft_rows + 1].to(torch.int64)  # [Ng]
        if draft_logits is None:
            draft_probs = None
        else:
            row_of = torch.repeat_interleave(
                torch.arange(len(group), device=device), torch.tensor(group_counts, device=device)
            )  # [Ng]
            step_of = torch.cat([torch.arange(n) for n in group_counts]).to(device)  # [Ng]
            raw = draft_logits[group_states[row_of], step_of, :vocab].to(torch.float32)
            draft_probs = (raw / temps[row_of, None]).softmax(-1)  # [Ng, V]
        width = max(group_counts, default=0)
        uniforms = torch.empty(len(group), width + 2, dtype=torch.float64)  # [G, K+2]
        for slot, b in enumerate(group):
            generator = row_generator(int(seed[states[b]]), int(pos[bounds[b]]))
            uniforms[slot] = torch.rand(width + 2, dtype=torch.float64, generator=generator)
        uniforms = uniforms.to(device)
        bonus = inverse_cdf(bonus_probs, uniforms[:, width + 1])  # [G]
        result = accept.accept_flat(
            rule,
            ids,
            group_counts,
            target_probs,
            draft_probs,
            bonus,
            width=steps + 1,
            uniforms=(uniforms[:, :width], uniforms[:, width]),
            meter=meter,
        )
        sampled[group] = result.token_ids.to(torch.int64)
        num_sampled[group] = (result.num_accepted + 1).to(torch.int32)
        return result

    router.verify_groups(routing, verify_group, meter)
    return sampled, num_sampled


def install() -> bool:
    """Replace V2's accept function (once); False when this vLLM has no Model Runner V2."""
    try:
        import importlib

        module = importlib.import_module(V2_MODULE)
    except Exception:  # noqa: BLE001 - any import failure means "no V2 here"
        return False
    original = module.rejection_sample
    if getattr(original, MARK, False):
        return True

    def patched(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        return rejection_sample(original, *args, **kwargs)

    setattr(patched, MARK, True)
    patched.__wrapped__ = original
    module.rejection_sample = patched
    return True
