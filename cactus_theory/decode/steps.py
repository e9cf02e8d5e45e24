"""The steps of one speculative iteration, in the order ``generate`` calls them, with the
loop state they share (``Active``, the rows still decoding).

    start      prefill both caches with each prompt but its last token;
    draft      sample k_b draft tokens per row from the draft's processed law p;
    verify     one verifier forward over [last, d_1..d_K]: q at K + 1 positions;
    sample     ``sampler.verify`` per group of rows sharing a rule: accepted drafts and
               the emitted token;
    measure    the divergence meter at the emitted verified positions;
    commit     accepted drafts and the emitted token, up to EOS or max_new_tokens;
    roll back  both caches keep only committed slots;
    retire     finished rows leave the batch.

Shapes: A active rows, K = max_b k_b drafts this step, V the vocabulary, H the hidden size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cactus_theory import sampler
from cactus_theory.core.rules.base import Rule
from cactus_theory.decode.cache import CachedModel, positions_of_prompt
from cactus_theory.decode.result import Progress
from cactus_theory.decode.settings import Prepared
from cactus_theory.sampler.divergence_meter import (
    StepDivergence,
    positions_below,
    step_divergence,
)
from cactus_theory.sampler.processors import process_logits
from cactus_theory.util.timing import Clock

Tensor = torch.Tensor


@dataclass
class Active:
    """The loop state of the rows still decoding (batch row i is original row rows[i])."""

    rows: Tensor  # [A] original row index
    last: Tensor  # [A] last committed token, in neither cache yet
    count: Tensor  # [A] committed tokens; ``last`` sits at position count − 1
    limit: Tensor  # [A] the last position a row may ever use (padding slots are clamped)

    def take(self, keep: Tensor) -> None:
        self.rows, self.last = self.rows[keep], self.last[keep]
        self.count, self.limit = self.count[keep], self.limit[keep]


def start(prepared: Prepared, target: CachedModel, drafter, clock: Clock) -> Active:
    """Prefill the verifier and the drafter (if any) with the prompts without their last
    token (a feature draft also gets the verifier's features there); the loop state."""
    ids, mask = prepared.input_ids, prepared.mask
    with clock("prefill"):
        if ids.shape[1] > 1:
            prefix, prefix_mask = ids[:, :-1], mask[:, :-1]  # [B, P-1]
            positions = positions_of_prompt(prefix_mask)
            wants_features = drafter is not None and drafter.needs_features
            output = target.forward(prefix, prefix_mask, positions, keep=1, hidden=wants_features)
            if drafter is not None:
                features = output[1] if wants_features else None  # [B, P-1, H]
                drafter.prefill(prefix, prefix_mask, positions, features)
    count = mask.sum(dim=1)  # [B]
    rows = torch.arange(ids.shape[0], device=prepared.device)
    return Active(rows, ids[:, -1], count, count + prepared.max_new_tokens - 1)


def uniforms(count: int, generator, device) -> Tensor:
    """``count`` float64 uniforms from ``generator`` (drawn on its device, or the CPU)."""
    draw_device = torch.device("cpu") if generator is None else generator.device
    drawn = torch.rand(count, generator=generator, dtype=torch.float64, device=draw_device)
    return drawn.to(device)


def draft_counts(progress: Progress, active: Active, k: int) -> Tensor:
    """k_b = min(k, tokens row b still needs − 1) [A]: the last token is always a plain
    verifier sample, as at batch 1."""
    remaining = torch.tensor([progress.remaining(row) for row in active.rows.tolist()])
    return (remaining - 1).clamp(0, k).to(active.rows.device)


def draft_tokens(
    drafter, active: Active, num_drafts: Tensor, prepared: Prepared
) -> tuple[Tensor, Tensor]:
    """Sample K = max k_b draft tokens per row (a row with k_b < K carries padding drafts
    past its own): (draft_ids [A, K], draft_probs [A, K, V], the laws they were drawn from)."""
    width = int(num_drafts.max())  # K
    if width == 0:
        rows, device = len(num_drafts), prepared.device
        empty_ids = torch.zeros(rows, 0, dtype=torch.int64, device=device)
        return empty_ids, torch.zeros(rows, 0, prepared.vocab, device=device)
    ids, laws = [], []
    logits = drafter.first(active.last, active.count, active.limit)  # [A, V]
    for position in range(width):
        law = process_logits(logits, prepared.processors)  # [A, V] the p the token is drawn from
        token = sampler.inverse_cdf(law, uniforms(len(law), prepared.generator, law.device))
        ids.append(token)
        laws.append(law)
        if position + 1 < width:
            positions = torch.minimum(active.count + position, active.limit)  # [A]
            logits = drafter.next(token, positions)  # [A, V]
    return torch.stack(ids, dim=1), torch.stack(laws, dim=1)


def verifier_forward(
    target: CachedModel,
    active: Active,
    draft_ids: Tensor,  # [A, K]
    prepared: Prepared,
    wants_features: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """One verifier forward over [last, d_1..d_K]: the processed laws q [A, K+1, V], and
    with ``wants_features`` the verifier's last hidden states there [A, K+1, H] (else
    None), which a feature draft reads."""
    block = torch.cat([active.last[:, None], draft_ids], dim=1)  # [A, K+1]
    offsets = torch.arange(block.shape[1], device=block.device)[None, :]  # [1, K+1]
    positions = torch.minimum((active.count - 1)[:, None] + offsets, active.limit[:, None])
    output = target.forward(block, torch.ones_like(block), positions, hidden=wants_features)
    logits, features = output if wants_features else (output, None)  # [A, K+1, V], [A, K+1, H]
    return process_logits(logits, prepared.processors), features


def sample(
    rules_per_row: list[Rule],
    target_probs: Tensor,  # [A, K+1, V]
    draft_probs: Tensor,  # [A, K, V]
    draft_ids: Tensor,  # [A, K]
    num_drafts: Tensor,  # [A]
    generator,
) -> tuple[Tensor, Tensor]:
    """``sampler.verify`` per group of rows sharing a rule: (tokens [A, K+1], accepted [A])."""
    rows_total, width = draft_ids.shape
    tokens = torch.full(
        (rows_total, width + 1), sampler.PAD_ID, dtype=torch.int64, device=draft_ids.device
    )
    accepted = torch.zeros(rows_total, dtype=torch.int64, device=draft_ids.device)
    for rule in dict.fromkeys(rules_per_row):
        rows = torch.tensor(
            [index for index, item in enumerate(rules_per_row) if item == rule],
            device=draft_ids.device,
        )
        if rows.numel() == rows_total:
            rows = slice(None)
        tokens[rows], accepted[rows] = sampler.verify(
            target_probs[rows],
            draft_probs[rows],
            draft_ids[rows],
            rule,
            generator=generator,
            check=False,
            num_drafts=num_drafts[rows],
        )
    return tokens, accepted


def measure(
    rules_per_row: list[Rule],
    target_probs: Tensor,  # [A, K+1, V]
    draft_probs: Tensor,  # [A, K, V]
    accepted: Tensor,  # [A]
    num_drafts: Tensor,  # [A]
) -> StepDivergence:
    """KL(μ ‖ q) and TV at each row's emitted verified positions i <= accepted, i < k_b."""
    emitted = torch.minimum(accepted + 1, num_drafts)  # [A] verified positions emitted
    rows, positions = positions_below(emitted, draft_probs.shape[1])
    return step_divergence(rules_per_row, target_probs, draft_probs, rows, positions)


def commit(
    progress: Progress,
    active: Active,
    tokens: Tensor,  # [A, K+1]
    accepted: Tensor,  # [A]
    num_drafts: Tensor,  # [A]
    measured: StepDivergence | None,
) -> list[float]:
    """Commit each row's accepted drafts and emitted token (with their KL and TV, 0 at a
    bonus or plain position); returns the KL each row realised."""
    token_lists, accepted_list = tokens.tolist(), accepted.tolist()
    drafts_list = num_drafts.tolist()
    kl_rows = measured.kl.tolist() if measured is not None else None
    tv_rows = measured.tv.tolist() if measured is not None else None
    realised = []
    for index, row in enumerate(active.rows.tolist()):
        emitted = accepted_list[index] + 1
        kl = tv = [0.0] * emitted
        if kl_rows is not None:  # position i is verified iff i < k_b
            kl = [kl_rows[index][i] if i < drafts_list[index] else 0.0 for i in range(emitted)]
            tv = [tv_rows[index][i] if i < drafts_list[index] else 0.0 for i in range(emitted)]
        kept = progress.commit(row, token_lists[index][:emitted], kl, tv)
        realised.append(math.fsum(kl[:kept]))
    emitted_tokens = tokens.gather(1, accepted[:, None])[:, 0]  # [A]
    active.count = active.count + accepted + 1
    active.last = emitted_tokens
    return realised


def rollback(
    target: CachedModel,
    drafter,
    draft_ids: Tensor,  # [A, K]
    accepted: Tensor,  # [A]
    active: Active,
    features: Tensor | None,  # [A, K+1, H] the verifier's, for a feature draft
) -> None:
    """Keep each row's committed slots in the verifier cache (last, d_1 .. d_a); the
    drafter keeps what its kind keeps (``cache.DraftCache.rollback``,
    ``cache.FeatureDraftCache.rollback``)."""
    offsets = torch.arange(draft_ids.shape[1] + 1, device=accepted.device)[None, :]  # [1, K+1]
    target.keep(offsets <= accepted[:, None])
    drafter.rollback(draft_ids, accepted, active.last, features)


def retire(progress: Progress, active: Active, models: list[CachedModel]) -> None:
    """Drop finished rows from the loop state and from every cache."""
    still = [index for index, row in enumerate(active.rows.tolist()) if not progress.finished[row]]
    if still and len(still) < active.rows.numel():
        keep = torch.tensor(still, device=active.rows.device)
        for model in models:
            model.select_rows(keep)
        active.take(keep)
