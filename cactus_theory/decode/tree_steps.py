"""The steps of one tree iteration, in the order ``generate`` calls them (the loop state,
``steps.Active``, and the commit and retire steps are the chain's):

    limits      the depth each row may draft: k_b = min(D, tokens it still needs − 1);
    draft       ``tree_draft``: the draft expands its tree level by level;
    verify      one verifier forward over [root, nodes 1..N] under the tree mask: q at
                every node (and the verifier's features, for a feature draft);
    walk        ``sampler.verify_tree`` per group of rows sharing a rule: the accepted path
                and the emitted token;
    measure     ``sampler.tree_meter``: KL(e ‖ q) of every emitted token;
    commit      ``steps.commit`` with the path's tokens;
    compact     both caches keep the root and the accepted path and drop the rest.

Randomness comes from one stream per row (``RowStreams``), seeded once from the run's
generator in row order, so a row draws the same uniforms whatever else is in its batch:
decoding a batch with a seed gives each row the tokens it gets decoded alone, first in a
run with the same seed (or after the rows before it, with the same generator).

Shapes: A active rows, N drafted nodes, D the shape's depth, V the vocabulary, H the
verifier's hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cactus_theory import sampler
from cactus_theory.core.trees.base import TreeRule
from cactus_theory.decode.cache import CachedModel
from cactus_theory.decode.result import Progress
from cactus_theory.decode.settings import Prepared
from cactus_theory.decode.steps import Active
from cactus_theory.decode.tree_cache import forward_tree, keep_tail
from cactus_theory.decode.tree_draft import (
    DraftTree,
    draft_dynamic,
    draft_static,
    template_levels,
)
from cactus_theory.decode.tree_shape import TreeShape
from cactus_theory.sampler.divergence_meter import StepDivergence
from cactus_theory.sampler.processors import process_logits
from cactus_theory.sampler.tree_structure import TreeStructure, ancestors
from cactus_theory.sampler.tree_verify import TreeWalk

Tensor = torch.Tensor

#: Seeds of the rows' streams are drawn below this bound.
SEED_BOUND = 2**62


class RowStreams:
    """One CPU ``torch.Generator`` per original row, seeded from ``generator`` (or torch's
    default generator) in row order at the start of a run (module docstring)."""

    def __init__(self, generator: torch.Generator | None, batch: int, device) -> None:
        draw_device = torch.device("cpu") if generator is None else generator.device
        seeds = torch.randint(
            0, SEED_BOUND, (batch,), generator=generator, device=draw_device
        ).tolist()
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        self.device = device

    def draw(self, rows: Tensor, count: int, need: Tensor | None = None) -> Tensor:
        """[A, count] float64 uniforms on the run's device: row i draws ``count`` from the
        stream of original row ``rows[i]`` when ``need[i]`` (default all), else zeros
        (nothing drawn)."""
        wanted = [True] * len(rows) if need is None else need.tolist()
        values = torch.zeros(len(rows), count, dtype=torch.float64)
        for index, (row, take) in enumerate(zip(rows.tolist(), wanted, strict=True)):
            if take and count:
                values[index] = torch.rand(
                    count, generator=self.generators[row], dtype=torch.float64
                )
        return values.to(self.device)

    def walk_uniforms(self, rows: Tensor, depth: int) -> tuple[Tensor, Tensor]:
        """(decide_uniforms [A, D], sample_uniforms [A]) of a walk: D + 1 draws per row."""
        drawn = self.draw(rows, depth + 1)  # [A, D+1]
        return drawn[:, :depth], drawn[:, depth]


@dataclass(frozen=True)
class Plan:
    """A shape with what drafting it needs, computed once per run: a static template's
    levels (``tree_draft.template_levels``; None for a dynamic tree)."""

    shape: TreeShape
    levels: list | None


def plan(shape: TreeShape) -> Plan:
    """The ``Plan`` of a static or dynamic shape."""
    return Plan(shape, None if shape.dynamic else template_levels(shape))


def draft(drafter, active: Active, plan: Plan, scheme: str, limits: Tensor, prepared, streams):
    """The step's ``DraftTree``: a static template or a dynamic tree (``tree_draft``)."""
    if plan.levels is None:
        return draft_dynamic(drafter, active, plan.shape, limits, prepared)

    def draws(count: int, need: Tensor) -> Tensor:
        return streams.draw(active.rows, count, need)

    return draft_static(drafter, active, plan.shape, plan.levels, scheme, limits, prepared, draws)


def depth_limits(progress: Progress, active: Active, depth: int) -> Tensor:
    """k_b = min(D, tokens row b still needs − 1) [A]: a row's tree is cut at depth k_b,
    so its last token is a plain verifier sample, as at batch 1."""
    remaining = torch.tensor([progress.remaining(row) for row in active.rows.tolist()])
    return (remaining - 1).clamp(0, depth).to(active.rows.device)


def verify_forward(
    target: CachedModel,
    active: Active,
    tree: DraftTree,
    structure: TreeStructure,
    prepared: Prepared,
    wants_features: bool,
) -> tuple[Tensor, Tensor | None]:
    """One verifier forward over [root, nodes 1..N] under the tree mask: q [A, N+1, V]
    after the processors, and the last hidden states [A, N+1, H] with ``wants_features``
    (else None)."""
    visible = ancestors(structure.parents, structure.levels)  # [A, N+1, N+1]
    positions = torch.minimum(
        (active.count - 1)[:, None] + structure.depth, active.limit[:, None]
    )  # [A, N+1]
    output = forward_tree(target, tree.tokens, positions, visible, hidden=wants_features)
    logits, features = output if wants_features else (output, None)  # [A, N+1, V], [.., H]
    return process_logits(logits, prepared.processors), features


