"""Greedy tree decoding equals the verifier's own greedy ``generate``, batched and ragged,
for every tree shape, with a standalone draft and with a feature draft.

At temperature 0 q is one-hot and every tree rule used here accepts a child iff it is the
verifier's argmax (the walk and the lifts of greedy-consistent chain rules), so the output
must equal ``generate`` token for token; float64 models keep the cached tree forwards and
``generate`` within ~1e-15 of each other. Left-padded prompts of different lengths and a
perturbed draft make rows accept different path lengths each step.
"""

import copy

import pytest
import test_decode_greedy as chain
import torch
import torch_tiny_models as tiny

from cactus_theory import decode
from cactus_theory.decode.feature_draft import FeatureDraft, FeatureDraftConfig

MAX_NEW = 20
SHAPES = [
    "1,1,1",
    "3",
    "4,2,1",
    "2,2,2,2",
    "parents:0,0,0,1,1,2,4,4,6",
    "dynamic:8,depth=3,top=3",
    "dynamic:12,depth=4,top=2",
]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


verifier, prompts = chain.verifier, chain.prompts  # the chain greedy test's fixtures


@pytest.fixture(scope="module")
def expected(verifier, prompts):
    return chain.reference(verifier, prompts, max_new=MAX_NEW)


def tree_decode(verifier, draft, prompts, tree, rule="walk", eos=None, max_new=MAX_NEW):
    ids, mask = prompts
    return decode.speculative_generate(
        verifier, draft, ids, rule=rule, tree=tree, max_new_tokens=max_new, temperature=0,
        eos_token_id=eos, pad_token_id=0, attention_mask=mask,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip


@pytest.mark.parametrize("tree", SHAPES)
def test_standalone_draft_trees_equal_generate(verifier, prompts, expected, tree):
    result = tree_decode(verifier, tiny.perturbed(verifier), prompts, tree)
    assert torch.equal(result.sequences, expected)
    steps = result.accepted_lengths
    assert any(len(set(row[row >= 0].tolist())) > 1 for row in steps)  # ragged paths
    assert result.acceptance_length > 0.5
    assert result.tree_outcomes.shape[:2] == steps.shape


@pytest.mark.parametrize(
    ("rule", "tree"),
    [
        ("sps", "dynamic:8,depth=3,top=3"),
        ("cactus:delta=1.0", "4,2,1"),
        ("lift:frontier:delta=0.5", "dynamic:8,depth=3,top=3"),
        ("tas", "4,2,1"),
    ],
)
def test_greedy_consistent_chain_rules_lifted(verifier, prompts, expected, rule, tree):
    result = tree_decode(verifier, tiny.perturbed(verifier), prompts, tree, rule)
    assert torch.equal(result.sequences, expected)


def test_a_perfect_draft_fills_every_static_tree(verifier, prompts, expected):
    result = tree_decode(verifier, copy.deepcopy(verifier), prompts, "2,2,1")
    assert torch.equal(result.sequences, expected)
    full = result.accepted_lengths[:-1]  # the last steps may be cut by max_new_tokens
    assert bool((full[full >= 0] == 3).all())  # the draft's argmax is always the first child


def feature_draft(verifier):
    config = FeatureDraftConfig(
        hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64,
        max_position_embeddings=512,
    )  # fmt: skip
    return FeatureDraft.build(verifier, config, seed=3)


@pytest.mark.parametrize("tree", ["4,2,1", "3,3", "dynamic:10,depth=3,top=3"])
def test_feature_draft_trees_equal_generate(verifier, prompts, expected, tree):
    result = tree_decode(verifier, feature_draft(verifier), prompts, tree)
    assert torch.equal(result.sequences, expected)
    assert result.alpha_by_position[0] > 0  # some children accepted


def test_rows_stop_at_their_first_eos(verifier, prompts, expected):
    ids, _ = prompts
    eos = int(expected[2, ids.shape[1] + 3])  # the fourth token of row 2
    reference = chain.reference(verifier, prompts, eos=eos, max_new=MAX_NEW)
    result = tree_decode(verifier, tiny.perturbed(verifier), prompts, "3,2", eos=eos)
    assert torch.equal(result.sequences, reference)
    first = expected[2, ids.shape[1] :].tolist().index(eos)  # row 2 stops at its first EOS
    assert result.num_generated[2] == first + 1 <= 4
