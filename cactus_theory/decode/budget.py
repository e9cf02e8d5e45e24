"""The per-sequence KL budget of the decoder (``speculative_generate(max_kl=...)``).

``KLBudget(rule, max_kl)`` caps Σ_t KL(μ_t ‖ q_t) of every row (the divergence meter's
per-row sum, ``cactus_theory.sampler.divergence_meter``) at ``max_kl`` nats, for rules with a δ
(cactus, cactus-exact, frontier). Before each verification it picks, per row, the largest δ
on a ladder (δ, δ/2, ..., δ/2^8, then SpS, whose KL is exactly 0) whose *worst case* this
step, the sum of KL(μ_i ‖ q_i) over all the row's drafted positions i (as if every token
emitted were at a verified position), fits in what is left. What is realised is at most
that, so the cap holds surely, on every row.
"""

from __future__ import annotations

import torch

from cactus_theory.core import rules as rules_module
from cactus_theory.core.rules.base import Rule
from cactus_theory.sampler.divergence_meter import StepDivergence, divergence_at, positions_below

Tensor = torch.Tensor

#: Halvings of δ the budget tries before falling back to δ = 0 (SpS).
LADDER_HALVINGS = 8


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
