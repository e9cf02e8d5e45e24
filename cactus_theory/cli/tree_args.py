"""Trees on the command line: ``--tree`` and ``--children`` for ``cactus decode`` and
``cactus bench decode``, tree rules in ``--rule``, ``--tree auto``'s calibration, and the
lines a tree run's summary adds.

- ``--tree 4,2,1`` (widths per depth), ``--tree dynamic:16`` (EAGLE-2, 16 nodes),
  ``--tree parents:0,0,1`` (a template), ``--tree auto`` / ``auto:32``
  (``decode.tree_shape``); ``--children deterministic|with-replacement|
  without-replacement|hub``;
- ``--rule``: with a tree, a tree rule's name (``walk``, ``rrs``, ``sglang-tree``, a
  plug-in's) or any chain rule, which runs as its sibling-by-sibling lift;
- ``--tree auto`` calibrates (``decode.tree_auto``) on the pair's own prompts, never on
  the evaluation prompts of ``--dataset`` or ``--prompts`` (a pair without prompts of its
  own calibrates on the first two evaluation prompts, and the line says so); it prints the
  choice and what it was measured from, and the run uses the chosen ``parents:`` template.
"""

from __future__ import annotations

import argparse

from cactus_theory.core.trees.base import DETERMINISTIC, SCHEMES


def add_tree_arguments(parser: argparse.ArgumentParser, several: bool = False) -> None:
    """``--tree`` (repeatable when ``several``) and ``--children``."""
    parser.add_argument(
        "--tree",
        action="append" if several else "store",
        metavar="SPEC",
        help="draft a tree per step instead of a chain: widths per depth (4,2,1), "
        "dynamic:N (EAGLE-2 with N nodes; dynamic:N,depth=D,top=K), parents:P1,P2,... (a "
        "template) or auto[:N] (chosen from the pair's measured costs and acceptance)"
        + (
            "; repeatable, each a row beside the chains of -k; SPEC@SCHEME drafts that "
            "tree's children by SCHEME (e.g. 3,2,1@without-replacement)"
            if several
            else ""
        ),
    )
    parser.add_argument(
        "--children",
        default=DETERMINISTIC,
        choices=SCHEMES,
        help="how a tree's children are drafted: the draft's top-K (deterministic, the "
        "default), or sampled from its law (with-replacement, without-replacement, hub)",
    )


def is_tree_rule(spec: str | None) -> bool:
    """Whether ``spec`` names a registered tree rule (``walk``, ``rrs``, ...)."""
    from cactus_theory.core import trees

    return spec is not None and spec.partition(":")[0].strip() in trees.names()


def calibration_inputs(setup, count: int | None = None):
    """(input_ids [B, P], attention_mask [B, P], what they are) for ``--tree auto``: the
    first ``count`` (default ``tree_auto.CALIBRATION_ROWS``) of the pair's own prompts,
    else of the run's (module docstring)."""
    from cactus_theory.decode.runs import encode_prompts, read_prompts
    from cactus_theory.decode.tree_auto import CALIBRATION_ROWS

    count = CALIBRATION_ROWS if count is None else count
    if setup.pair.prompts:
        prompts, source = read_prompts(setup.pair.prompts)[:count], "the pair's own prompts"
    else:
        prompts, source = setup.prompts[:count], "the run's first prompts (the pair has none)"
    ids, mask = encode_prompts(setup.tokenizer, prompts, setup.chat)
    return ids.to(setup.device), mask.to(setup.device), source


def choose_auto(setup, run, rule, spec: str, children: str) -> tuple[str, dict]:
    """``--tree auto``: calibrate, print the choice; (the chosen spec, a JSON record)."""
    import torch

    from cactus_theory.decode.tree_auto import choose_for_prompts

    ids, mask, source = calibration_inputs(setup)
    choice = choose_for_prompts(
        setup.verifier, setup.draft, ids, mask, rule, spec, children, run.sampling,
        eos_token_id=setup.tokenizer.eos_token_id,
    )  # fmt: skip
    print(choice.describe() + f"\n  calibrated on {source}; {torch.get_num_threads()} threads")
    return choice.shape.spec, choice.as_json()


def tree_summary_lines(totals, steps_seconds: float | None, tree: str) -> list[str]:
    """A tree run's lines: nodes per step, α by depth and by rank, and (with the baseline's
    step time) the draft and verify costs behind the speed-up."""
    from cactus_theory.decode.tree_stats import by_rank, tree_costs

    alphas = ", ".join("-" if a != a else f"{a:.2f}" for a in totals.alpha_by_position)
    ranks = ", ".join(
        "-" if a is None else f"{a:.2f}" for a in by_rank(totals.tree_ended, totals.tree_reached)
    )
    nodes = totals.nodes / max(totals.steps, 1)
    lines = [
        f"tree {tree}: {nodes:.1f} nodes verified per step; α by depth [{alphas}] (a child "
        f"accepted at a reached node of that depth); α by rank [{ranks}] (the draft's r-th "
        "choice accepted at a node with more than r children)"
    ]
    if steps_seconds:
        costs = tree_costs(totals.timing, totals.acceptance_length, steps_seconds)
        lines.append(
            f"why:         a draft forward costs c = {costs['draft_cost']:.3f} and a verify "
            f"call v = {costs['verify_cost']:.2f} autoregressive steps (rest "
            f"{costs['other_cost']:.2f}); {costs['draft_forwards']:.1f} draft forwards per step, "
            f"AL {totals.acceptance_length:.2f}: predicted (AL+1)/(L c + v) = "
            f"{costs['predicted_speedup']:.2f}x"
        )
    return lines
