"""The per-sequence KL budget of the decoder (``speculative_generate(max_kl=...)``).

``KLBudget(rule, max_kl)`` caps Σ_t KL(μ_t ‖ q_t) of every row (the divergence meter's
per-row sum, ``cactus_theory.sampler.divergence_meter``) at ``max_kl`` nats, for any rule.
Before each verification it picks, per row, the first rule on a ladder whose *worst case*
this step, the sum of KL(μ_i ‖ q_i) over all the row's drafted positions i (as if every
token emitted were at a verified position), fits in what is left. What is realised is at
most that, so the cap holds surely, on every row.

The ladder comes from what the rule declares, never from its name: a rule with
``lossless_at`` (cactus, cactus-exact, frontier: δ = 0; sglang: thresholds 1) moves every
declared parameter halfway to its lossless value, 8 times (δ, δ/2, ..., δ/2^8); a rule
without one tries only itself. SpS, whose KL is exactly 0, ends every ladder.
"""

from __future__ import annotations

import torch

from cactus_theory.core.rules.base import Rule
from cactus_theory.core.rules.sps import SpS
from cactus_theory.sampler.divergence_meter import StepDivergence, divergence_at, positions_below

Tensor = torch.Tensor

#: Halvings of δ the budget tries before falling back to δ = 0 (SpS).
LADDER_HALVINGS = 8


class KLBudget:
    """Per-row δ so that every row's Σ KL(μ_t ‖ q_t) stays within ``max_kl`` (module
    docstring). ``spent`` [B] holds what each original row has realised so far."""

    def __init__(self, rule: Rule, max_kl: float, batch: int, device: torch.device) -> None:
        if isinstance(max_kl, bool) or not isinstance(max_kl, int | float) or not max_kl >= 0:
            raise ValueError(f"max_kl: must be a number >= 0 (nats per sequence), got {max_kl!r}")
        self.max_kl = float(max_kl)
        self.ladder = ladder(rule)
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
            fits = (worst[undecided] <= left[undecided]) | isinstance(rule, SpS)
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


def ladder(rule: Rule) -> list[Rule]:
    """The rules ``KLBudget`` tries in order (module docstring): ``rule``, then its declared
    parameters moved halfway to ``lossless_at`` ``LADDER_HALVINGS`` times, then SpS."""
    steps = [rule]
    lossless = getattr(rule, "lossless_at", None)
    params = rule.params()
    moving = {
        key: (float(params[key]), float(value))
        for key, value in (lossless or {}).items()
        if key in params and isinstance(params[key], int | float) and params[key] != value
    }
    if moving:
        for halving in range(1, LADDER_HALVINGS + 1):
            changes = {
                key: target + (start - target) / 2**halving
                for key, (start, target) in moving.items()
            }
            steps.append(rule.with_params(**changes))
    if not isinstance(rule, SpS):
        steps.append(SpS())  # KL exactly 0: always fits
    return steps
