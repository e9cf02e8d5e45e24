"""Parity of SGLang's tree kernel and our tree rule: the same nodes and uniforms through
sgl-kernel's ``tree_speculative_sampling_target_only`` (CUDA) and ``trees.verify_node``
with ``sglang-tree`` (numpy, float64).

    python scripts/sglang_tree_parity.py [--nodes 4000] [--mock] [--json PATH]

Each node (q ~ Dirichlet(0.3) over 64 tokens; children the top-K of a draft 0.7 q + 0.3
noise, K in {1, 2, 4}) is a depth-1 tree laid out as the kernel reads it: index 0 is the
root (its row is q), indices 1..K its children in order (``retrive_next_token[0] = 1``,
siblings chained by ``retrive_next_sibling``), ``uniform_samples[b, 0]`` the root's coin and
``uniform_samples_for_final_sampling[b]`` the residual's coin; ``draft_probs`` all zero
(target-only). The kernel writes the root's emitted token at ``predicts[b * (K + 1)]`` and
the number accepted at ``accept_token_num[b]``. Ours: outcome and token of
``verify_node(sglang-tree, node, children, u, u_final)``.

The two accept on u < C_i (ours) and u <= C_i (the kernel) and sample the residual in
float32 on the GPU: a mismatch is excused when a uniform lies within 1e-5 of a boundary
(one of the C_i or a cumulative residual mass); any other mismatch fails (exit 1).
Without sgl_kernel (or CUDA) the script says so and exits 0, unless ``--mock`` runs the
kernel's loop written in Python on the same tensors (to check this harness anywhere).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

THRESHOLDS = ((1.0, 1.0), (1.0, 0.5), (0.3, 0.7), (0.25, 0.2))
VOCAB = 64
BOUNDARY = 1e-5


def layout(targets: np.ndarray, children: list[list[int]], width: int):
    """The kernel's tensors for one batch of depth-1 trees with ``width`` children each."""
    import torch

    batch = len(children)
    draft_tokens = width + 1
    candidates = np.zeros((batch, draft_tokens), dtype=np.int64)
    candidates[:, 1:] = np.asarray(children)
    index = np.arange(batch * draft_tokens, dtype=np.int64).reshape(batch, draft_tokens)
    next_token = np.full((batch, draft_tokens), -1, dtype=np.int64)
    next_token[:, 0] = 1
    next_sibling = np.full((batch, draft_tokens), -1, dtype=np.int64)
    next_sibling[:, 1:width] = np.arange(2, width + 1)
    rows = np.repeat(targets[:, None, :], draft_tokens, axis=1).astype(np.float32)
    as_tensor = torch.as_tensor
    return {
        "candidates": as_tensor(candidates),
        "retrive_index": as_tensor(index),
        "retrive_next_token": as_tensor(next_token),
        "retrive_next_sibling": as_tensor(next_sibling),
        "target_probs": as_tensor(rows),
        "draft_probs": torch.zeros_like(as_tensor(rows)),
    }


def mock_kernel(tensors: dict, coins, finals, single: float, acc: float):
    """The CUDA loop of TreeSpeculativeSamplingTargetOnly for depth-1 trees, in Python:
    (root tokens [B], accepted counts [B])."""
    target = tensors["target_probs"].numpy().astype(np.float64)
    candidates = tensors["candidates"].numpy()
    batch, draft_tokens, _ = target.shape
    tokens, counts = np.zeros(batch, dtype=np.int64), np.zeros(batch, dtype=np.int64)
    for b in range(batch):
        removed = np.zeros(target.shape[-1])
        prob_acc, chosen = 0.0, None
        for i in range(1, draft_tokens):
            token = candidates[b, i]
            prob_acc += target[b, 0, token]
            if coins[b, 0] <= prob_acc / max(acc, 1e-9) or target[b, 0, token] >= single:
                chosen = token
                break
            removed[token] = target[b, 0, token]
        if chosen is not None:
            tokens[b], counts[b] = chosen, 1
            continue
        relu = np.maximum(target[b, 0] - removed, 0.0)
        cumulative = np.cumsum(relu)
        found = int(np.searchsorted(cumulative, finals[b] * cumulative[-1], side="right"))
        tokens[b] = min(found, target.shape[-1] - 1)
    return tokens, counts


