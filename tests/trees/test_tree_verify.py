"""The numpy whole-tree walk (``core.trees.verify``): a chain-shaped tree is the chain's
verify step, a tree's decisions are its nodes' (``verify_node``), and bad trees are
refused."""

import numpy as np
import pytest
from random_trees import random_trees

from cactus_theory import rules, trees
from cactus_theory.core.trees.verify import depths, verify_tree
from cactus_theory.core.verify import verify_block


@pytest.mark.parametrize("spec", ["sps", "cactus:delta=0.5", "tas"])
def test_a_chain_tree_walks_as_the_chain_verify_step(spec):
    """Each node has one child drafted from p (with replacement, K = 1): the lifted rule's
    walk is the chain rule's verify step, token for token, from the same uniforms."""
    rng = np.random.default_rng(3)
    batch, steps, vocab = 200, 4, 9
    target = rng.dirichlet(np.ones(vocab) * 0.5, size=(batch, steps + 1))
    draft = rng.dirichlet(np.ones(vocab) * 0.5, size=(batch, steps + 1))
    ids = np.stack([[rng.choice(vocab, p=draft[b, i]) for i in range(steps)] for b in range(batch)])
    accept_u, sample_u = rng.random((batch, steps)), rng.random(batch)
    rule = rules.parse(spec)
    expected, accepted = verify_block(rule, target, draft[:, :steps], ids, accept_u, sample_u)
    parents = np.tile(np.arange(-1, steps), (batch, 1))  # node i's parent is i − 1
    tokens = np.concatenate([np.zeros((batch, 1), dtype=np.int64), ids], axis=1)
    token_ids, num_accepted, path = verify_tree(
        trees.lift(rule), target, draft, parents, tokens, trees.WITH_REPLACEMENT, accept_u,
        sample_u,
    )  # fmt: skip
    assert np.array_equal(token_ids, expected) and np.array_equal(num_accepted, accepted)
    assert np.array_equal(path[:, 0], np.zeros(batch)) and (path[:, 1:] != 0).all()


def test_every_visited_node_decides_as_the_node_sampler():
    rng = np.random.default_rng(4)
    target, draft, parents, tokens = random_trees(rng, 60, 7, trees.DETERMINISTIC)
    levels = int(depths(parents).max())
    decide_u, sample_u = rng.random((60, levels)), rng.random(60)
    rule = trees.make("walk")
    token_ids, accepted, path = verify_tree(
        rule, target, draft, parents, tokens, trees.DETERMINISTIC, decide_u, sample_u
    )
    assert accepted.max() >= 2  # deep paths were walked
    for row in range(60):
        for depth in range(accepted[row] + 1):
            node = path[row, depth]
            kids = np.flatnonzero(parents[row] == node)
            if kids.size == 0:
                break
            here = trees.Node(target=target[row, node], draft=draft[row, node],
                              children=tokens[row, kids])  # fmt: skip
            outcome, token = trees.verify_node(
                rule, here, tokens[row, kids], decide_u[row, depth], sample_u[row]
            )
            if depth < accepted[row]:  # accepted: the walk moved to that child
                assert kids[outcome] == path[row, depth + 1] and token == token_ids[row, depth]
            else:  # the walk stopped here: every child rejected, the residual's token
                assert outcome == kids.size and token == token_ids[row, depth]


@pytest.mark.parametrize(
    ("parents", "message"),
    [
        ([[0, 0]], "node 0 is the root"),
        ([[-1, 1]], "every parent must come before its child"),
        ([[-1, -1, 1]], "hangs below a padding node"),
    ],
)
def test_bad_trees_are_refused(parents, message):
    vocab = 3
    nodes = len(parents[0])
    rows = np.full((1, nodes, vocab), 1.0 / vocab)
    with pytest.raises(ValueError, match=message):
        verify_tree(
            trees.make("walk"), rows, rows, parents, np.zeros((1, nodes), dtype=np.int64),
            trees.DETERMINISTIC, np.zeros((1, nodes)), np.zeros(1),
        )  # fmt: skip


def test_scheme_must_suit_the_rule():
    rows = np.full((1, 2, 3), 1.0 / 3)
    with pytest.raises(ValueError, match="scheme"):  # SGLang's kernel: no i.i.d. children
        verify_tree(
            trees.make("sglang-tree"), rows, rows, [[-1, 0]], [[0, 1]], trees.WITH_REPLACEMENT,
            np.zeros((1, 1)), np.zeros(1),
        )  # fmt: skip
