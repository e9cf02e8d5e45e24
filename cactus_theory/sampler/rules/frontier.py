"""The frontier rule in torch: the solves of ``cactus_theory.core.rules.frontier``, batched.

h = clip(p, c_lo q, c_hi q) with KL(h‖q) = δ (h = p when KL(p‖q) <= δ, h = q when δ = 0),
one h per row, independent of the drafted token, so the emitted law is h and within δ.
The numpy module's docstring derives the method. Per row:

0. the budget check KL(p‖q) <= δ (``fits_budget``): for float32 rows four passes over a
   cache-sized chunk (p/q, log, · p, sum), the correction Σ q − Σ p only near δ;
1. rows that need a solve and are long (V >= ``BINNED_MIN_VOCAB``) are bracketed on
   binned ratios (``frontier_binned.solve_binned``, no sort of the row); the rare row
   whose bracket fails takes step 2 on its whole row;
2. ``frontier_sorted.solve_caps`` (short rows, the solves of step 1, its fallback): sort
   the ratios, locate the root's segment, safeguarded Newton on it from the right, then
   ulps down until KL(h‖q) <= δ as computed; c_lo follows from Σ h = 1.

Sums and solves are float64; elementwise work over [V] stays in the rows' dtype.
"""

from __future__ import annotations

import math

import torch

from cactus_theory.sampler.divergences import kl_div
from cactus_theory.sampler.rules import frontier_binned, frontier_sorted
from cactus_theory.sampler.rules.base import State, TorchTargetRule

Tensor = torch.Tensor


#: Elements (rows × V) the frontier solve handles at once, by device type.
FRONTIER_CHUNK = {"cuda": 1 << 26, "cpu": 1 << 23}
#: Elements (rows × V) per chunk of the budget check KL(p‖q) <= δ, by device type: on CPU
#: a chunk's temporaries stay in cache.
CHECK_CHUNK = {"cuda": 1 << 26, "cpu": 1 << 16}
#: Rows at least this long are solved by bracketing on binned ratios (``frontier_binned``);
#: shorter ones by the sort of ``frontier_sorted.solve_caps`` directly.
BINNED_MIN_VOCAB = 4096
#: Rows whose Σ p log(p/q) lies within this of δ get the exact correction Σ q − Σ p
#: (rows passing the checks sum to 1 within 1e-4 in float32, 1e-2 in half precision).
CORRECTION_BAND = 0.05