def real_kernel(tensors: dict, coins, finals, single: float, acc: float):
    """sgl-kernel on CUDA: (root tokens [B], accepted counts [B])."""
    import torch
    from sgl_kernel import tree_speculative_sampling_target_only

    cuda = {key: value.cuda() for key, value in tensors.items()}
    batch, draft_tokens = cuda["candidates"].shape
    predicts = torch.full((batch * draft_tokens,), -1, dtype=torch.int32, device="cuda")
    accept_index = torch.full((batch, 2), -1, dtype=torch.int32, device="cuda")
    accept_num = torch.zeros(batch, dtype=torch.int32, device="cuda")
    tree_speculative_sampling_target_only(
        predicts, accept_index, accept_num, cuda["candidates"], cuda["retrive_index"],
        cuda["retrive_next_token"], cuda["retrive_next_sibling"],
        torch.as_tensor(coins, dtype=torch.float32, device="cuda"),
        torch.as_tensor(finals, dtype=torch.float32, device="cuda"),
        cuda["target_probs"], cuda["draft_probs"],
        threshold_single=single, threshold_acc=acc, deterministic=True,
    )  # fmt: skip
    tokens = predicts.view(batch, draft_tokens)[:, 0].long().cpu().numpy()
    return tokens, accept_num.long().cpu().numpy()


def near_boundary(target, children, coin, final, rule) -> bool:
    """Whether a uniform lies within ``BOUNDARY`` of a decision boundary of this node."""
    from cactus_theory import trees

    edges = rule.cumulative(target[None], np.asarray(children)[None])[0]
    if np.min(np.abs(edges - coin)) < BOUNDARY:
        return True
    node = trees.Node(target=target, draft=np.full(target.size, 1 / target.size), children=children)
    shape = (1, node.vocab_size)
    rows = trees.proposals(np.full(shape, 1 / target.size), np.asarray([children]), node.scheme)
    residual = np.asarray(rule.final_residual(target[None], rows, np.asarray([children])))[0]
    cumulative = np.cumsum(residual) / residual.sum()
    return bool(np.min(np.abs(cumulative - final)) < BOUNDARY)


def run(count: int, mock: bool) -> dict:
    from cactus_theory import trees

    kernel = mock_kernel if mock else real_kernel
    rng = np.random.default_rng(0)
    report = {"kernel": "python loop (--mock)" if mock else "sgl_kernel CUDA", "settings": []}
    for single, acc in THRESHOLDS:
        rule = trees.make("sglang-tree", threshold_single=single, threshold_acc=acc)
        checked = mismatches = excused = 0
        for width in (1, 2, 4):
            targets = rng.dirichlet(np.full(VOCAB, 0.3), size=count // 3).astype(np.float32)
            targets = targets.astype(np.float64)
            targets /= targets.sum(axis=-1, keepdims=True)
            # children: the top-K of a draft near q (as EAGLE drafts them), so walks accept
            drafts = 0.7 * targets + 0.3 * rng.dirichlet(np.full(VOCAB, 0.3), size=len(targets))
            children = [list(np.argsort(-row, kind="stable")[:width]) for row in drafts]
            coins = rng.random((len(targets), width + 1))
            finals = rng.random(len(targets))
            tensors = layout(targets, children, width)
            theirs, accepted = kernel(tensors, coins, finals, single, acc)
            for b in range(len(targets)):
                node = trees.Node(
                    target=targets[b], draft=np.full(VOCAB, 1 / VOCAB), children=children[b]
                )
                outcome, token = trees.verify_node(
                    rule, node, np.asarray([children[b]]), [coins[b, 0]], [finals[b]]
                )
                checked += 1
                same = token[0] == theirs[b] and int(outcome[0] < width) == accepted[b]
                if not same:
                    if near_boundary(targets[b], children[b], coins[b, 0], finals[b], rule):
                        excused += 1
                    else:
                        mismatches += 1
        report["settings"].append(
            {"threshold_single": single, "threshold_acc": acc, "nodes": checked,
             "mismatches": mismatches, "excused_at_boundaries": excused}
        )  # fmt: skip
    report["passed"] = all(item["mismatches"] == 0 for item in report["settings"])
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4000, help="nodes per threshold setting")
    parser.add_argument("--mock", action="store_true", help="the kernel's loop in Python")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args()
    if not args.mock:
        try:
            import sgl_kernel  # noqa: F401
            import torch

            assert torch.cuda.is_available()
        except Exception as error:  # not installed, or no CUDA: nothing to compare
            print(f"skipped: sgl_kernel's tree kernel is not usable here ({error})")
            return 0
    report = run(args.nodes, args.mock)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
