"""Drafting a tree level by level: one draft forward per level over its whole frontier.

Level 0 is the drafter's ``first`` (its pending committed tokens and the root, the last
committed token: the draft's law after the root). At level d >= 1 the frontier (the nodes
at depth d whose children are wanted) goes through the draft in one forward under a tree
mask (``tree_cache.forward_tree``): each node sees the committed slots, its ancestors among
the tree slots fed at earlier levels, and itself; a feature draft feeds each node with its
parent's predicted feature (the root's is ``first``'s). Each frontier node's logits give
its children:

- deterministic: the draft's top-K by logit, which is the top-K of the processed law p
  with ties among p = 0 broken by the logits (the walk may accept a child with p = 0: a
  deterministic rule reads q only);
- sampled: child i by inverse CDF from its proposal π_i with a uniform of its own
  (``core.trees.sample.draft_children``; ``core.trees.base.proposals``): p (with
  replacement), p without the earlier children (without replacement), or SpecHub's pair
  (``hub``: x_1 ~ p, then the hub a = argmax p, or p without a when x_1 = a). Uniforms
  come from the row's own stream (``tree_steps.RowStreams``), so a row's tree does not
  depend on its batch.

Static templates (``tree_shape``) give each frontier node its number of children. A
dynamic tree (EAGLE-2) expands, at each level, the ``top`` candidates of the level with
the highest path log-probability under the draft's ranking law (softmax of the logits at
the sampling temperature, or 1 when greedy), each with its ``top`` best children; the
``budget`` best candidates overall form the tree (a child never scores above its parent,
and ties go to the earlier candidate, so the tree is closed under ancestors).

A row whose remaining tokens allow only depth k_b (``tree_steps.depth_limits``) keeps only
the nodes of depth <= k_b (deeper ones become padding, parent −1); levels no row needs are
not drafted.

Shapes: A active rows, N drafted nodes, F a level's frontier, K children per node, V the
vocabulary, H the feature size, T the tree slots in the draft's cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cactus_theory import sampler
from cactus_theory.core.trees.base import (
    DETERMINISTIC,
    HUB,
    WITH_REPLACEMENT,
    WITHOUT_REPLACEMENT,
)
from cactus_theory.decode.tree_cache import forward_tree
from cactus_theory.decode.tree_shape import TreeShape
from cactus_theory.sampler.processors import process_logits

Tensor = torch.Tensor


@dataclass
class DraftTree:
    """One step's drafted trees (layout of ``core.trees.verify``).

    tokens [A, N+1] (column 0: the root, the last committed token), parents [A, N+1]
    (−1: root or padding), draft_probs [A, N+1, V] the processed law each node's children
    were drawn from (sampled schemes; None for deterministic children), fed [A, N+1] the
    draft-cache tail slot of every node fed to the draft (−1: not fed), tail = T, levels =
    the shape's depth D.
    """

    tokens: Tensor
    parents: Tensor
    draft_probs: Tensor | None
    fed: Tensor
    tail: int
    levels: int


@dataclass(frozen=True)
class Level:
    """Level d of a static template: the frontier (node ids at depth d with children),
    each frontier node's parent's place in the previous level's frontier (−1: the root),
    the children (node ids at depth d + 1) with their frontier place and rank, and K (the
    most children of a frontier node)."""

    frontier: tuple[int, ...]
    parent_place: tuple[int, ...]
    children: tuple[int, ...]
    child_place: tuple[int, ...]
    child_rank: tuple[int, ...]
    width: int


def template_levels(shape: TreeShape) -> list[Level]:
    """The levels of a static template (``Level``), computed once per shape."""
    parents = (-1, *shape.parents)
    depth = shape.template_depths()
    levels, previous = [], {0: -1}
    for value in range(shape.depth):
        kids = [node for node in range(1, len(parents)) if depth[node] == value + 1]
        frontier = sorted({parents[node] for node in kids})
        place = {node: index for index, node in enumerate(frontier)}
        ranks, seen = [], {}
        for node in kids:
            ranks.append(seen.get(parents[node], 0))
            seen[parents[node]] = ranks[-1] + 1
        levels.append(
            Level(
                frontier=tuple(frontier),
                parent_place=tuple(previous.get(parents[node], -1) for node in frontier),
                children=tuple(kids),
                child_place=tuple(place[parents[node]] for node in kids),
                child_rank=tuple(ranks),
                width=max(seen.values()),
            )
        )
        previous = place
    return levels


class LevelFeeder:
    """Feeds frontiers to the drafter and keeps what later levels need: the tree slots'
    visibility [A, T, T] and, for a feature draft, the last level's predicted features."""

    def __init__(self, drafter, root_feature: Tensor | None) -> None:
        self.drafter = drafter
        self.visible: Tensor | None = None  # [A, T, T] bool: ancestors-or-self among tree slots
        self.features = None if root_feature is None else root_feature[:, None]  # [A, 1, H]
        self.tail = 0

    def feed(self, tokens: Tensor, positions: Tensor, parent_place: Tensor, parent_slot: Tensor):
        """Feed a frontier ``tokens`` [A, F] at ``positions`` [A, F]; ``parent_place`` [A, F]
        is each node's parent's place in the previous fed level (its features; −1 or 0 for
        the root) and ``parent_slot`` [A, F] its parent's tail slot (−1: the root). Returns
        the logits [A, F, V]."""
        rows, frontier = tokens.shape
        old = self.tail
        visible = torch.zeros(
            rows, frontier, old + frontier, dtype=torch.bool, device=tokens.device
        )
        if old:
            inherited = self.visible.gather(
                1, parent_slot.clamp(min=0)[..., None].expand(-1, -1, old)
            )  # [A, F, T_old]
            visible[:, :, :old] = inherited & (parent_slot >= 0)[..., None]
        visible[:, :, old:] = torch.eye(frontier, dtype=torch.bool, device=tokens.device)
        grown = torch.zeros(rows, old + frontier, old + frontier, dtype=torch.bool,
                            device=tokens.device)  # fmt: skip
        if old:
            grown[:, :old, :old] = self.visible
        grown[:, old:, :] = visible
        self.visible = grown
        self.tail = old + frontier
        if self.features is None:
            return forward_tree(self.drafter, tokens, positions, visible)
        parent_features = self.features.gather(
            1, parent_place.clamp(min=0)[..., None].expand(-1, -1, self.features.shape[-1])
        )  # [A, F, H]
        predicted = forward_tree(self.drafter, tokens, positions, visible, features=parent_features)
        self.drafter.drafted += frontier
        self.features = predicted  # [A, F, H]
        return self.drafter.model.logits(predicted)  # [A, F, V]