def fits_budget(target_rows: Tensor, draft_rows: Tensor, delta: float) -> Tensor:
    """[R] bool: KL(p‖q) = Σ (p log(p/q) − p + q) <= δ for rows [R, V].

    float64 rows: Σ of the accurate terms ``kl_div`` (as the numpy reference). Other rows
    in their own dtype (float32), one row chunk at a time so that temporaries stay in
    cache: A = Σ p log(p/q) (quotient, log, product, pairwise sum: four passes; p = 0
    terms, NaN, left out; +inf where p > 0 = q), then the correction Σ q − Σ p (two more
    passes) only on rows with |A − δ| <= ``CORRECTION_BAND``: farther rows are decided
    by A alone. The float32 value is within ~1e-6 relative of the float64 one, which
    moves the decision (h = p or a solve, continuous in between) only for rows within
    that of the budget.
    """
    rows, vocab = target_rows.shape
    if target_rows.dtype == torch.float64:
        return kl_div(draft_rows, target_rows).sum(dim=-1) <= delta
    totals = torch.empty(rows, dtype=torch.float64, device=target_rows.device)  # [R]
    step = max(1, CHECK_CHUNK.get(target_rows.device.type, 1 << 26) // max(vocab, 1))
    for start in range(0, rows, step):
        target = target_rows[start : start + step]  # [c, V]
        draft = draft_rows[start : start + step]  # [c, V]
        terms = torch.div(draft, target).log_().mul_(draft)  # [c, V] p log(p/q)
        totals[start : start + step] = terms.nansum(dim=-1)
    near = ((totals - delta).abs() <= CORRECTION_BAND).nonzero(as_tuple=True)[0]  # [N]
    if near.numel():
        target, draft = target_rows[near], draft_rows[near]  # [N, V]
        totals[near] += (target.sum(dim=-1) - draft.sum(dim=-1)).to(torch.float64)
    return totals <= delta


def frontier_constants(
    target_rows: Tensor, draft_rows: Tensor, delta: float
) -> tuple[Tensor, Tensor]:
    """(c_lo, c_hi) per row of [R, V] (float64), the twin of ``rules.frontier_constants``.

    Rows with KL(p‖q) <= δ get (0, +inf) (h = p; ``fits_budget``); δ = 0 gives (1, 1) (h = q).
    The other rows are solved in chunks of ``FRONTIER_CHUNK`` elements to bound memory:
    by bracketing on binned ratios for V >= ``BINNED_MIN_VOCAB`` (``frontier_binned.solve_binned``),
    else by ``frontier_sorted.solve_caps`` on the whole sorted row.
    """
    rows, vocab = target_rows.shape
    device = target_rows.device
    lift = torch.ones(rows, dtype=torch.float64, device=device)  # [R]
    cap = torch.ones(rows, dtype=torch.float64, device=device)  # [R]
    if delta <= 0 or rows == 0:
        return lift, cap
    fits = fits_budget(target_rows, draft_rows, delta)  # [R]
    lift = torch.where(fits, 0.0, lift)
    cap = torch.where(fits, math.inf, cap)
    todo = (~fits).nonzero(as_tuple=True)[0]  # [S]
    step = max(1, FRONTIER_CHUNK.get(device.type, 1 << 23) // vocab)
    for start in range(0, todo.numel(), step):
        part = todo[start : start + step]  # [s]
        if vocab >= BINNED_MIN_VOCAB:
            target, draft = target_rows[part], draft_rows[part]  # [s, V]
            lift[part], cap[part] = frontier_binned.solve_binned(target, draft, delta)
        else:
            target = target_rows[part].to(torch.float64)  # [s, V]
            draft = draft_rows[part].to(torch.float64)  # [s, V]
            lift[part], cap[part] = frontier_sorted.solve_caps(
                target, draft, kl_div(draft, target), delta
            )
    return lift, cap


def frontier_target(target_probs: Tensor, draft_probs: Tensor, lift: Tensor, cap: Tensor) -> Tensor:
    """h = clip(p, c_lo q, c_hi q) with c_hi q read as 0 where q = 0 (constants broadcast).

    Not renormalised, as in ``rules.frontier_target``: the lift makes Σ h = 1 to rounding.
    """
    lower = lift[..., None].to(target_probs.dtype) * target_probs
    capped = cap[..., None].to(target_probs.dtype) * target_probs
    upper = torch.where(target_probs > 0, capped, torch.zeros_like(target_probs))
    return torch.minimum(torch.maximum(draft_probs, lower), upper)


class TorchFrontier(TorchTargetRule):
    """h = clip(p, c_lo q, c_hi q): whole rows are read to solve (c_lo, c_hi) per row."""

    reads_rows = True

    def solve(self, target_probs: Tensor, draft_probs: Tensor) -> State:
        if self.rule.delta == 0:
            return None  # h = q
        vocab = target_probs.shape[-1]
        lift, cap = frontier_constants(  # [R], [R]
            target_probs.reshape(-1, vocab), draft_probs.reshape(-1, vocab), self.rule.delta
        )
        batch_shape = target_probs.shape[:-1]
        return lift.reshape(batch_shape), cap.reshape(batch_shape)

    def target_law(self, target_probs, draft_probs, state):
        if state is None:
            return target_probs
        lift, cap = state
        return frontier_target(target_probs, draft_probs, lift, cap)
