"""Whole trees (``trees.tree_statistics``): expected accepted length and KL per step against
explicit references and Monte Carlo walks (z-test at ``LEVEL``, negative control)."""

import numpy as np
import pytest
from goodness_of_fit import LEVEL
from scipy import stats

from cactus_theory import divergences, trees

VOCAB = 5


def bigram_source(seed: int):
    """q(· | last token) and p(· | last token) from Dirichlet tables (the root's 'last
    token' is 0): a synthetic Markov source."""
    rng = np.random.default_rng(seed)
    target = rng.dirichlet(np.full(VOCAB, 0.6), size=VOCAB)
    draft = 0.6 * target + 0.4 * rng.dirichlet(np.full(VOCAB, 0.6), size=VOCAB)

    def source(prefix):
        last = prefix[-1] if prefix else 0
        return target[last], draft[last]

    return source


def walks(rule, source, widths, scheme, count, seed):
    """``count`` sampled verification steps, depth by depth (walks at the same node are
    sampled together): [count, 2] of (accepted drafts, Σ KL(e‖q) over visited nodes)."""
    out = np.zeros((count, 2))
    rng = np.random.default_rng(seed)
    groups = {(): np.arange(count)}
    for width in widths:
        following = {}
        for prefix, members in groups.items():
            target, draft = source(prefix)
            if scheme == trees.DETERMINISTIC:
                children = trees.top_children(draft, width)
                node = trees.Node(target=target, draft=draft, children=children)
            else:
                node = trees.Node(target=target, draft=draft, k=width, scheme=scheme)
            out[members, 1] += float(divergences.kl(trees.node_law(rule, node), target))
            sample = trees.sample_node(rule, node, members.size, seed=rng)
            kept = sample.outcome < node.k
            out[members[kept], 0] += 1
            for token in np.unique(sample.token[kept]):
                chosen = members[kept][sample.token[kept] == token]
                following[(*prefix, int(token))] = chosen
        groups = following
    return out


def test_a_width_one_walk_is_a_chain_of_top_one_drafts():
    source = bigram_source(0)
    stats_ = trees.tree_statistics("walk", source, "1,1,1")
    prefix, chance, expected = (), 1.0, 0.0
    for _ in range(3):
        target, draft = source(prefix)
        token = int(np.argmax(draft))
        chance *= target[token]
        expected += chance
        prefix += (token,)
    assert stats_.accepted_length == pytest.approx(expected, abs=1e-14)
    assert stats_.kl_per_step == pytest.approx(0.0, abs=1e-15)
    assert stats_.tokens_per_step == pytest.approx(expected + 1)
    assert stats_.reach[0] == pytest.approx(source(())[0][int(np.argmax(source(())[1]))])


@pytest.mark.parametrize(
    "spec, widths, scheme",
    [
        ("cactus-tree:delta=0.5", (3, 2), trees.DETERMINISTIC),
        ("sglang-tree:threshold_acc=0.5", (2, 2, 1), trees.DETERMINISTIC),
        ("cactus-rrs:delta=0.3", (2, 1), trees.WITH_REPLACEMENT),
        ("rrs", (2, 2), trees.WITHOUT_REPLACEMENT),
    ],
)
def test_monte_carlo_walks_agree_with_the_exact_tree(spec, widths, scheme):
    source = bigram_source(1)
    exact = trees.tree_statistics(spec, source, widths, scheme)
    draws = walks(trees.parse(spec), source, widths, scheme, 4000, seed=2)
    for column, wanted in ((0, exact.accepted_length), (1, exact.kl_per_step)):
        values = draws[:, column]
        z = (values.mean() - wanted) / (values.std(ddof=1) / np.sqrt(values.size) + 1e-300)
        assert 2 * stats.norm.sf(abs(z)) > LEVEL
    # negative control: the same walks against a tree one node shallower
    shallow = trees.tree_statistics(spec, source, widths[:-1] or (1,), scheme)
    if abs(shallow.accepted_length - exact.accepted_length) > 0.05:
        values = draws[:, 0]
        z = (values.mean() - shallow.accepted_length) / (values.std(ddof=1) / np.sqrt(values.size))
        assert 2 * stats.norm.sf(abs(z)) < LEVEL


def test_lossless_trees_spend_no_kl_and_wider_trees_accept_more():
    source = bigram_source(3)
    narrow = trees.tree_statistics("walk", source, "1,1")
    wide = trees.tree_statistics("walk", source, "3,2")
    assert max(narrow.kl_per_step, wide.kl_per_step) <= 1e-15
    assert wide.accepted_length >= narrow.accepted_length
    sampled = trees.tree_statistics("rrs", source, "2,2", trees.WITH_REPLACEMENT)
    assert sampled.kl_per_step == pytest.approx(0.0, abs=1e-12)
    assert sampled.nodes > 1


def test_predicted_length_and_widths_parsing():
    assert trees.predicted_length([0.5, 0.5]) == pytest.approx(0.75)
    assert trees.parse_widths("4, 2,1") == (4, 2, 1)
    with pytest.raises(ValueError, match="^widths: expected integers"):
        trees.parse_widths("4,x")
    with pytest.raises(ValueError, match="^widths: must be >= 1"):
        trees.parse_widths([2, 0])
    with pytest.raises(ValueError, match="^scheme: expected deterministic"):
        trees.tree_statistics("walk", bigram_source(0), "2", scheme="beam")
