"""The divergence meter: the exact KL(μ ‖ q) and TV(μ, q) of every emitted token, the
mathematics both engines (``cactus_theory.decode`` and ``cactus_theory.vllm``) read.

At a verified draft position the engine holds the draft row p the drafted token was
sampled from and the verifier row q after the same processors, so the law of the token
emitted there is exactly μ = ``output_law(rule, q, p)`` (``sampler.law``); at a bonus
position (every draft of the block accepted) and at a plain step (no draft) it is q. The
meter records KL(μ ‖ q) and TV(μ, q) for every generated token.

**What the per-row sums mean.** Let φ be the block phase (which positions are verified
draft positions and which are bonus or plain). By the chain rule,
Σ_t KL(μ_t ‖ q_t) summed over a row has expectation KL(P_rule ‖ Q) between the rule's law
of (text, φ) and the law Q that keeps the same phase dynamics but emits from q; Q's text
marginal is exactly the verifier's P_verifier. So the per-row sum is an unbiased estimate of
the sequence-level KL of (text, phase), and by the data-processing inequality an upper
bound (in expectation) on KL(P_rule ‖ P_verifier) of the text alone, with equality when no
position's law depends on the phase. For frontier every term is min(δ, KL(p‖q)) ≤ δ; for
sps every term is 0. The per-row sum of TVs bounds the sequence-level TV (coupling).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cactus_theory.core.rules.base import Rule
from cactus_theory.sampler.law import emitted_divergence

Tensor = torch.Tensor


def divergence_at(
    rule: Rule, target_probs: Tensor, draft_probs: Tensor, rows: Tensor, positions: Tensor
) -> tuple[Tensor, Tensor]:
    """(KL [R], TV [R]) of the emitted law at (rows [R], positions [R]) of target_probs
    [A, K+1, V] and draft_probs [A, K, V]; empty tensors for R = 0."""
    if rows.numel() == 0:
        empty = torch.zeros(0, dtype=torch.float64, device=target_probs.device)
        return empty, empty
    return emitted_divergence(rule, target_probs[rows, positions], draft_probs[rows, positions])


@dataclass
class StepDivergence:
    """KL(μ ‖ q) and TV(μ, q) at the positions of one verification, [A, K] (0 elsewhere),
    and the rule each row was verified with."""

    kl: Tensor
    tv: Tensor
    rules: list[Rule]


def positions_below(limit: Tensor, steps: int) -> tuple[Tensor, Tensor]:
    """(rows [R], positions [R]) of every position i < limit[b] of rows [A] x steps."""
    mask = torch.arange(steps, device=limit.device)[None, :] < limit[:, None]  # [A, K]
    rows, positions = torch.nonzero(mask, as_tuple=True)
    return rows, positions


def step_divergence(
    rules: list[Rule],
    target_probs: Tensor,  # [A, K+1, V]
    draft_probs: Tensor,  # [A, K, V]
    rows: Tensor,  # [R] batch rows
    positions: Tensor,  # [R] verified positions in those rows
) -> StepDivergence:
    """KL and TV at (rows, positions), row b verified with ``rules[b]`` (rows that share a
    rule are computed together)."""
    batch, steps = draft_probs.shape[:2]
    kl = torch.zeros(batch, steps, dtype=torch.float64, device=target_probs.device)
    tv = torch.zeros_like(kl)
    owner = [rules[row] for row in rows.tolist()]
    for rule in dict.fromkeys(owner):
        chosen = torch.tensor([item == rule for item in owner], dtype=torch.bool)
        picked_rows, picked = rows[chosen.to(rows.device)], positions[chosen.to(rows.device)]
        part_kl, part_tv = divergence_at(rule, target_probs, draft_probs, picked_rows, picked)
        kl[picked_rows, picked] = part_kl
        tv[picked_rows, picked] = part_tv
    return StepDivergence(kl, tv, rules)
