"""The divergence meter and the per-sequence KL budget.

At a verified draft position the decoder holds the draft row p the drafted token was
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

**The budget.** ``KLBudget(rule, max_kl)`` caps Σ_t KL(μ_t ‖ q_t) of every row at
``max_kl`` nats, for rules with a δ (cactus, cactus-exact, frontier). Before each
verification it picks, per row, the largest δ on a ladder (δ, δ/2, ..., δ/2^8, then SpS,
whose KL is exactly 0) whose *worst case* this step, the sum of KL(μ_i ‖ q_i) over all the
row's drafted positions i (as if every token emitted were at a verified position), fits in
what is left. What is realised is at most that, so the cap holds surely, on every row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cactus_theory.core import rules as rules_module
from cactus_theory.core.rules.base import Rule
from cactus_theory.sampler.law import emitted_divergence

Tensor = torch.Tensor

#: Halvings of δ the budget tries before falling back to δ = 0 (SpS).
LADDER_HALVINGS = 8


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


class KLBudget:
    """Per-row δ so that every row's Σ KL(μ_t ‖ q_t) stays within ``max_kl`` (module
    docstring). ``spent`` [B] holds what each original row has realised so far."""

    def __init__(self, rule: Rule, max_kl: float, batch: int, device: torch.device) -> None:
        if "delta" not in rule.params():
            raise ValueError(
                f"max_kl: rule {rule.name!r} has no δ to adjust; use cactus, cactus-exact "
                "or frontier"
            )
        if isinstance(max_kl, bool) or not isinstance(max_kl, int | float) or not max_kl >= 0:
            raise ValueError(f"max_kl: must be a number >= 0 (nats per sequence), got {max_kl!r}")
        self.max_kl = float(max_kl)
        delta = rule.params()["delta"]
        params = {key: value for key, value in rule.params().items() if key != "delta"}
        ladder = [delta / 2**j for j in range(LADDER_HALVINGS + 1)]
        self.ladder = [rules_module.make(rule.name, delta=value, **params) for value in ladder]
        self.ladder.append(rules_module.make("sps"))  # KL exactly 0: always fits
        self.spent = torch.zeros(batch, dtype=torch.float64, device=device)

    def choose(
        self, active: Tensor, target_probs: Tensor, draft_probs: Tensor, num_drafts: Tensor
    ) -> StepDivergence:
        """The rule of each active row (original rows ``active`` [A]) and the divergences
        at its drafted positions under that rule."""
        batch, steps = draft_probs.shape[:2]
        left = self.max_kl - self.spent[active]  # [A]
        chosen: list[Rule | None] = [None] * batch
        kl = torch.zeros(batch, steps, dtype=torch.float64, device=target_probs.device)
        tv = torch.zeros_like(kl)
        undecided = torch.arange(batch, device=target_probs.device)  # [U]
        for rule in self.ladder:
            rows, positions = positions_below(num_drafts[undecided], steps)
            rows = undecided[rows]
            part_kl, part_tv = divergence_at(rule, target_probs, draft_probs, rows, positions)
            worst = torch.zeros(batch, dtype=torch.float64, device=kl.device)
            worst.index_add_(0, rows, part_kl)
            fits = (worst[undecided] <= left[undecided]) | (rule.name == "sps")
            taken = undecided[fits]
            if taken.numel():
                keep = torch.isin(rows, taken)
                kl[rows[keep], positions[keep]] = part_kl[keep]
                tv[rows[keep], positions[keep]] = part_tv[keep]
                for row in taken.tolist():
                    chosen[row] = rule
            undecided = undecided[~fits]
            if undecided.numel() == 0:
                break
        return StepDivergence(kl, tv, chosen)  # type: ignore[arg-type]

    def spend(self, active: Tensor, realised: Tensor) -> None:
        """Add each active row's realised KL this step (``realised`` [A])."""
        self.spent[active] += realised
