"""A whole tree's exact accepted-length moments, as the tree theory computes them with the
decoder's machinery, equal the trees library's whole-tree recursion
(``core.trees.sequences.tree_statistics``) on the same pair, rule and tree."""

import numpy as np
import pytest
import torch
import torch_tiny_models as tiny

from cactus_theory import trees
from cactus_theory.core.processors import SamplingSettings
from cactus_theory.core.trees.sequences import tree_statistics
from cactus_theory.decode.runs import Pair, Setup
from cactus_theory.real.theory_trees import whole_tree_moments
from cactus_theory.sampler.processors import process_logits

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SAMPLING = SamplingSettings(temperature=0.8, top_k=10, top_p=0.95)


def second_moment(rule, source, widths, prefix=(), chance=1.0):
    """E[L²] by the same recursion: Σ_v P(reach v)(2 depth(v) − 1)."""
    if len(prefix) == len(widths):
        return 0.0
    target, draft = source(prefix)
    children = trees.sequences.top_children(draft, widths[len(prefix)])
    node = trees.Node(target=target, draft=draft, children=children)
    exact = trees.enumerate_node(rule, node)
    total = 0.0
    for token in np.flatnonzero(exact.accepted > 0):
        reach = chance * float(exact.accepted[token])
        total += reach * (2 * (len(prefix) + 1) - 1)
        total += second_moment(rule, source, widths, (*prefix, int(token)), reach)
    return total


@pytest.mark.parametrize("spec", ["walk", "lift:cactus:delta=0.5"])
def test_whole_tree_moments_equal_the_trees_recursion(spec):
    verifier = tiny.llama(seed=0, vocab=24, init=0.2)
    draft = tiny.perturbed(verifier, scale=0.4)
    setup = Setup(verifier, draft, None, [], torch.device(tiny.DEVICE), Pair("v", "d"), False)
    contexts = [[3, 5, 7, 9], [11, 2], [4, 4, 4, 4, 8, 1]]
    widths = (3, 2)
    mean, square = whole_tree_moments(
        setup, contexts, [2, 2, 1], spec, "3,2", SAMPLING, batch_size=2
    )
    rule = trees.parse(spec)
    for index, context in enumerate(contexts):

        def source(prefix, context=context):
            ids = torch.tensor([context + list(prefix)], device=tiny.DEVICE)
            with torch.no_grad():
                target = verifier(input_ids=ids).logits[0, -1]
                ranking = draft(input_ids=ids).logits[0, -1]
            return (
                process_logits(target, SAMPLING).double().cpu().numpy(),
                torch.softmax(ranking / SAMPLING.temperature, -1).cpu().numpy(),
            )

        shape = widths if index < 2 else widths[:1]  # the third context is cut at depth 1
        expected = tree_statistics(rule, source, shape)
        assert mean[index] == pytest.approx(expected.accepted_length, rel=1e-6)
        assert square[index] == pytest.approx(second_moment(rule, source, shape), rel=1e-6)
        assert mean[index] > 0.05