def walk(
    rules_per_row: list[TreeRule],
    target_probs: Tensor,  # [A, N+1, V]
    tree: DraftTree,
    structure: TreeStructure,
    scheme: str,
    uniforms: tuple[Tensor, Tensor],  # ([A, D], [A])
    measure: bool = False,
) -> TreeWalk:
    """``sampler.verify_tree`` per group of rows sharing a rule, merged into one walk (with
    ``measure``, the meter's KL and TV of every emitted token)."""
    batch = target_probs.shape[0]
    if len(set(rules_per_row)) == 1:  # one rule: no copies of the rows
        return sampler.verify_tree(
            target_probs, tree.draft_probs, structure, tree.tokens, rules_per_row[0], scheme,
            uniforms=uniforms, check=False, measure=measure,
        )  # fmt: skip
    walks = []
    for rule in dict.fromkeys(rules_per_row):
        rows = [index for index, item in enumerate(rules_per_row) if item == rule]
        index = torch.tensor(rows, device=target_probs.device)
        walks.append(
            (
                index,
                sampler.verify_tree(
                    target_probs[index],
                    None if tree.draft_probs is None else tree.draft_probs[index],
                    TreeStructure.of(tree.parents[index]),
                    tree.tokens[index],
                    rule,
                    scheme,
                    uniforms=(uniforms[0][index], uniforms[1][index]),
                    check=False,
                    measure=measure,
                ),
            )
        )
    return merge_walks(walks, batch, structure.levels, target_probs.device)


def measure(walked: TreeWalk, rules_per_row: list[TreeRule]) -> StepDivergence:
    """KL(e ‖ q) and TV at every depth of each row's walk [A, D], as the walk measured them
    (``verify_tree(measure=True)``; ``sampler.tree_meter``)."""
    return StepDivergence(walked.kl, walked.tv, rules_per_row)


def merge_walks(parts: list[tuple[Tensor, TreeWalk]], batch: int, levels: int, device) -> TreeWalk:
    """One ``TreeWalk`` [A, ...] from walks of row groups (their index [R] and walk),
    padded to the batch's depth D."""
    token_ids = torch.full((batch, levels + 1), -1, dtype=torch.int64, device=device)
    path = torch.full_like(token_ids, -1)
    outcomes = torch.full((batch, levels), -1, dtype=torch.int64, device=device)
    counts = torch.zeros_like(outcomes)
    accepted = torch.zeros(batch, dtype=torch.int64, device=device)
    measured = parts[0][1].kl is not None
    kl = torch.zeros(batch, levels, dtype=torch.float64, device=device) if measured else None
    tv = torch.zeros_like(kl) if measured else None
    for index, part in parts:
        width = part.token_ids.shape[1]
        token_ids[index, :width] = part.token_ids
        path[index, :width] = part.path
        outcomes[index, : width - 1] = part.outcomes
        counts[index, : width - 1] = part.num_children
        accepted[index] = part.num_accepted
        if measured:
            kl[index, : width - 1], tv[index, : width - 1] = part.kl, part.tv
    return TreeWalk(token_ids, accepted, path, outcomes, counts, kl, tv)


def compact(
    target: CachedModel,
    drafter,
    tree: DraftTree,
    result: TreeWalk,
    active: Active,
    features: Tensor | None,  # [A, N+1, H] the verifier's, for a feature draft
) -> None:
    """Both caches keep the root and the accepted path, in order, and drop the rest.

    The verifier keeps tail slots ``path`` (the root is slot 0 of its N + 1). A feature
    draft drops every tree slot and takes the path's tokens and the emitted token as
    pending, with the verifier's features at [root, path] (``FeatureDraftCache.rollback``).
    An independent draft keeps the path's nodes it was fed; the last accepted node, when it
    was never fed (a leaf), stays pending, as a chain's last draft does.
    """
    path = result.path  # [A, D+1]
    kept = result.num_accepted + 1  # [A]
    keep_tail(target, path.clamp(min=0), kept, tree.tokens.shape[1])
    drafted = torch.where(path[:, 1:] >= 0, tree.tokens.gather(1, path[:, 1:].clamp(min=0)), 0)
    if drafter.needs_features:
        path_features = features.gather(
            1, path.clamp(min=0)[..., None].expand(-1, -1, features.shape[-1])
        )  # [A, D+1, H]
        drafter.rollback(drafted, result.num_accepted, active.last, path_features)
        return
    if path.shape[1] == 1:  # nothing was drafted (every row emits its last token)
        return
    slots = tree.fed.gather(1, path[:, 1:].clamp(min=0))  # [A, D] draft tail slot per depth
    slots = torch.where(path[:, 1:] >= 0, slots, -1)
    was_fed = slots >= 0
    count = was_fed.sum(dim=1)  # [A] (fed path nodes are a prefix of the path)
    keep_tail(drafter, slots.clamp(min=0), count, tree.tail)
    last = (result.num_accepted - 1).clamp(min=0)  # [A] the last accepted node's depth − 1
    rows = torch.arange(len(last), device=last.device)
    drafter.pending = drafted[rows, last]
    drafter.has_pending = (result.num_accepted > 0) & ~was_fed[rows, last]
