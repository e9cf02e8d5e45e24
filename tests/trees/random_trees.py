"""Random batches of drafted trees for the tree-walk tests (numpy reference and torch)."""

from __future__ import annotations

import numpy as np
from nodes import random_row

from cactus_theory import trees


def random_trees(rng, batch: int, vocab: int, scheme: str, depth: int = 3, zeros: bool = True):
    """(target [B, N+1, V], draft [B, N+1, V], parents [B, N+1], tokens [B, N+1]): each row a
    breadth-first tree of depth <= ``depth`` whose nodes have 0 to 3 children (2 for the hub
    scheme), children drafted as ``scheme`` drafts them from the node's draft row; rows are
    padded to the largest with padding nodes (parent −1)."""
    rows = []
    for _ in range(batch):
        target, draft, parents, tokens = [], [], [-1], [0]
        level = [0]
        target.append(random_row(rng, vocab, zeros))
        draft.append(random_row(rng, vocab, zeros))
        for _ in range(depth):
            following = []
            for node in level:
                width = 2 if scheme == trees.HUB else int(rng.integers(0, 4))
                if width == 0:
                    continue
                row = draft[node]
                if scheme == trees.DETERMINISTIC:
                    children = rng.permutation(vocab)[: min(width, vocab)]
                else:
                    if scheme != trees.WITH_REPLACEMENT and np.count_nonzero(row) < width:
                        row = np.full(vocab, 1.0 / vocab)
                        draft[node] = row
                    here = trees.Node(target=target[node], draft=row, k=width, scheme=scheme)
                    children = trees.draft_children(here, rng.random(width))
                for child in children:
                    parents.append(node)
                    tokens.append(int(child))
                    target.append(random_row(rng, vocab, zeros))
                    draft.append(random_row(rng, vocab, zeros))
                    following.append(len(parents) - 1)
            level = following
        rows.append((target, draft, parents, tokens))
    nodes = max(len(row[2]) for row in rows)
    target_all = np.zeros((batch, nodes, vocab))
    draft_all = np.zeros((batch, nodes, vocab))
    target_all[...] = 1.0 / vocab  # padding nodes: any valid row
    draft_all[...] = 1.0 / vocab
    parents_all = np.full((batch, nodes), -1, dtype=np.int64)
    tokens_all = np.zeros((batch, nodes), dtype=np.int64)
    for index, (target, draft, parents, tokens) in enumerate(rows):
        count = len(parents)
        target_all[index, :count] = target
        draft_all[index, :count] = draft
        parents_all[index, :count] = parents
        tokens_all[index, :count] = tokens
    return target_all, draft_all, parents_all, tokens_all
