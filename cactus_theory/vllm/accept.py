"""vLLM V1's accept step for any rule of ``cactus_theory.rules``, on vLLM's flattened layout.

vLLM V1 (``vllm.v1.sample.rejection_sampler``) verifies a batch of B requests whose drafts
are flattened: request b owns the rows ``cu_num_draft_tokens[b-1] : cu_num_draft_tokens[b]``
of ``draft_token_ids [N]``, ``draft_probs [N, V]`` and ``target_logits [N, V]`` (already
through temperature, top-k and top-p), and its bonus token (sampled by vLLM from the row
after its last draft) is ``bonus_token_ids[b]``. The step returns ``[B, max_spec_len + 1]``
int32 token ids: the accepted drafts, the emitted token, then ``PAD_ID`` (-1).

``accept_flat`` pads the ragged rows to ``[B, kmax, V]`` and calls the project's batched
sampler ``sampler.verify_step.verify`` with ``num_drafts`` (no second implementation of the
mathematics). The bonus token is placed by putting a one-hot row of it at position
num_drafts[b] of the target block, so ``verify`` emits exactly vLLM's bonus when every draft
is accepted. ``rejection_sample`` is the drop-in for vLLM's module-level function: the row
router shared with Model Runner V2 (``router``) sends each row to its rule, keeps vLLM's own
path for greedy rows and rows whose rule is ``"vllm"``, and records the metrics.

Placeholders: a draft id outside [0, V) (vLLM pads with -1) ends the row's drafts there; the
token at that position is then sampled from the target row (nothing was drafted), so no id
outside [0, V) is ever emitted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cactus_theory.core.rules.base import Rule
from cactus_theory.core.rules.sps import SpS
from cactus_theory.core.verify import PAD_ID
from cactus_theory.sampler.divergence_meter import positions_below
from cactus_theory.sampler.law import emitted_divergence
from cactus_theory.sampler.verify_step import verify
from cactus_theory.vllm import config, router

Tensor = torch.Tensor

#: vLLM's placeholder for "no token" in the output rows is the sampler's PAD_ID (-1).


@dataclass
class FlatResult:
    """What ``accept_flat`` returns for B rows.

    token_ids : [B, width] int32: accepted drafts, the emitted token, then -1.
    num_accepted : [B] int64 accepted drafts per row.
    num_drafts : [B] int64 drafts actually verified per row (placeholders cut them short).
    kl : [B] float64 Σ KL(emitted law ‖ q) over the row's verified positions that emitted a
        token (0 for the bonus); zeros when the meter is off.
    """

    token_ids: Tensor
    num_accepted: Tensor
    num_drafts: Tensor
    kl: Tensor


def _check_layout(
    draft_token_ids: Tensor,
    num_draft_tokens: Sequence[int],
    target_probs: Tensor,
    draft_probs: Tensor | None,
    bonus_token_ids: Tensor,
) -> tuple[int, int, int]:
    """(B, N, V) after checking the flattened layout; ValueError naming the argument."""
    if not isinstance(draft_token_ids, torch.Tensor) or draft_token_ids.ndim != 1:
        raise ValueError("draft_token_ids: expected a 1-D tensor [N]")
    if draft_token_ids.dtype.is_floating_point:
        raise ValueError(f"draft_token_ids: expected integer ids, got {draft_token_ids.dtype}")
    counts = list(num_draft_tokens)
    if any(int(n) < 0 for n in counts):
        raise ValueError("num_draft_tokens: counts must be >= 0")
    num_tokens = int(draft_token_ids.shape[0])
    if sum(int(n) for n in counts) != num_tokens:
        raise ValueError(
            f"num_draft_tokens: sums to {sum(counts)}, but draft_token_ids has {num_tokens} rows"
        )
    if not isinstance(target_probs, torch.Tensor) or target_probs.ndim != 2:
        raise ValueError("target_probs: expected a 2-D tensor [N, V]")
    if target_probs.shape[0] != num_tokens:
        raise ValueError(f"target_probs: expected {num_tokens} rows, got {target_probs.shape[0]}")
    vocab = int(target_probs.shape[1])
    if draft_probs is not None and tuple(draft_probs.shape) != tuple(target_probs.shape):
        raise ValueError(
            f"draft_probs: expected shape {tuple(target_probs.shape)}, "
            f"got {tuple(draft_probs.shape)}"
        )
    batch = len(counts)
    if bonus_token_ids.reshape(-1).shape[0] != batch:
        raise ValueError(f"bonus_token_ids: expected {batch} ids, got {bonus_token_ids.numel()}")
    if batch and bool(((bonus_token_ids < 0) | (bonus_token_ids >= vocab)).any()):
        raise ValueError(f"bonus_token_ids: ids must lie in [0, {vocab})")
    return batch, num_tokens, vocab


def row_uniforms(
    num_drafts: Sequence[int],
    width: int,
    device: torch.device,
    generators: Mapping[int, torch.Generator] | None = None,
    rows: Sequence[int] | None = None,
) -> tuple[Tensor, Tensor]:
    """(accept_uniforms [B, width], sample_uniforms [B]) in float64.

    Rows draw from torch's default generator, except a row b whose batch index
    ``rows[b]`` (default b) has a generator in ``generators`` (vLLM's per-request seeds)
    and at least one draft: it takes num_drafts[b] + 1 uniforms from that generator, in
    order (accepts, then the sample), so a seeded request reproduces whatever it is batched
    with.
    """
    batch = len(num_drafts)
    uniforms = torch.rand(batch, width + 1, dtype=torch.float64, device=device)  # [B, w+1]
    for slot, count in enumerate(num_drafts):
        index = slot if rows is None else rows[slot]
        generator = (generators or {}).get(index)
        if generator is None or count == 0:
            continue
        own = torch.rand(
            count + 1, dtype=torch.float64, device=generator.device, generator=generator
        )
        uniforms[slot, :count] = own[:count].to(device)
        uniforms[slot, width] = own[count].to(device)
    return uniforms[:, :width], uniforms[:, width]


def accept_flat(
    rule: Rule,
    draft_token_ids: Tensor,
    num_draft_tokens: Sequence[int],
    target_probs: Tensor,
    draft_probs: Tensor | None,
    bonus_token_ids: Tensor,
    *,
    width: int | None = None,
    uniforms: tuple[Tensor, Tensor] | None = None,
    generators: Mapping[int, torch.Generator] | None = None,
    rows: Sequence[int] | None = None,
    meter: bool = False,
    check: bool = False,
) -> FlatResult:
    """Verify B ragged rows of drafts with ``rule``.

    Parameters
    ----------
    rule : any rule of ``cactus_theory.rules``.
    draft_token_ids : [N] integer drafted ids, row b's at its slice of the flattening;
        an id outside [0, V) (vLLM's -1) ends that row's drafts.
    num_draft_tokens : B counts summing to N.
    target_probs : [N, V] the verifier's laws q at the drafted positions.
    draft_probs : [N, V] the laws p the drafts were sampled from, or None for one-hot drafts
        (allowed only for SpS and the decision rules: ``config.needs_draft_probs``).
    bonus_token_ids : [B] or [B, 1] the token emitted when every draft is accepted.
    width : output width (vLLM's max_spec_len + 1); default max(num_draft_tokens) + 1.
    uniforms : (accept [B, kmax], sample [B]) in [0, 1), kmax = max(num_draft_tokens);
        default ``row_uniforms(..., generators, rows)``.
    generators, rows : per-request generators keyed by batch index, and the batch index of
        each of the B rows (when they are a subset of vLLM's batch).
    meter : also compute the exact KL of the emitted law at each emitting position.
    check : run ``verify``'s value checks (row sums, NaN) on the padded blocks.

    Returns
    -------
    FlatResult with token_ids [B, width] int32.
    """
    batch, num_tokens, vocab = _check_layout(
        draft_token_ids, num_draft_tokens, target_probs, draft_probs, bonus_token_ids
    )
    device = target_probs.device
    counts = [int(n) for n in num_draft_tokens]
    steps = max(counts, default=0)
    width = steps + 1 if width is None else int(width)
    if width < steps + 1:
        raise ValueError(f"width: must be at least max(num_draft_tokens) + 1 = {steps + 1}")
    bonus = bonus_token_ids.reshape(-1).to(device, torch.int64)  # [B]
    token_ids = torch.full((batch, width), PAD_ID, dtype=torch.int32, device=device)
    num_accepted = torch.zeros(batch, dtype=torch.int64, device=device)  # [B]
    kl = torch.zeros(batch, dtype=torch.float64, device=device)  # [B]
    lengths = torch.tensor(counts, dtype=torch.int64, device=device)  # [B]
    if steps == 0:
        token_ids[:, 0] = bonus.to(torch.int32)
        return FlatResult(token_ids, num_accepted, lengths, kl)
    if draft_probs is None and config.needs_draft_probs(rule):
        raise ValueError(
            f"draft_probs: rule {rule.name!r} needs the draft's probabilities, but the drafts "
            "are one-hot; use speculative_config draft_sample_method='probabilistic'"
        )

    starts = torch.cumsum(lengths, 0) - lengths  # [B] first flat row of each request
    row_of = torch.repeat_interleave(torch.arange(batch, device=device), lengths)  # [N]
    position_of = torch.arange(num_tokens, device=device) - starts[row_of]  # [N]
    ids = draft_token_ids.to(device, torch.int64)  # [N]
    valid = (ids >= 0) & (ids < vocab)  # [N]
    # A placeholder ends the row: drafts verified = position of the first invalid id.
    invalid_at = torch.where(valid, steps, position_of)  # [N]
    first_invalid = torch.full((batch,), steps, dtype=torch.int64, device=device)
    first_invalid.scatter_reduce_(0, row_of, invalid_at, reduce="amin")
    drafts = torch.minimum(lengths, first_invalid)  # [B] effective drafts

    dtype = target_probs.dtype if target_probs.dtype == torch.float64 else torch.float32
    one_hot = torch.zeros(batch, vocab, dtype=dtype, device=device)  # [B, V]
    one_hot.scatter_(1, bonus[:, None], 1.0)
    # Position num_drafts[b] of row b holds its bonus as a one-hot (so ``verify`` emits it
    # after all accepts); positions past it too (never read, but valid rows).
    target_block = one_hot[:, None, :].repeat(1, steps + 1, 1)  # [B, kmax+1, V]
    target_block[row_of, position_of] = target_probs.to(dtype)
    safe_ids = ids.clamp(0, vocab - 1)  # [N]
    if draft_probs is None:
        draft_flat = torch.zeros(num_tokens, vocab, dtype=dtype, device=device)  # [N, V]
        draft_flat.scatter_(1, safe_ids[:, None], 1.0)
    else:
        draft_flat = draft_probs.to(dtype)  # [N, V]
    draft_block = one_hot[:, None, :].repeat(1, steps, 1)  # [B, kmax, V]
    draft_block[row_of, position_of] = draft_flat
    # Where a placeholder cut a row short, position num_drafts[b] keeps the real q (nothing
    # was drafted there, so a sample from q is emitted); the bonus one-hot sits at
    # position lengths[b], reached only when every real draft is accepted.
    id_block = torch.zeros(batch, steps, dtype=torch.int64, device=device)  # [B, kmax]
    id_block[row_of, position_of] = safe_ids

    if uniforms is None:
        uniforms = row_uniforms(drafts.tolist(), steps, device, generators, rows)
    padded, num_accepted = verify(
        target_block,
        draft_block,
        id_block,
        rule,
        uniforms=uniforms,
        check=check,
        num_drafts=drafts,
    )  # [B, kmax+1], [B]
    token_ids[:, : steps + 1] = padded.to(torch.int32)

    if meter and not isinstance(rule, SpS):
        # Emitting verified positions: i < min(num_accepted + 1, num_drafts) (a bonus has KL 0).
        limit = torch.minimum(num_accepted + 1, drafts)  # [B]
        meter_rows, meter_positions = positions_below(limit, steps)  # [R], [R]
        if meter_rows.numel():
            flat = starts[meter_rows] + meter_positions  # [R]
            row_kl, _ = emitted_divergence(rule, target_probs[flat], draft_flat[flat])  # [R]
            kl.index_add_(0, meter_rows, row_kl.to(torch.float64))
    return FlatResult(token_ids, num_accepted, drafts, kl)


def greedy_rows(sampling_metadata: Any, batch: int, device: torch.device) -> Tensor:
    """[B] bool: the rows vLLM samples greedily (temperature 0)."""
    if sampling_metadata.all_greedy:
        return torch.ones(batch, dtype=torch.bool, device=device)
    if sampling_metadata.all_random or sampling_metadata.temperature is None:
        return torch.zeros(batch, dtype=torch.bool, device=device)
    return (sampling_metadata.temperature[:batch] == 0).to(device)


def rejection_sample(
    original: Callable[..., Tensor],
    draft_token_ids: Tensor,  # [N]
    num_draft_tokens: list[int],  # B
    max_spec_len: int,
    cu_num_draft_tokens: Tensor,  # [B]
    draft_probs: Tensor | None,  # [N, V]
    target_logits: Tensor,  # [N, V] processed
    bonus_token_ids: Tensor,  # [B, 1]
    sampling_metadata: Any,
    *args: Any,
    **kwargs: Any,
) -> Tensor:
    """vLLM V1's ``rejection_sample`` with each row verified by its rule (``router``).

    ``original`` is vLLM's own function (called for greedy rows and rows whose rule is
    ``"vllm"``; called alone when no row has a rule). The rest are vLLM's arguments, in its
    order. Returns [B, max_spec_len + 1] int32 as vLLM does.
    """
    batch = len(num_draft_tokens)
    device = target_logits.device
    greedy = greedy_rows(sampling_metadata, batch, device).tolist()
    routing = router.route(greedy, num_draft_tokens)
    if routing.theirs:
        output = original(
            draft_token_ids,
            num_draft_tokens,
            max_spec_len,
            cu_num_draft_tokens,
            draft_probs,
            target_logits,
            bonus_token_ids,
            sampling_metadata,
            *args,
            **kwargs,
        )
        router.record_vllm_rows(
            routing, lambda rows: ((output[rows] != PAD_ID).sum(dim=1) - 1).tolist()
        )
        if not routing.ours:
            return output
    else:
        output = torch.full((batch, max_spec_len + 1), PAD_ID, dtype=torch.int32, device=device)
    target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)  # [N, V]
    lengths = torch.tensor(num_draft_tokens, dtype=torch.int64)  # [B] (CPU)
    starts = (torch.cumsum(lengths, 0) - lengths).tolist()
    meter = config.current_meter()

    def verify_group(rule: Rule, group: list[int]) -> FlatResult:
        flat = torch.cat(
            [torch.arange(starts[b], starts[b] + num_draft_tokens[b]) for b in group]
        ).to(device)  # [Ng]
        result = accept_flat(
            rule,
            draft_token_ids[flat],
            [num_draft_tokens[b] for b in group],
            target_probs[flat],
            None if draft_probs is None else draft_probs[flat],
            bonus_token_ids.reshape(-1)[group],
            width=max_spec_len + 1,
            generators=sampling_metadata.generators,
            rows=group,
            meter=meter,
        )
        output[group] = result.token_ids
        return result

    router.verify_groups(routing, verify_group, meter)
    return output
