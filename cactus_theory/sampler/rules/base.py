"""What a verify step asks of a rule, in torch: the twin of ``cactus_theory.core.rules.base``.

Generalised speculative sampling with target h (q = target, p = draft, n = drafted):

    accept n with probability   a_n = min(1, h_n / p_n)   (0 where p_n = 0);
    on rejection sample from    r = (h − p)_+ / Σ (h − p)_+   (h itself where that is 0).

``sampler.verify`` calls a rule's adapter twice per block:

- ``accept(target_probs, draft_probs, draft_ids, target_at, draft_at)`` returns
  (a [B, k], state). ``target_at``/``draft_at`` [B, k] are q_n and p_n gathered at the
  drafted ids; ``target_probs``/``draft_probs`` [B, k, V] are passed only to adapters with
  ``reads_rows`` (the others decide from q_n and p_n alone) and are None otherwise. The
  state holds per-position values the residual reuses (a tuple of [B, k] tensors, or None);
- for the rows that reject, one row per batch row at its first rejected position, in two
  parts: ``residual_plan(draft_id, target_at, state)`` computes the small per-row values
  once for the batch (parts [R]), and ``residual_rows(target_rows, draft_rows, plan)``
  returns the residual law [c, V] unnormalised (the inverse CDF scales by the row total),
  making the elementwise passes on a few rows at a time (on CPU one row, read through
  views, so its temporaries stay in cache). By default ``residual_rows`` calls
  ``residual(target_row, draft_row, draft_id, state)`` with the plan unpacked (target and
  decision rules define that); branch rules define ``residual_rows`` itself.

``targets(target_probs, draft_probs, draft_ids)`` gives h at every position, [B, k, V]: the
dense reference path and the tests use it; the fast path never builds it.

Families, as in the numpy core: ``TorchTargetRule`` (h independent of n), ``TorchBranchRule``
(h raises n to γ_n and scales the rest of q), ``TorchDecisionRule`` (deterministic
acceptance, fixed recovery law). Adapters read their parameters from the numpy rule.
"""

from __future__ import annotations

import torch

from cactus_theory.core.rules.base import Rule

Tensor = torch.Tensor
#: Per-position values ``accept`` hands to ``residual``: a tuple of [B, k] tensors, or None.
State = tuple[Tensor, ...] | None
#: Per-row values ``residual_rows`` reads: a tuple of [R] tensors, the drafted id first.
Plan = tuple[Tensor, ...]


def gsps_accept(adjusted_mass: Tensor, draft_mass: Tensor) -> Tensor:
    """a = min(1, h_n / p_n), and 0 where p_n = 0 (such a token is rejected, as in vLLM)."""
    safe = torch.where(draft_mass > 0, draft_mass, torch.ones_like(draft_mass))
    ratio = torch.where(draft_mass > 0, adjusted_mass / safe, torch.zeros_like(draft_mass))
    return torch.clamp(ratio, max=1.0)


def gsps_residual(adjusted: Tensor, draft_probs: Tensor) -> Tensor:
    """(h − p)_+ over the last axis, or h itself where that is all zero (then h = p).

    Unnormalised: the sampler's inverse CDF scales its uniform by the row total. Two
    passes over [..., V] (difference and clamp in place, then the sum that detects empty
    rows); h is copied in only when some row is empty (rare).
    """
    excess = torch.sub(adjusted, draft_probs).clamp_(min=0.0)  # [..., V]
    empty = excess.sum(dim=-1, keepdim=True) <= 0  # [..., 1]
    if bool(empty.any().item()):
        excess = torch.where(empty, adjusted, excess)
    return excess


