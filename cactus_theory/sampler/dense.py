"""The reference-style verify step: h, acceptances and residuals over all [B, k, V].

This is how reference implementations (the Cactus paper's code among them) verify: build
h at every drafted position, then the acceptance and residual rows from it. It makes the
same decisions and tokens as ``sampler.verify`` (same formulas, same uniforms) and exists
as the benchmark's comparison point (``cactus bench sampler``: dense / ours) and as a
second implementation the tests hold the fast path against. Generalised-SpS rules only
(decision rules have no h).
"""

from __future__ import annotations

import torch

from cactus_theory.core.rules.base import Rule
from cactus_theory.sampler.checks import check_shapes, compute_dtype
from cactus_theory.sampler.rules import for_rule, gsps_accept, gsps_residual
from cactus_theory.sampler.verify_step import inverse_cdf, layout_tokens, rows_at

Tensor = torch.Tensor


def adjusted_targets_dense(
    rule: Rule, target_probs: Tensor, draft_probs: Tensor, ids: Tensor
) -> Tensor:
    """h at every drafted position, [B, k, V], from rows [B, k, V] and ids [B, k]."""
    return for_rule(rule).targets(target_probs, draft_probs, ids)


def verify_dense(
    target_probs: Tensor,
    draft_probs: Tensor,
    draft_ids: Tensor,
    rule: Rule,
    uniforms: tuple[Tensor, Tensor],
) -> tuple[Tensor, Tensor]:
    """(token_ids [B, k+1], num_accepted [B]) as ``sampler.verify``, materialising h.

    target_probs [B, k+1, V], draft_probs [B, k, V], draft_ids [B, k] (in range), uniforms
    (accept_uniforms [B, k], sample_uniforms [B]). No value checks.
    """
    target, draft, batch, steps, vocab = check_shapes(target_probs, draft_probs, draft_ids)
    dtype = compute_dtype(target.dtype)
    accept_u, sample_u = (u.to(target.device, torch.float64) for u in uniforms)
    ids = draft_ids.to(torch.int64)  # [B, k]
    block_target, block_draft = target[:, :steps].to(dtype), draft.to(dtype)  # [B, k, V]
    adjusted = adjusted_targets_dense(rule, block_target, block_draft, ids)  # [B, k, V]
    accept_all = gsps_accept(adjusted, block_draft)  # [B, k, V]
    residual_all = gsps_residual(adjusted, block_draft)  # [B, k, V]
    accept_probs = accept_all.gather(-1, ids[..., None])[..., 0]  # [B, k]
    accepted = accept_u < accept_probs.to(torch.float64)  # [B, k]
    num_accepted = torch.cumprod(accepted.to(torch.int64), dim=1).sum(dim=1)  # [B]
    stop = num_accepted.clamp(max=steps - 1)  # [B]
    bonus = target[:, steps].to(dtype)  # [B, V]
    emit_law = torch.where((num_accepted < steps)[:, None], rows_at(residual_all, stop), bonus)
    emitted = inverse_cdf(emit_law, sample_u)  # [B]
    return layout_tokens(ids, num_accepted, emitted), num_accepted
