"""Random nodes for the tree tests: rows with zeros, near-ties and peaked rows."""

from __future__ import annotations

import numpy as np

from cactus_theory import trees


def random_row(rng: np.random.Generator, vocab: int, zeros: bool = True) -> np.ndarray:
    """A probability row: Dirichlet with a random concentration, some entries zeroed."""
    row = rng.dirichlet(np.full(vocab, rng.choice([0.2, 1.0, 5.0])))
    if zeros and vocab > 2 and rng.random() < 0.4:
        row[rng.random(vocab) < 0.3] = 0.0
        if row.sum() == 0:
            row[rng.integers(vocab)] = 1.0
    return row / row.sum()


def random_node(rng: np.random.Generator, vocab: int, width: int, scheme: str) -> trees.Node:
    """A node of ``scheme`` with ``width`` children (fewer when the draft's support is
    too small for distinct children)."""
    target = random_row(rng, vocab)
    draft = random_row(rng, vocab)
    if scheme == trees.DETERMINISTIC:
        children = rng.permutation(vocab)[: min(width, vocab)]
        return trees.Node(target=target, draft=draft, children=[int(c) for c in children])
    support = int(np.count_nonzero(draft))
    if scheme == trees.HUB:
        if support < 2:
            draft = np.full(vocab, 1.0 / vocab)
        return trees.Node(target=target, draft=draft, k=2, scheme=trees.HUB)
    if scheme == trees.WITHOUT_REPLACEMENT:
        width = min(width, support)
    return trees.Node(target=target, draft=draft, k=width, scheme=scheme)
