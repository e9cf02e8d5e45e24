"""Every drafted tree's children are the draft's top-K of a fresh forward along the node's
path, at every step of a batched, ragged run: the tree masks, the per-level feeding (a
feature draft's predicted features along each path) and the compaction and pending tokens
of both drafters keep the draft's cache exact.

A recorder wraps ``tree_steps.draft`` in a real run and keeps each step's rows, committed
counts and trees; afterwards each row's committed history at that step is its prompt plus
its first (count − prompt length) generated tokens, and for every node with children the
draft's logits after (history + the node's path) are computed from scratch (float64, no
cache): the children must be their top-K, and the path must go deeper than one node.
"""

import pytest
import torch
import torch_tiny_models as tiny
from test_decode_feature_draft import config, fresh_draft_logits

from cactus_theory import decode
from cactus_theory.decode import tree_steps
from cactus_theory.decode.feature_draft import FeatureDraft

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 12  # a small vocabulary: top-K children are often the verifier's choice


def record(monkeypatch) -> list:
    steps = []
    original = tree_steps.draft

    def recorder(drafter, active, plan, scheme, limits, prepared, streams):
        tree = original(drafter, active, plan, scheme, limits, prepared, streams)
        steps.append((active.rows.clone(), active.count.clone(), tree.tokens.clone(),
                      tree.parents.clone()))  # fmt: skip
        return tree

    monkeypatch.setattr(tree_steps, "draft", recorder)
    return steps


def path_logits(verifier, draft, history: list[int], path: list[int]) -> torch.Tensor:
    """The draft's logits after history + path, from scratch (a feature draft feeds each
    drafted token its parent's predicted feature)."""
    if not isinstance(draft, FeatureDraft):
        ids = torch.tensor([history + path], device=tiny.DEVICE)
        with torch.no_grad():
            return draft(input_ids=ids).logits[0, -1]
    predicted = []
    logits, feature = fresh_draft_logits(verifier, draft, history)
    for depth in range(len(path)):
        predicted.append(feature)
        logits, feature = fresh_draft_logits(verifier, draft, history, path[: depth + 1], predicted)
    return logits


@pytest.mark.parametrize("kind", ["standalone", "feature"])
@pytest.mark.parametrize("tree", ["3,2,1", "dynamic:7,depth=3,top=2"])
def test_children_are_the_drafts_top_k_along_every_path(monkeypatch, kind, tree):
    verifier = tiny.llama(seed=0, vocab=VOCAB)
    if kind == "standalone":
        draft = tiny.perturbed(verifier, scale=0.3)
    else:
        draft = FeatureDraft.build(verifier, config(None), seed=1)
    ids, mask = tiny.left_padded_prompts(batch=3, vocab=VOCAB, pads=(0, 2, 4))
    steps = record(monkeypatch)
    result = decode.speculative_generate(
        verifier, draft, ids, rule="walk", tree=tree, max_new_tokens=10, temperature=0,
        attention_mask=mask, eos_token_id=[], generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    prompts = [ids[row][mask[row] == 1].tolist() for row in range(3)]
    generated = result.new_tokens
    checked = 0
    for rows, counts, tokens, parents in steps:
        for index, row in enumerate(rows.tolist()):
            history = prompts[row] + generated[row][: int(counts[index]) - len(prompts[row])]
            table = parents[index].tolist()
            for node in range(len(table)):
                kids = [child for child, parent in enumerate(table) if parent == node]
                if not kids or (node and table[node] < 0):
                    continue
                path, above = [], node
                while above > 0:
                    path.insert(0, int(tokens[index, above]))
                    above = table[above]
                logits = path_logits(verifier, draft, history, path)
                top = logits.topk(len(kids)).indices.tolist()
                assert [int(tokens[index, child]) for child in kids] == top
                checked += 1
    assert max(result.accepted_lengths.max(), 0) >= 2  # paths below depth 1 were kept
    assert checked > 20
