"""The tree verify step in torch: walk a batch of drafted trees from their roots with any
tree rule.

``verify_tree(target_probs, draft_probs, parents, tokens, rule, scheme)`` is the torch twin
of the numpy reference ``cactus_theory.core.trees.verify.verify_tree`` (the tree layout and
the walk are described there) and makes the same decisions from the same uniforms:

- at depth d every row still walking sits at one node; the rows are grouped by the number
  K of children there (one rule call per group, over [R, K, V]); the rule's sequential
  acceptances a [R, K] and ``base.decide`` with ``decide_uniforms[:, d]`` pick the child
  or reject them all;
- a row that rejects every child emits from the rule's residual, a row at a node without
  children emits the bonus token from q there; both by inverse CDF with
  ``sample_uniforms`` (``sampler.emit``).

So the Python loop runs over depths and groups, never over nodes or rows.

**Rules on tensors.** A tree rule that declares ``array_api`` gets float64 tensors on the
rows' device; any other gets float64 numpy copies and its results come back as tensors
(``sampler.rules.general.rows_for``), as chain rules do; a rule that declares
``support_only`` gets its rows packed to each node's support (``sampler.tree_rows``).
Decisions compare float64 acceptances with float64 uniforms, so on float64 inputs they
are the reference's (up to rounding where packing shortens a sum).

**Uniforms.** ``uniforms=(decide_uniforms [B, D], sample_uniforms [B])``, or one tensor
U = rand(B, D+1) (float64) from ``generator``: U[:, :D] decide, U[:, D] samples (the
chain's layout: a chain is the tree with one child per node).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cactus_theory.core.trees.base import DETERMINISTIC, SCHEMES, TreeRule, decide
from cactus_theory.core.verify import PAD_ID
from cactus_theory.sampler.checks import check_probs, probs_tensor, uniforms_for
from cactus_theory.sampler.emit import inverse_cdf
from cactus_theory.sampler.tree_rows import (
    conditional_divergence,
    draw,
    final_residual,
    node_rows,
    sibling_accepts,
)
from cactus_theory.sampler.tree_structure import TreeStructure

Tensor = torch.Tensor


@dataclass(frozen=True)
class TreeWalk:
    """What one tree verification decided, per row.

    token_ids [B, D+1]: the accepted tokens in path order, the emitted token, then −1.
    num_accepted [B]: accepted drafts (the path's length below the root).
    path [B, D+1]: node indices visited from the root (0), −1 after the last.
    outcomes [B, D]: at the node visited at depth d, the rank of the accepted child, or its
    number of children when all were rejected; −1 where the walk did not reach depth d or
    the node there had no children.
    num_children [B, D]: the children of the node visited at depth d (0 where not reached
    or a leaf).
    kl, tv [B, D] (with ``measure``): KL(e ‖ q) and TV(e, q) of the token emitted at each
    depth (``sampler.tree_meter``: 0 at a leaf and past the path); None otherwise.
    """

    token_ids: Tensor
    num_accepted: Tensor
    path: Tensor
    outcomes: Tensor
    num_children: Tensor
    kl: Tensor | None = None
    tv: Tensor | None = None


def check_tree_inputs(
    target_probs: Tensor, draft_probs: Tensor | None, tokens: Tensor, structure: TreeStructure
) -> None:
    """Shapes always; values (ValueError naming the argument) for ``check=True``."""
    probs_tensor("target_probs", target_probs, 3)
    batch, nodes, vocab = target_probs.shape
    if structure.parents.shape != (batch, nodes):
        raise ValueError(f"parents: expected [B, N+1] = {(batch, nodes)}, got "
                         f"{tuple(structure.parents.shape)}")  # fmt: skip
    if tokens.shape != (batch, nodes) or tokens.dtype.is_floating_point:
        raise ValueError(f"tokens: expected integer ids [B, N+1] = {(batch, nodes)}")
    if draft_probs is not None:
        probs_tensor("draft_probs", draft_probs, 3)
        if draft_probs.shape != target_probs.shape:
            raise ValueError("draft_probs: expected the shape of target_probs [B, N+1, V]")
    drafted = structure.parents >= 0
    if bool((drafted & ((tokens < 0) | (tokens >= vocab))).any()):
        raise ValueError(f"tokens: drafted ids must lie in [0, {vocab})")


def tree_uniforms(
    uniforms: tuple[Tensor, Tensor] | None,
    generator: torch.Generator | None,
    batch: int,
    levels: int,
    device: torch.device,
    check: bool,
) -> tuple[Tensor, Tensor]:
    """(decide_uniforms [B, D], sample_uniforms [B]) float64 on ``device``: the given pair
    (decide_uniforms may be wider than D: its first D columns are used) or drawn from
    ``generator`` as ``sampler.checks.uniforms_for`` draws them."""
    if uniforms is None:
        return uniforms_for(None, generator, batch, levels, device, check)
    if generator is not None:
        raise ValueError("uniforms: pass either uniforms or generator, not both")
    if not isinstance(uniforms, tuple | list) or len(uniforms) != 2:
        raise ValueError("uniforms: expected a pair (decide_uniforms [B, D], sample_uniforms [B])")
    decide_u, sample_u = uniforms
    for name, value, ndim in (("decide_uniforms", decide_u, 2), ("sample_uniforms", sample_u, 1)):
        if not isinstance(value, torch.Tensor) or not value.dtype.is_floating_point:
            raise ValueError(f"{name}: expected a float tensor")
        if value.ndim != ndim or value.shape[0] != batch:
            raise ValueError(f"{name}: expected {ndim} axes and {batch} rows, got "
                             f"{tuple(value.shape)}")  # fmt: skip
        if check and value.numel() and not bool(((value >= 0) & (value < 1)).all()):
            raise ValueError(f"{name}: values must lie in [0, 1) (and not be NaN)")
    if decide_u.shape[1] < levels:
        raise ValueError(f"decide_uniforms: expected at least {levels} columns (one per depth), "
                         f"got {decide_u.shape[1]}")  # fmt: skip
    return decide_u[:, :levels].to(device, torch.float64), sample_u.to(device, torch.float64)


def verify_tree(
    target_probs: Tensor,
    draft_probs: Tensor | None,
    parents: Tensor | TreeStructure,
    tokens: Tensor,
    rule: TreeRule,
    scheme: str = DETERMINISTIC,
    generator: torch.Generator | None = None,
    uniforms: tuple[Tensor, Tensor] | None = None,
    check: bool = True,
    measure: bool = False,
) -> TreeWalk:
    """Walk every row's tree (module docstring); returns a ``TreeWalk``.

    Parameters
    ----------
    target_probs : [B, N+1, V] verifier laws q at every node (after the processors).
    draft_probs : [B, N+1, V] the draft laws p each node's children were drawn from, or
        None for deterministic children (the rule never reads p then).
    parents : [B, N+1] parent indices (``core.trees.verify`` layout), or their
        ``TreeStructure`` when the caller has it already.
    tokens : [B, N+1] drafted ids (column 0, the root, is not read).
    rule : a ``core.trees.base.TreeRule``.
    scheme : how the children were drafted (``core.trees.base.SCHEMES``).
    generator, uniforms : the randomness (module docstring).
    check : validate the probabilities and ids (shapes are always checked).
    measure : also give the divergence meter's KL and TV of every emitted token
        (``sampler.tree_meter``): from the acceptances and residuals the walk computes, at
        no extra rule call for deterministic children; 0 for a rule that declares
        ``lossless``; a ValueError naming ``divergence`` for sampled children of any other.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme: expected one of {', '.join(SCHEMES)}, got {scheme!r}")
    if not isinstance(rule, TreeRule):
        raise ValueError(f"rule: expected a tree rule, got {type(rule).__name__}")
    if scheme not in rule.schemes:
        raise ValueError(f"scheme: {rule.label} is not defined for {scheme} children")
    if draft_probs is None and scheme != DETERMINISTIC:
        raise ValueError(f"draft_probs: sampled children ({scheme}) need the draft's laws")
    lossless = bool(getattr(rule, "lossless", False))
    if measure and scheme != DETERMINISTIC and not lossless:
        raise ValueError(
            f"divergence: the exact law of {rule.label} with {scheme} children is an "
            "expectation over the drafted tuples; the meter does not compute it"
        )
    structure = parents if isinstance(parents, TreeStructure) else TreeStructure.of(parents)
    check_tree_inputs(target_probs, draft_probs, tokens, structure)
    if check:
        check_probs("target_probs", target_probs)
        if draft_probs is not None:
            check_probs("draft_probs", draft_probs)
    batch, _, vocab = target_probs.shape
    device = target_probs.device
    levels = structure.levels
    decide_u, sample_u = tree_uniforms(uniforms, generator, batch, levels, device, check)
    tokens = tokens.to(torch.int64)

    rows_all = torch.arange(batch, device=device)
    path = torch.full((batch, levels + 1), -1, dtype=torch.int64, device=device)
    path[:, 0] = 0
    outcomes = torch.full((batch, levels), -1, dtype=torch.int64, device=device)
    counts = torch.zeros(batch, levels, dtype=torch.int64, device=device)
    emitted = torch.zeros(batch, dtype=torch.int64, device=device)  # [B]
    kl = torch.zeros(batch, levels, dtype=torch.float64, device=device) if measure else None
    tv = torch.zeros_like(kl) if measure else None
    laws = measure and not lossless  # lossless: every emitted law is q
    node = torch.zeros(batch, dtype=torch.int64, device=device)  # [B] current node
    walking = torch.ones(batch, dtype=torch.bool, device=device)  # [B]
    accepted = torch.zeros(batch, dtype=torch.int64, device=device)  # [B]
    for depth in range(levels + 1):
        width = structure.num_children[rows_all, node]  # [B] children of the current node
        leaf = rows_all[walking & (width == 0)]
        if leaf.numel():  # bonus: q at the node
            bonus = target_probs[leaf, node[leaf]].to(torch.float64)  # [L, V]
            emitted[leaf] = inverse_cdf(bonus, sample_u[leaf])
            walking[leaf] = False
        if depth == levels or not bool(walking.any()):
            break
        counts[walking, depth] = width[walking]
        for size in torch.unique(width[walking]).tolist():
            rows = rows_all[walking & (width == size)]  # [R]
            kids = structure.children[rows, node[rows], :size]  # [R, K] node indices
            drafted = tokens[rows].gather(1, kids)  # [R, K] ids
            draft_rows = None
            if draft_probs is not None and scheme != DETERMINISTIC:
                draft_rows = draft_probs[rows, node[rows]]  # [R, V]
            group = node_rows(rule, target_probs[rows, node[rows]], draft_rows, drafted, scheme)
            accepts = sibling_accepts(rule, group)  # [R, K]
            outcome = decide(accepts, decide_u[rows, depth])  # [R]
            outcomes[rows, depth] = outcome
            moved = outcome < size  # [R]
            if laws:  # the meter: every visited node's conditional law (deterministic)
                residual = final_residual(rule, group)  # [R, W]
                kl[rows, depth], tv[rows, depth] = conditional_divergence(group, accepts, residual)
            if not bool(moved.all()):  # every child rejected: the residual
                stopped = group.select(~moved)
                if laws:
                    residual_rows = residual[~moved]
                else:
                    residual_rows = final_residual(rule, stopped)  # [S, W]
                emitted[rows[~moved]] = draw(stopped, residual_rows, sample_u[rows[~moved]])
                walking[rows[~moved]] = False
            advanced = rows[moved]
            if advanced.numel():
                node[advanced] = kids[moved].gather(1, outcome[moved][:, None])[:, 0]
                accepted[advanced] += 1
                path[advanced, depth + 1] = node[advanced]
    token_ids = torch.full((batch, levels + 1), PAD_ID, dtype=torch.int64, device=device)
    on_path = path[:, 1:] >= 0  # [B, D]
    token_ids[:, :levels] = torch.where(on_path, tokens.gather(1, path[:, 1:].clamp(min=0)), PAD_ID)
    token_ids.scatter_(1, accepted[:, None], emitted[:, None])
    return TreeWalk(token_ids, accepted, path, outcomes, counts, kl, tv)
