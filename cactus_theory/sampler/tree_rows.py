"""The rows a tree rule is called on at a batch of nodes, packed to their support.

At R nodes with K children each, a tree rule reads q [R, V], the children's proposals
[R, K, V] (``core.trees.base.proposals``) and the children [R, K]. A rule that declares
``support_only`` gets the same decisions and laws when every token outside the node's
support (q > 0, or p > 0 for sampled children, or a child) is left out, so its rows are
packed to that support, in vocabulary order, right-padded with zero-mass columns
(``NodeRows.ids`` maps a packed column back to its token; the same packing as
``core.trees.law``). After top-k/top-p processing a support is a few dozen tokens, so the
walk and the meter work on [R, K, W] with W << V. A rule that does not declare it is
called on the full rows.

How the rule's methods see the rows: float64 tensors for a rule that declares
``array_api``, float64 numpy copies for any other (``sampler.rules.general.rows_for``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cactus_theory.core.trees.base import DETERMINISTIC, TreeRule, end_probs, proposals
from cactus_theory.sampler.divergences import kl_div
from cactus_theory.sampler.emit import inverse_cdf
from cactus_theory.sampler.rules.general import back, ids_for, rows_for

Tensor = torch.Tensor


@dataclass(frozen=True)
class NodeRows:
    """One group's rows: target [R, W] and proposals [R, K, W] (float64), children [R, K]
    (packed columns), ids [R, W] (the token of each packed column; None when unpacked)."""

    target: Tensor
    proposals: Tensor
    children: Tensor
    ids: Tensor | None

    def select(self, keep: Tensor) -> NodeRows:
        """The rows ``keep`` (bool [R] or indices)."""
        ids = None if self.ids is None else self.ids[keep]
        return NodeRows(self.target[keep], self.proposals[keep], self.children[keep], ids)

    def arguments(self, rule: TreeRule) -> tuple[object, object, object]:
        """(target, proposals, children) as ``rule``'s methods take them."""
        if getattr(rule, "array_api", False):
            return self.target, self.proposals, self.children
        target, proposal_rows = rows_for(rule, self.target, self.proposals)
        return target, proposal_rows, ids_for(rule, self.children)

    def tokens(self, columns: Tensor) -> Tensor:
        """[R] the tokens of packed ``columns`` [R]."""
        return columns if self.ids is None else self.ids.gather(1, columns[:, None])[:, 0]


def node_rows(
    rule: TreeRule,
    target_rows: Tensor,  # [R, V] q at the nodes
    draft_rows: Tensor | None,  # [R, V] p at the nodes (None: deterministic children)
    children: Tensor,  # [R, K] drafted ids
    scheme: str,
) -> NodeRows:
    """The ``NodeRows`` of a group of nodes (module docstring), in float64, each row
    renormalised (a float32 law is a law only to ~1e-7, and rules are held to laws)."""
    target = normalised(target_rows)
    draft = None if draft_rows is None or scheme == DETERMINISTIC else normalised(draft_rows)
    ids = None
    if getattr(rule, "support_only", False):
        target, draft, children, ids = _packed(target, draft, children)
    source = target if draft is None else draft
    return NodeRows(target, proposals(source, children, scheme), children, ids)


def normalised(rows: Tensor) -> Tensor:
    """[R, V] float64 rows divided by their sums."""
    values = rows.to(torch.float64)
    return values / values.sum(dim=-1, keepdim=True)


def _packed(target: Tensor, draft: Tensor | None, children: Tensor):
    """(target [R, W], draft [R, W] or None, children [R, K], ids [R, W]): each row's
    support in vocabulary order, zero-padded to the widest (W = V when nothing is cut)."""
    rows, vocab = target.shape
    keep = target > 0  # [R, V]
    if draft is not None:
        keep |= draft > 0
    keep.scatter_(1, children, True)
    width = int(keep.sum(dim=-1).max())
    if width >= vocab:
        return target, draft, children, None
    slot = torch.cumsum(keep, dim=-1) - 1  # [R, V] each kept token's column
    slot = torch.where(keep, slot, width)  # the rest go to a spare column, dropped below
    ids = torch.zeros(rows, width + 1, dtype=torch.int64, device=target.device)
    tokens = torch.arange(vocab, device=target.device).expand(rows, -1)
    ids.scatter_(1, slot, tokens)
    packed_target = torch.zeros(rows, width + 1, dtype=target.dtype, device=target.device)
    packed_target.scatter_(1, slot, torch.where(keep, target, 0.0))
    packed_draft = None
    if draft is not None:
        packed_draft = torch.zeros_like(packed_target)
        packed_draft.scatter_(1, slot, torch.where(keep, draft, 0.0))
        packed_draft = packed_draft[:, :width]
    return packed_target[:, :width], packed_draft, slot.gather(1, children), ids[:, :width]


def sibling_accepts(rule: TreeRule, rows: NodeRows) -> Tensor:
    """[R, K] float64 tensor: the rule's sequential acceptances."""
    return back(rule.sibling_accepts(*rows.arguments(rule)), rows.target, torch.float64)


def final_residual(rule: TreeRule, rows: NodeRows) -> Tensor:
    """[R, W] float64 tensor: the law emitted when every child is rejected."""
    residual = back(rule.final_residual(*rows.arguments(rule)), rows.target, torch.float64)
    return residual.clamp(min=0.0)


def draw(rows: NodeRows, law: Tensor, uniforms: Tensor) -> Tensor:
    """[R] tokens drawn by inverse CDF from ``law`` [R, W] (packed as ``rows``) with
    ``uniforms`` [R]."""
    return rows.tokens(inverse_cdf(law, uniforms))


def conditional_divergence(
    rows: NodeRows, accepts: Tensor, residual: Tensor
) -> tuple[Tensor, Tensor]:
    """(KL(e ‖ q) [R], TV(e, q) [R]) of the conditional law e = Σ_i P_i e_{x_i} + Π_j (1 −
    a_j) r of nodes with deterministic children (``core.trees.base.conditional_law``), from
    the rule's acceptances [R, K] and residual [R, W] already computed for the walk."""
    ends = end_probs(accepts)  # [R, K+1]
    law = residual / residual.sum(dim=-1, keepdim=True).clamp(min=1e-300)  # [R, W]
    law = law * ends[:, -1:]
    law = law.scatter_add(1, rows.children, ends[:, :-1])  # + Σ_i P_i e_{x_i}
    kl = kl_div(law, rows.target).sum(dim=-1)
    tv = 0.5 * (law - rows.target).abs().sum(dim=-1)
    return kl, tv