def choose_children(
    logits: Tensor,  # [A, F, V]
    width: int,
    scheme: str,
    prepared,
    draws,  # (count, need [A]) -> uniforms [A, count] from the needing rows' streams
    need: Tensor,  # [A] bool: rows whose children are used
) -> tuple[Tensor, Tensor | None]:
    """(children ids [A, F, K], the processed law they were drawn from [A, F, V] or None
    for deterministic children)."""
    if scheme == DETERMINISTIC:
        return logits.topk(width, dim=-1).indices, None
    law = process_logits(logits, prepared.processors)  # [A, F, V]
    rows, frontier, vocab = law.shape
    uniforms = draws(frontier * width, need).reshape(rows * frontier, width)  # [A·F, K]
    flat = law.reshape(rows * frontier, vocab)  # [A·F, V]
    remaining = flat.clone() if scheme != WITH_REPLACEMENT else flat
    chosen = []
    for rank in range(width):
        token = sampler.inverse_cdf(remaining, uniforms[:, rank])  # [A·F]
        if scheme == HUB and rank == 1:  # the hub a = argmax p unless the first draft was a
            hub = flat.argmax(dim=-1)  # [A·F]
            token = torch.where(chosen[0] != hub, hub, token)
        chosen.append(token)
        if scheme == WITHOUT_REPLACEMENT:
            remaining.scatter_(1, token[:, None], 0.0)
        elif scheme == HUB and rank == 0:  # the second draft of a hub first draft: p without a
            remaining.scatter_(1, flat.argmax(dim=-1)[:, None], 0.0)
    return torch.stack(chosen, dim=-1).reshape(rows, frontier, width), law