class TorchRule:
    """The torch adapter of one numpy rule (see the module docstring for the protocol)."""

    #: True when acceptance needs whole rows [B, k, V], not only q_n and p_n.
    reads_rows = False

    def __init__(self, rule: Rule) -> None:
        self.rule = rule

    def accept(
        self,
        target_probs: Tensor | None,
        draft_probs: Tensor | None,
        draft_ids: Tensor,
        target_at: Tensor,
        draft_at: Tensor,
    ) -> tuple[Tensor, State]:
        raise NotImplementedError

    def residual(
        self, target_row: Tensor, draft_row: Tensor, draft_id: Tensor, state: State
    ) -> Tensor:
        raise NotImplementedError

    def residual_plan(self, draft_id: Tensor, target_at: Tensor, state: State) -> Plan:
        """Per-row values the residual of each emitting row needs, all [R]: computed once
        for the batch (small work) before ``residual_rows`` runs row by row. The default
        plan is (draft_id, *state)."""
        return (draft_id,) + (() if state is None else tuple(state))

    def residual_rows(self, target_rows: Tensor, draft_rows: Tensor, plan: Plan) -> Tensor:
        """The residual [c, V] (unnormalised) of rows [c, V] from their slice of the plan
        (parts [c]): ``residual`` with the plan unpacked."""
        state = plan[1:] if len(plan) > 1 else None
        return self.residual(target_rows, draft_rows, plan[0], state)

    def targets(self, target_probs: Tensor, draft_probs: Tensor, draft_ids: Tensor) -> Tensor:
        raise ValueError(f"rule: {self.rule.name} is a decision rule; it has no target h")

    def output_law(self, target_probs: Tensor, draft_probs: Tensor) -> Tensor:
        """The exact law [R, V] of the emitted token for float64 rows [R, V]
        (``sampler.law``; the decoder's divergence meter)."""
        raise NotImplementedError


class TorchTargetRule(TorchRule):
    """h independent of the drafted token (sps, interp, frontier, pareto): the emitted law
    is h itself. Subclasses give h on rows (``target_law``) and at the drafted ids
    (``target_at``); rules whose h needs a per-row solve do it in ``solve``."""

    def solve(self, target_probs: Tensor, draft_probs: Tensor) -> State:
        """Per-row constants of h for rows [..., V] (None when h needs none)."""
        return None

    def target_law(self, target_probs: Tensor, draft_probs: Tensor, state: State) -> Tensor:
        """h [..., V] for rows [..., V] and their ``solve`` state (parts shaped [...])."""
        raise NotImplementedError

    def adjusted_at(self, target_at: Tensor, draft_at: Tensor, state: State) -> Tensor:
        """h_n [...] from q_n, p_n [...] and the state of their rows: h of one-column rows."""
        return self.target_law(target_at[..., None], draft_at[..., None], state)[..., 0]

    def accept(self, target_probs, draft_probs, draft_ids, target_at, draft_at):
        state = self.solve(target_probs, draft_probs) if self.reads_rows else None
        return gsps_accept(self.adjusted_at(target_at, draft_at, state), draft_at), state

    def residual(self, target_row, draft_row, draft_id, state):
        return gsps_residual(self.target_law(target_row, draft_row, state), draft_row)

    def targets(self, target_probs, draft_probs, draft_ids):
        return self.target_law(target_probs, draft_probs, self.solve(target_probs, draft_probs))

    def output_law(self, target_probs, draft_probs):
        return self.targets(target_probs, draft_probs, None)  # out = h


def branch_scale(raised: Tensor, target_mass: Tensor) -> Tensor:
    """s_n = (1 − γ_n)/(1 − q_n); 1 when q_n = 1 (then h = q), as the numpy ``branch_scale``."""
    below_one = target_mass < 1.0
    spread = torch.where(below_one, 1.0 - target_mass, torch.ones_like(target_mass))
    return torch.where(below_one, (1.0 - raised) / spread, torch.ones_like(target_mass))


