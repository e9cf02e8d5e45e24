"""Sampled tree decoding emits the exact law, and the meter reads it.

A vocabulary-8 pair, one prompt in N = 6000 rows, Pearson chi-square at ALPHA = 1e-3 with
fixed seeds (the same setting as ``test_decode_sampling``):

- lossless tree rules (the walk with the draft's top-K, recursive rejection with i.i.d.
  children, without replacement, and SpecHub's pair): the first two tokens, drafted and
  verified in one tree step of depth 2, follow q(x1) q(x2 | x1); the negative control (the
  draft's own joint) is rejected; the meter reads 0 on every token;
- a lossy rule (Cactus lifted sibling by sibling, deterministic children): the first token
  follows the node's conditional law e(· | S) with S the draft's top-3
  (``core.trees.base.conditional_law``), which the test tells apart from q, and the meter's
  first-token KL equals KL(e ‖ q) exactly in every row.
"""

import numpy as np
import pytest
import test_decode_sampling as chain
import torch
import torch_tiny_models as tiny

from cactus_theory import decode, divergences, trees
from cactus_theory.core.trees.base import conditional_law

ALPHA, VOCAB, ROWS = chain.ALPHA, chain.VOCAB, chain.ROWS  # the chain law test's setting
SETTINGS, PROMPT = chain.SETTINGS, chain.PROMPT
pair, processed, p_value = chain.pair, chain.processed, chain.p_value  # its pair and helpers
joint = chain.exact_joint

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run(pair, rule, tree, children, new_tokens, seed):
    verifier, draft = pair
    return decode.speculative_generate(
        verifier, draft, torch.tensor([PROMPT] * ROWS, device=tiny.DEVICE), rule=rule,
        tree=tree, children=children, max_new_tokens=new_tokens,
        temperature=SETTINGS.temperature, top_k=SETTINGS.top_k, top_p=SETTINGS.top_p,
        generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("rule", "tree", "children"),
    [
        ("walk", "3,2", trees.DETERMINISTIC),
        ("rrs", "3,2", trees.WITH_REPLACEMENT),
        ("rrs", "3,2", trees.WITHOUT_REPLACEMENT),
        ("rrs", "2,2", trees.HUB),
    ],
)
def test_lossless_trees_emit_the_verifiers_joint_law(pair, rule, tree, children):
    verifier, draft = pair
    result = run(pair, rule, tree, children, new_tokens=3, seed=31)
    assert result.accepted_lengths[0].max() == 2  # the first step's tree held both tokens
    new = result.sequences[:, len(PROMPT) :].cpu().numpy()
    cells = new[:, 0] * VOCAB + new[:, 1]
    assert p_value(cells, joint(processed(verifier, PROMPT), verifier)) > ALPHA
    assert p_value(cells, joint(processed(draft, PROMPT), draft)) < ALPHA  # negative control
    assert float(result.token_kl.abs().max()) < 1e-12  # the meter: every law is q


def test_a_lossy_tree_emits_the_conditional_law_and_the_meter_reads_it(pair):
    verifier, draft = pair
    rule = trees.lift("cactus:delta=0.5")
    target = processed(verifier, PROMPT)
    with torch.no_grad():
        logits = draft(input_ids=torch.tensor([PROMPT], device=tiny.DEVICE)).logits[0, -1]
    children = logits.topk(3).indices.cpu().numpy()  # the draft's top-3 at the root
    hot = np.eye(VOCAB)[children]
    law = conditional_law(rule, target, hot, children)
    result = run(pair, rule, "3", trees.DETERMINISTIC, new_tokens=2, seed=32)
    first = result.sequences[:, len(PROMPT)].cpu().numpy()
    assert p_value(first, law) > ALPHA
    assert p_value(first, target) < ALPHA  # told apart from the lossless law
    expected_kl = divergences.kl(law, target)
    assert expected_kl > 0.01
    np.testing.assert_allclose(result.token_kl[:, 0].numpy(), expected_kl, rtol=1e-9)