def positions_at(active, depth: int, frontier: int) -> Tensor:
    """[A, F] the position of a depth-``depth`` node (root position + depth, clamped)."""
    position = torch.minimum(active.count - 1 + depth, active.limit)  # [A]
    return position[:, None].expand(-1, frontier)


def draft_static(drafter, active, shape, levels, scheme, limits, prepared, draws) -> DraftTree:
    """Draft a static template (module docstring); ``levels`` = ``template_levels(shape)``,
    ``limits`` [A] the depth each row may use, ``draws(count, need)`` the rows' uniforms."""
    rows, device = active.last.shape[0], active.last.device
    nodes = shape.nodes
    tokens = torch.zeros(rows, nodes + 1, dtype=torch.int64, device=device)
    tokens[:, 0] = active.last
    fed = torch.full((rows, nodes + 1), -1, dtype=torch.int64, device=device)
    probs = None
    if scheme != DETERMINISTIC:
        probs = torch.zeros(rows, nodes + 1, prepared.vocab, device=device)
    depth = torch.tensor(shape.template_depths(), device=device)  # [N+1]
    parents = torch.tensor((-1, *shape.parents), device=device).expand(rows, -1)  # [A, N+1]
    parents = torch.where(depth[None, :] <= limits[:, None], parents, -1)
    if int(limits.max()) == 0:
        return DraftTree(tokens, parents, probs, fed, 0, shape.depth)
    logits = drafter.first(active.last, active.count, active.limit)[:, None]  # [A, 1, V]
    feeder = LevelFeeder(drafter, drafter.predicted if drafter.needs_features else None)
    for value, level in enumerate(levels):
        if value >= int(limits.max()):
            break
        frontier = torch.tensor(level.frontier, device=device)  # [F]
        if value:
            parent_place = torch.tensor(level.parent_place, device=device).expand(rows, -1)
            parent_nodes = parents[:, frontier]  # [A, F] (template parents; −1 past a limit)
            parent_slot = torch.where(
                parent_nodes > 0, fed.gather(1, parent_nodes.clamp(min=0)), -1
            )  # [A, F]
            logits = feeder.feed(
                tokens[:, frontier], positions_at(active, value, len(level.frontier)),
                parent_place, parent_slot,
            )  # fmt: skip
            fed[:, frontier] = (
                feeder.tail - len(level.frontier) + torch.arange(len(level.frontier), device=device)
            )
        need = limits > value  # [A] rows that use this level's children
        chosen, law = choose_children(logits, level.width, scheme, prepared, draws, need)
        place = torch.tensor(level.child_place, device=device)
        rank = torch.tensor(level.child_rank, device=device)
        tokens[:, torch.tensor(level.children, device=device)] = chosen[:, place, rank]
        if probs is not None:
            probs[:, frontier] = law.to(probs.dtype)
    return DraftTree(tokens, parents, probs, fed, feeder.tail, shape.depth)


def ranking(logits: Tensor, temperature: float) -> Tensor:
    """log r [.., V]: the draft's ranking law, log-softmax of logits / T (T = 1 when
    greedy), in float32."""
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits.float() / scale, dim=-1)


