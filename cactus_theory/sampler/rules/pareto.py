"""The pareto rule in torch (``cactus_theory.core.rules.pareto``): the source-level frontier.

h = clip(p, c q, c e^κ q) / Σ, with c in (0, 1] the root of S(c) = Σ_x clip(p_x, c q_x,
c e^κ q_x) = 1 per row. S is continuous and increasing in c, S(0) = 0 and S(1) >= 1, so
the root is bracketed by [0, 1]; it is found by bisection in float64 (geometric once the
bracket is away from 0, so a tiny c keeps its relative precision), keeping the side with
S(c) <= 1 as ``roots.feasible_root`` does in numpy, and h is divided by S(c).
"""

from __future__ import annotations

import math

import torch

from cactus_theory.sampler.rules.base import State, TorchTargetRule

Tensor = torch.Tensor

#: Bisection steps: 64 halve the bracket to an ulp near 1, the rest refine a small c.
BISECTION_STEPS = 128
#: Steps between host checks of convergence.
CHECK_EVERY = 8


def _clipped_sum(target_rows: Tensor, draft_rows: Tensor, scale: Tensor, ratio: float) -> Tensor:
    """S(c) = Σ_x clip(p_x, c q_x, c e^κ q_x) per row [R]."""
    low = scale[:, None] * target_rows  # [R, V]
    return torch.minimum(torch.maximum(draft_rows, low), ratio * low).sum(dim=-1)


def pareto_scale(target_rows: Tensor, draft_rows: Tensor, spread: float) -> tuple[Tensor, Tensor]:
    """(c, S(c)) per row of [R, V] (float64): the feasible-side root of S(c) = 1."""
    target = target_rows.to(torch.float64)
    draft = draft_rows.to(torch.float64)
    ratio = math.exp(min(spread, 700.0))
    rows = target.shape[0]
    low = torch.zeros(rows, dtype=torch.float64, device=target.device)
    high = torch.ones(rows, dtype=torch.float64, device=target.device)
    done = _clipped_sum(target, draft, high, ratio) <= 1.0  # c = 1 already feasible
    low = torch.where(done, high, low)
    tolerance = 4 * torch.finfo(torch.float64).eps
    for step in range(BISECTION_STEPS):
        geometric = (low > 0) & (high > 4.0 * low)
        middle = torch.where(geometric, torch.sqrt(low * high), 0.5 * (low + high))  # [R]
        within = _clipped_sum(target, draft, middle, ratio) <= 1.0
        low = torch.where(~done & within, middle, low)
        high = torch.where(~done & ~within, middle, high)
        done = done | (high - low <= tolerance * high)
        if step % CHECK_EVERY == CHECK_EVERY - 1 and bool(done.all().item()):
            break
    return low, _clipped_sum(target, draft, low, ratio)


class TorchPareto(TorchTargetRule):
    """h = clip(p, c q, c e^κ q) / Σ (reads whole rows to solve c per row)."""

    reads_rows = True

    def solve(self, target_probs: Tensor, draft_probs: Tensor) -> State:
        if self.rule.spread == 0:
            return None  # h = q
        vocab = target_probs.shape[-1]
        scale, total = pareto_scale(  # [R], [R]
            target_probs.reshape(-1, vocab), draft_probs.reshape(-1, vocab), self.rule.spread
        )
        batch_shape = target_probs.shape[:-1]
        return scale.reshape(batch_shape), total.reshape(batch_shape)

    def target_law(self, target_probs, draft_probs, state):
        if state is None:
            return target_probs
        scale, total = (part.to(target_probs.dtype)[..., None] for part in state)
        ratio = math.exp(min(self.rule.spread, 700.0))
        low = scale * target_probs  # [..., V]
        return torch.minimum(torch.maximum(draft_probs, low), ratio * low) / total
