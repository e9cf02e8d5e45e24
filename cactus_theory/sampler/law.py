"""The exact law of the emitted token in torch (float64), the twin of ``core/law.py``.

For one verification position with verifier row q and draft row p, the emitted token's law
is out = Σ_n p_n [a_n e_n + (1 − a_n) r^n]; every rule family has a closed form
(``core/law.py`` derives them):

- target rules (sps, interp, frontier, pareto): out = h;
- branch rules (cactus, cactus-exact): out_i = p_i a_i + q_i [Σ_n c_n (s_n − ρ_i)_+
  − c_i (s_i − ρ_i)_+] with ρ = p/q, s_n = (1 − γ_n)/(1 − q_n), c_n = p_n (1 − a_n)/Z_n,
  from two hinge sums over one merged sort per row (O(V log V));
- decision rules (tas, topk, greedy): out = p ⊙ 1[accept] + P(reject) · recovery.

Any other rule (a user's, an engine's) takes the law its torch adapter gives
(``sampler.rules.general``: the numpy ``law.output_law_rows``, closed form or general sum).

``emitted_divergence`` gives KL(out ‖ q) and TV(out, q) per row: the decoder's divergence
meter. For a rule that declares ``support_only`` it first packs each row to its support
(tokens where p or q is positive, in vocabulary order): such a rule never drafts or emits a
token with p = q = 0, and leaving it out changes no decision (top-k's k-th largest, TAS's
entropy, greedy's argmax are the same over the support), so under top-k/top-p processing
the rows shrink from V to a few dozen entries. A rule that does not declare it (its
decisions may read the vocabulary size, or the zeros) is metered on the full rows.
"""

from __future__ import annotations

import torch

from cactus_theory.core.rules.base import Rule
from cactus_theory.sampler.divergences import kl_div
from cactus_theory.sampler.rules import for_rule
from cactus_theory.sampler.rules.base import branch_scale

Tensor = torch.Tensor


def output_law(rule: Rule, target_probs: Tensor, draft_probs: Tensor) -> Tensor:
    """[..., V] float64: the exact law of the token emitted at one position.

    target_probs, draft_probs: [..., V] probability rows (validated upstream; the decoder
    passes its processed laws).
    """
    shape = target_probs.shape
    target = target_probs.reshape(-1, shape[-1]).to(torch.float64)  # [R, V]
    draft = draft_probs.reshape(-1, shape[-1]).to(torch.float64)  # [R, V]
    return for_rule(rule).output_law(target, draft).reshape(shape)


def support_rows(target_probs: Tensor, draft_probs: Tensor) -> tuple[Tensor, Tensor]:
    """(target [R, W], draft [R, W]): each row's tokens with q > 0 or p > 0, in vocabulary
    order, right-padded with zeros to W = the largest support (rows as given if W = V)."""
    rows, vocab = target_probs.shape
    support = (target_probs > 0) | (draft_probs > 0)  # [R, V]
    width = max(int(support.sum(dim=-1).max()), 1) if rows else 0
    if width >= vocab:
        return target_probs, draft_probs
    slot = torch.cumsum(support, dim=-1) - 1  # [R, V] position of each support token
    slot = torch.where(support, slot, 0)  # the rest add 0 to column 0
    packed_target = torch.zeros(rows, width, dtype=target_probs.dtype, device=target_probs.device)
    packed_draft = torch.zeros_like(packed_target)
    packed_target.scatter_add_(1, slot, torch.where(support, target_probs, 0.0))
    packed_draft.scatter_add_(1, slot, torch.where(support, draft_probs, 0.0))
    return packed_target, packed_draft


def emitted_divergence(
    rule: Rule, target_probs: Tensor, draft_probs: Tensor
) -> tuple[Tensor, Tensor]:
    """(KL(out ‖ q) [R], TV(out, q) [R]) in float64 for rows [R, V]; KL is +inf where the
    rule can emit a token q excludes (interp, top-k with k > 1, ...)."""
    target, draft = target_probs.to(torch.float64), draft_probs.to(torch.float64)
    if getattr(rule, "support_only", False):  # declared: padding changes nothing
        target, draft = support_rows(target, draft)
    emitted = for_rule(rule).output_law(target, draft)  # [R, W]
    kl = kl_div(emitted, target).sum(dim=-1)  # [R]
    tv = 0.5 * (emitted - target).abs().sum(dim=-1)  # [R]
    return kl, tv


def hinge_sums(
    thresholds: Tensor, weights: Tensor, weighted_thresholds: Tensor, queries: Tensor
) -> Tensor:
    """Σ_i w_i (x_j − t_i)_+ for every query x_j [R, V], per row, by one merged sort
    (``core.law.hinge_sums``); ``weighted_thresholds`` = w_i t_i (0 where t_i = +inf)."""
    rows, size = thresholds.shape
    keys = torch.cat([thresholds, queries], dim=-1)  # [R, 2V]
    order = torch.sort(keys, dim=-1, stable=True).indices  # [R, 2V]
    pad = torch.zeros_like(queries)
    cum_weights = torch.cumsum(torch.cat([weights, pad], -1).gather(-1, order), -1)  # [R, 2V]
    cum_products = torch.cumsum(torch.cat([weighted_thresholds, pad], -1).gather(-1, order), -1)
    position = torch.empty_like(order)  # [R, 2V] inverse permutation
    position.scatter_(-1, order, torch.arange(2 * size, device=keys.device).expand(rows, -1))
    at_query = position[:, size:]  # [R, V]
    below_weight = cum_weights.gather(-1, at_query)
    below_product = cum_products.gather(-1, at_query)
    return torch.clamp(queries * below_weight - below_product, min=0.0)


def branch_rule_law(raised: Tensor, target_probs: Tensor, draft_probs: Tensor) -> Tensor:
    """The emitted law [R, V] of a branch rule with raised masses γ [R, V] (may be capped
    at p), float64 (``core.law.branch_rule_law``)."""
    positive = target_probs > 0
    ratio = torch.where(positive, draft_probs / torch.where(positive, target_probs, 1.0), torch.inf)
    safe_draft = torch.where(draft_probs > 0, draft_probs, 1.0)
    accept = torch.where(draft_probs > 0, torch.clamp(raised / safe_draft, max=1.0), 0.0)
    scale = branch_scale(raised, target_probs)  # [R, V] s_n
    support = torch.isfinite(ratio)
    finite_ratio = torch.where(support, ratio, 0.0)
    weighted_ratio = torch.where(support, draft_probs, 0.0)
    own_hinge = torch.where(support, target_probs * torch.clamp(scale - finite_ratio, min=0.0), 0.0)
    residual_mass = hinge_sums(ratio, target_probs, weighted_ratio, scale) - own_hinge  # Z_n
    rejected = draft_probs * (1.0 - accept)  # p_n (1 − a_n)
    usable = (rejected > 0) & (residual_mass > 0)
    coeff = torch.where(usable, rejected / torch.where(usable, residual_mass, 1.0), 0.0)  # c_n
    spread = hinge_sums(-scale, coeff, -coeff * scale, -finite_ratio)  # Σ_n c_n (s_n − ρ_i)_+
    own = coeff * torch.clamp(scale - finite_ratio, min=0.0)
    from_rejections = torch.where(support, target_probs * torch.clamp(spread - own, min=0.0), 0.0)
    return draft_probs * accept + from_rejections