def draft_dynamic(drafter, active, shape: TreeShape, limits: Tensor, prepared) -> DraftTree:
    """Draft an EAGLE-2 dynamic tree (module docstring): ``shape.depth`` levels, ``top``
    expanded per level, the ``budget`` best candidates kept; rows limited to depth
    ``limits`` [A]."""
    rows, device = active.last.shape[0], active.last.device
    top, budget = shape.top, shape.budget
    temperature = prepared.processors.temperature
    parents_out = torch.full((rows, budget + 1), -1, dtype=torch.int64, device=device)
    tokens_out = torch.zeros(rows, budget + 1, dtype=torch.int64, device=device)
    tokens_out[:, 0] = active.last
    fed_out = torch.full((rows, budget + 1), -1, dtype=torch.int64, device=device)
    if int(limits.max()) == 0:
        return DraftTree(tokens_out, parents_out, None, fed_out, 0, shape.depth)
    logits = drafter.first(active.last, active.count, active.limit)  # [A, V]
    scores, ids = ranking(logits, temperature).topk(top, dim=-1)  # [A, K]
    candidates = Candidates(ids, scores, torch.full_like(ids, -1), torch.ones_like(ids))
    frontier = torch.arange(top, device=device).expand(rows, -1)  # [A, K] candidate ids
    root_feature = drafter.predicted if drafter.needs_features else None
    feeder = LevelFeeder(drafter, root_feature)
    place = torch.zeros(rows, top, dtype=torch.int64, device=device)  # parents' fed places
    for value in range(1, min(shape.depth, int(limits.max()))):
        parent_of = candidates.parent.gather(1, frontier)  # [A, K] (−1: the root)
        parent_slot = torch.where(
            parent_of >= 0, candidates.fed.gather(1, parent_of.clamp(min=0)), -1
        )  # [A, K]
        logits = feeder.feed(
            candidates.tokens.gather(1, frontier),
            positions_at(active, value, top),
            place,
            parent_slot,
        )  # [A, K, V]  fmt: skip
        fed_now = feeder.tail - top + torch.arange(top, device=device).expand(rows, -1)
        candidates.fed.scatter_(1, frontier, fed_now)
        child_scores, child_ids = ranking(logits, temperature).topk(top, dim=-1)  # [A, K, K]
        new_scores = candidates.score.gather(1, frontier)[..., None] + child_scores
        first_new = candidates.count
        candidates.add(
            child_ids.reshape(rows, top * top),
            new_scores.reshape(rows, top * top),
            frontier[..., None].expand(-1, -1, top).reshape(rows, top * top),
            value + 1,
        )
        best = new_scores.reshape(rows, top * top).topk(top, dim=-1).indices  # [A, K]
        place = best // top  # each new frontier node's parent's place in this frontier
        frontier = first_new + best
    if candidates.count < budget:  # levels no row needed were not drafted: pad
        missing = budget - candidates.count
        candidates.add(
            torch.zeros(rows, missing, dtype=torch.int64, device=device),
            torch.full((rows, missing), float("-inf"), device=device),
            torch.full((rows, missing), -1, dtype=torch.int64, device=device),
            shape.depth + 1,
        )
    usable = candidates.depth <= limits[:, None]  # [A, C]
    scores = torch.where(usable, candidates.score, float("-inf"))
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :budget]
    chosen = torch.sort(order, dim=1).values  # [A, N] candidate ids, breadth-first
    valid = scores.gather(1, chosen) > float("-inf")  # [A, N]
    node_of = torch.full_like(candidates.parent, -1)  # [A, C] node index of chosen candidates
    node_of.scatter_(1, chosen, torch.arange(1, budget + 1, device=device).expand(rows, -1))
    parent_candidate = candidates.parent.gather(1, chosen)  # [A, N]
    parent_node = torch.where(
        parent_candidate >= 0, node_of.gather(1, parent_candidate.clamp(min=0)), 0
    )
    parents_out[:, 1:] = torch.where(valid, parent_node, -1)
    tokens_out[:, 1:] = candidates.tokens.gather(1, chosen)
    fed_out[:, 1:] = torch.where(valid, candidates.fed.gather(1, chosen), -1)
    return DraftTree(tokens_out, parents_out, None, fed_out, feeder.tail, shape.depth)


class Candidates:
    """A dynamic tree's candidates, in the order they were drafted (level by level, each
    expanded node's children by rank): tokens, path log-probabilities under the ranking
    law, parent candidate (−1: the root), depth, and draft tail slot (−1: not fed); all
    [A, C]."""

    def __init__(self, tokens: Tensor, score: Tensor, parent: Tensor, depth: Tensor) -> None:
        self.tokens, self.score, self.parent, self.depth = tokens, score, parent, depth
        self.fed = torch.full_like(parent, -1)

    @property
    def count(self) -> int:
        return self.tokens.shape[1]

    def add(self, tokens: Tensor, score: Tensor, parent: Tensor, depth: int) -> None:
        """Append candidates [A, C'] at ``depth``."""
        self.tokens = torch.cat([self.tokens, tokens], dim=1)
        self.score = torch.cat([self.score, score], dim=1)
        self.parent = torch.cat([self.parent, parent], dim=1)
        self.depth = torch.cat([self.depth, torch.full_like(parent, depth)], dim=1)
        self.fed = torch.cat([self.fed, torch.full_like(parent, -1)], dim=1)
