"""Independent numpy references: slow, obvious versions of what the core computes fast.

Nothing here calls ``cactus_theory.gamma``, ``cactus_theory.law`` or the frontier solver;
the checks compare those against these references (and against cvxpy).

- ``bisect_raised_mass``: γ*(q_n, δ) by plain bisection on the binary divergence.
- ``structured_targets``: the per-branch h of Thm 2, h_n = γ, h_i = q_i (1 − γ)/(1 − q_n).
- ``gsps_law``: the law generalised SpS emits, enumerated over the drafted token:
  out = Σ_n p_n [a_n e_n + (1 − a_n) r^n], a_n = min(1, h^n_n / p_n),
  r^n = (h^n − p)_+ / Σ (h^n − p)_+ (h^n itself when that is all zero).
- ``enumerated_law``: the same enumeration driven by a rule's own per-token methods.
"""

from __future__ import annotations

import numpy as np

from cactus_theory import divergences
from cactus_theory.core.rules.base import Rule

Array = np.ndarray


def bisect_raised_mass(
    target_mass: Array, delta: float, divergence: str, steps: int = 200
) -> Array:
    """The largest γ in [q_n, 1] with D((γ, 1−γ) ‖ (q_n, 1−q_n)) <= δ, by bisection.

    Every binary divergence increases in γ on [q_n, 1], so the feasible set is an interval
    [q_n, γ*]; bisection keeps ``low`` feasible and ``high`` infeasible (or 1 when 1 is
    feasible). 200 halvings are far more than float64 needs (the loop stops early once the
    bracket cannot shrink).
    """
    q_n = np.asarray(target_mass, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        at_one = divergences.binary(divergence, np.ones_like(q_n), q_n)
    done = (at_one <= delta) | (q_n >= 1.0)
    low = np.where(done, 1.0, q_n)
    high = np.ones_like(q_n)
    for _ in range(steps):
        middle = 0.5 * (low + high)
        active = ~done & (middle > low) & (middle < high)
        if not np.any(active):
            break
        with np.errstate(divide="ignore", invalid="ignore"):
            feasible = divergences.binary(divergence, middle, q_n) <= delta
        low = np.where(active & feasible, middle, low)
        high = np.where(active & ~feasible, middle, high)
    return low


def structured_targets(target_probs: Array, tokens: Array, raised: Array) -> Array:
    """Rows h with h_n = γ and h_i = q_i (1 − γ)/(1 − q_n) for i ≠ n (Thm 2's form).

    ``target_probs [..., V]``, ``tokens [...]``, ``raised [...]``. When q_n = 1 the rest is 0.
    """
    index = np.asarray(tokens)[..., None]
    q_n = np.take_along_axis(target_probs, index, axis=-1)[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(q_n < 1.0, (1.0 - raised) / (1.0 - q_n), 0.0)
    rows = target_probs * scale[..., None]
    np.put_along_axis(rows, index, np.asarray(raised)[..., None], axis=-1)
    return rows


def gsps_law(adjusted: Array, draft_probs: Array) -> tuple[Array, Array]:
    """(emitted law [..., V], acceptance [...]) of generalised SpS, by enumeration.

    ``adjusted [..., V, V]``: row n is the target h^n used when n is drafted (the same row
    for every n gives plain generalised SpS against one h). ``draft_probs [..., V]``.
    """
    drafted = np.diagonal(adjusted, axis1=-2, axis2=-1)  # h^n_n
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        accept = np.where(draft_probs > 0, np.minimum(1.0, drafted / draft_probs), 0.0)
    excess = np.maximum(adjusted - draft_probs[..., None, :], 0.0)
    mass = excess.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        residual = np.where(mass > 0, excess / np.where(mass > 0, mass, 1.0), adjusted)
    rejected = draft_probs * (1.0 - accept)
    law = draft_probs * accept + np.einsum("...n,...nx->...x", rejected, residual)
    return law, (draft_probs * accept).sum(axis=-1)


def enumerated_law(rule: Rule, target_probs: Array, draft_probs: Array) -> tuple[Array, Array]:
    """(emitted law, acceptance) of ``rule``, enumerating drafted tokens with its own methods.

    Uses only ``accept_probs`` and ``residuals_for`` (not ``cactus_theory.law``):
    out = Σ_n p_n [a_n e_n + (1 − a_n) r^n]. Rows ``[..., V]``; cost O(V²) per row.
    """
    vocab_size = target_probs.shape[-1]
    accept = rule.accept_probs(target_probs, draft_probs)
    shape = target_probs.shape[:-1] + (vocab_size, vocab_size)
    every_target = np.broadcast_to(target_probs[..., None, :], shape).copy()
    every_draft = np.broadcast_to(draft_probs[..., None, :], shape).copy()
    tokens = np.broadcast_to(np.arange(vocab_size), shape[:-1]).copy()
    residual = rule.residuals_for(every_target, every_draft, tokens)
    rejected = draft_probs * (1.0 - accept)
    law = draft_probs * accept + np.einsum("...n,...nx->...x", rejected, residual)
    return law, (draft_probs * accept).sum(axis=-1)


def all_branch_targets(rule: Rule, target_probs: Array, draft_probs: Array) -> Array:
    """[..., V, V]: row n is the h the rule targets when n is drafted (batched)."""
    vocab_size = target_probs.shape[-1]
    shape = target_probs.shape[:-1] + (vocab_size, vocab_size)
    every_target = np.broadcast_to(target_probs[..., None, :], shape).copy()
    every_draft = np.broadcast_to(draft_probs[..., None, :], shape).copy()
    tokens = np.broadcast_to(np.arange(vocab_size), shape[:-1]).copy()
    return rule.targets_for(every_target, every_draft, tokens)