class TorchBranchRule(TorchRule):
    """h^n_n = γ_n, h^n_i = q_i (1 − γ_n)/(1 − q_n): decided from (q_n, p_n) alone.

    ``accept`` computes γ_n once for every position and hands it on as the state
    (raised [B, k]), so the residual never solves γ again: a = min(1, min(γ_n, p_n)/p_n).
    """

    def raised_mass(self, target_mass: Tensor, cap: Tensor | None = None) -> Tensor:
        """γ_n for q_n (elementwise, same dtype), or min(γ_n, cap)."""
        raise NotImplementedError

    def accept(self, target_probs, draft_probs, draft_ids, target_at, draft_at):
        raised = self.raised_mass(target_at)  # [B, k]
        return gsps_accept(torch.minimum(raised, draft_at), draft_at), (raised,)

    def residual_plan(self, draft_id, target_at, state):
        raised = self.raised_mass(target_at) if state is None else state[0]  # [R]
        return draft_id, raised, branch_scale(raised, target_at)

    def residual_rows(self, target_rows, draft_rows, plan):
        """(h − p)_+ with h = s q off n and γ at n, for rows [c, V] and plan parts [c]
        (ids, γ_n, s_n): one product and one in-place difference-and-clamp over [c, V];
        h itself on a row whose excess is all zero."""
        draft_id, raised, scale = plan
        index = draft_id[:, None]  # [c, 1]
        excess = torch.mul(target_rows, scale[:, None].to(target_rows.dtype))  # [c, V]
        excess.sub_(draft_rows).clamp_(min=0.0)
        at_id = (raised.to(target_rows.dtype)[:, None] - draft_rows.gather(-1, index)).clamp_(
            min=0.0
        )  # [c, 1]
        excess.scatter_(-1, index, at_id)
        empty = excess.sum(dim=-1, keepdim=True) <= 0  # [c, 1]
        if bool(empty.any().item()):
            adjusted = torch.mul(target_rows, scale[:, None].to(target_rows.dtype))  # [c, V]
            adjusted.scatter_(-1, index, raised.to(target_rows.dtype)[:, None])
            excess = torch.where(empty, adjusted, excess)
        return excess

    def targets(self, target_probs, draft_probs, draft_ids):
        return self.branch_targets(target_probs, draft_ids[..., None])

    def output_law(self, target_probs, draft_probs):
        from cactus_theory.sampler.law import branch_rule_law

        raised = self.raised_mass(target_probs, cap=draft_probs)
        return branch_rule_law(raised, target_probs, draft_probs)

    def branch_targets(self, target_probs: Tensor, index: Tensor) -> Tensor:
        """h^n [..., V] for the drafted ids ``index [..., 1]``: γ_n at n, s_n q elsewhere."""
        target_mass = target_probs.gather(-1, index)  # [..., 1]
        raised = self.raised_mass(target_mass)  # [..., 1]
        return (target_probs * branch_scale(raised, target_mass)).scatter_(-1, index, raised)


class TorchDecisionRule(TorchRule):
    """a ∈ {0, 1} from (q, n); rejection emits a recovery law that ignores the draft."""

    reads_rows = True

    def accept_mask(self, target_probs: Tensor, draft_ids: Tensor, target_at: Tensor) -> Tensor:
        """[B, k] bool: whether each drafted id is accepted (rows [B, k, V])."""
        raise NotImplementedError

    def recovery(self, target_row: Tensor) -> Tensor:
        """[R, V]: the (unnormalised) law emitted on rejection."""
        raise NotImplementedError

    def accept(self, target_probs, draft_probs, draft_ids, target_at, draft_at):
        mask = self.accept_mask(target_probs, draft_ids, target_at) & (draft_at > 0)
        return mask.to(target_at.dtype), None

    def residual(self, target_row, draft_row, draft_id, state):
        return self.recovery(target_row)

    def accept_rows(self, target_probs: Tensor) -> Tensor:
        """[R, V] bool: whether each token of the vocabulary would be accepted if drafted."""
        raise NotImplementedError

    def output_law(self, target_probs, draft_probs):
        """p ⊙ 1[accept] + P(reject) · recovery (recovery normalised)."""
        accepted = torch.where(self.accept_rows(target_probs), draft_probs, 0.0)  # [R, V]
        rejected = torch.clamp(
            draft_probs.sum(-1, keepdim=True) - accepted.sum(-1, keepdim=True), min=0.0
        )
        recovery = self.recovery(target_probs)
        recovery = recovery / recovery.sum(dim=-1, keepdim=True)
        return accepted + rejected * recovery


def one_hot_argmax(target_probs: Tensor) -> Tensor:
    """One-hot rows at argmax q (torch.argmax returns the first index on ties)."""
    index = torch.argmax(target_probs, dim=-1, keepdim=True)
    return torch.zeros_like(target_probs).scatter(-1, index, 1.0)
