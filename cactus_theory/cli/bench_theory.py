"""``cactus bench theory``: a pool's exact acceptance against what speculative decoding
measures, per rule and dataset (``cactus_theory.real.theory`` defines every column).

    cactus bench theory [--dataset NAME_OR_FILE ...] [--rule SPEC ...] [-k K]
        [--num-prompts N] [--max-new-tokens M] [--json PATH] [--cache DIR]

For each dataset it builds the pool of the prompts (the verifier's own continuations,
teacher-forced) and, per rule, decodes the same prompts speculatively with k drafts per
step, then teacher-forces the decoder's own sequences. Per row: the pool's exact α, the
measured α₁ (draft position 1 over every verify step) with its standard error by prompt,
their difference in standard errors (z), the exact α at the decoder's step starts and at
all its positions, and Leviathan's predicted AL from the pool's α against the measured AL.
Pools and decodes are cached (default: the user cache), so a rerun only recomputes the
comparison and an interrupted run resumes.

Defaults: the default pair; MT-Bench, HumanEval and the held-out prompts; sps, cactus
δ = 1 and cactus-exact δ = 1; k = 3; 24 prompts × 64 new tokens; the paper's sampling
(T = 0.6, top-k 20, top-p 0.95); batch 8 (a row's law does not depend on the batch).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

from cactus_theory.cli.sampling_args import add_sampling_arguments, sampling_from_args
from cactus_theory.util.files import atomic_write_json, check_writable, check_writable_folder

DEFAULT_DATASETS = ("mt-bench", "humaneval", "heldout")
DTYPES = ("float32", "bfloat16", "float16")


def configure(parser: argparse.ArgumentParser) -> None:
    from cactus_theory.real.theory import DEFAULT_RULES, TheorySettings

    defaults = TheorySettings()
    parser.add_argument("--verifier", metavar="PATH_OR_ID", help="verifier; default pair")
    parser.add_argument("--draft", metavar="PATH_OR_ID", help="draft (same tokenizer)")
    parser.add_argument(
        "--dataset",
        action="append",
        metavar="NAME_OR_FILE",
        help="mt-bench, humaneval, heldout or a prompt file; repeatable (default: "
        f"{', '.join(DEFAULT_DATASETS)})",
    )
    parser.add_argument(
        "--rule",
        action="append",
        help=f"rule spec, repeatable (default: {', '.join(DEFAULT_RULES)})",
    )
    parser.add_argument(
        "-k", type=int, default=defaults.k, help="drafts per verify step (default %(default)s)"
    )
    parser.add_argument(
        "--num-prompts",
        type=int,
        default=defaults.num_prompts,
        help="first N prompts of each dataset (default %(default)s)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=defaults.max_new_tokens,
        help="tokens generated per prompt (default %(default)s)",
    )
    add_sampling_arguments(parser)
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=defaults.batch_size,
        help="prompts decoded together (default %(default)s)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument(
        "--dtype", default="float32", choices=DTYPES, help="model weights dtype (default float32)"
    )
    parser.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's)")
    parser.add_argument(
        "--raw", action="store_true", help="send prompts as plain text, not via the chat template"
    )
    parser.add_argument(
        "--cache",
        metavar="DIR",
        help="pools and decodes are cached here (default: the user cache, $CACTUS_CACHE/theory)",
    )
    parser.add_argument(
        "--tree",
        action="append",
        metavar="WIDTHS",
        help="also compare trees (static, e.g. 4,2,1; deterministic children): the whole "
        "tree's exact E[accepted] on the pool and at the decoder's step starts against the "
        "tree decoder's measured AL (cactus_theory.real.theory_trees); repeatable",
    )
    parser.add_argument(
        "--no-chains", action="store_true", help="with --tree: skip the chain comparison (k)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")


def _setups(args: argparse.Namespace, default_pair: Callable, datasets: list[str]) -> dict:
    """One ``Setup`` per dataset: the pair is loaded once, the prompts swapped."""
    from cactus_theory.cli.decode import device_from_args, set_threads
    from cactus_theory.decode.runs import Pair, load_setup, read_prompts
    from cactus_theory.real.datasets import prompt_file

    set_threads(args.threads)
    device = device_from_args(args.device)
    if (args.verifier is None) != (args.draft is None):
        raise ValueError("verifier: give both --verifier and --draft, or neither (default pair)")
    files = {name: str(prompt_file(name)) for name in datasets}
    pair = default_pair() if args.verifier is None else Pair(args.verifier, args.draft)
    first = load_setup(pair, device, args.dtype, files[datasets[0]], args.num_prompts, args.raw)
    return {
        name: dataclasses.replace(first, prompts=read_prompts(files[name])[: args.num_prompts])
        for name in datasets
    }


def _value(value: float, se: float, digits: int = 3) -> str:
    return f"{value:.{digits}f}±{se:.{digits}f}"


def table_lines(result: dict) -> list[str]:
    """The rows as aligned text lines."""
    header = (
        f"{'dataset':<10} {'rule':<22} {'steps':>5} {'pool α':>11} {'measured α₁':>11} "
        f"{'z':>5} {'α starts':>8} {'z':>5} {'α all':>6} {'α sim.':>6} {'z':>5} "
        f"{'pred. AL':>10} {'meas. AL':>10}"
    )
    lines = [header, "-" * len(header)]
    for row in result["rows"]:
        lines.append(
            f"{Path(row['dataset']).name[:10]:<10} {row['label'][:22]:<22} "
            f"{row['drafted_steps']:>5} {_value(row['pool_alpha'], row['pool_alpha_se']):>11} "
            f"{_value(row['measured_alpha'], row['measured_alpha_se']):>11} "
            f"{row['pool_z']:>+5.1f} {row['alpha_step_starts']:>8.3f} {row['starts_z']:>+5.1f} "
            f"{row['alpha_all_positions']:>6.3f} "
            f"{row.get('pool_alpha_simulated_starts', math.nan):>6.3f} "
            f"{row.get('simulated_z', math.nan):>+5.1f} "
            f"{_value(row['predicted_al'], row['predicted_al_se'], 2):>10} "
            f"{_value(row['measured_al'], row['measured_al_se'], 2):>10}"
        )
    return lines


def tree_table_lines(rows: list[dict]) -> list[str]:
    """The tree rows as aligned text lines."""
    header = (
        f"{'dataset':<10} {'rule':<22} {'tree':>8} {'steps':>5} {'pool E[L]':>11} "
        f"{'E starts':>8} {'z':>5} {'meas. AL':>11} {'z pool':>6}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(
            f"{Path(row['dataset']).name[:10]:<10} {row['label'][:22]:<22} {row['tree']:>8} "
            f"{row['steps']:>5} {_value(row['pool_accepted'], row['pool_accepted_se'], 2):>11} "
            f"{row['accepted_step_starts']:>8.2f} {row['starts_z']:>+5.1f} "
            f"{_value(row['measured_al'], row['measured_al_se'], 2):>11} {row['pool_z']:>+6.1f}"
        )
    return lines


def run(args: argparse.Namespace, default_pair: Callable) -> int:
    import torch

    from cactus_theory.core.rules import parse
    from cactus_theory.real import theory, theory_trees
    from cactus_theory.util import provenance

    if args.json:
        check_writable("json", args.json)
    cache = Path(args.cache) if args.cache else provenance.cache_root() / "theory"
    check_writable_folder("cache", cache)
    datasets = list(args.dataset or DEFAULT_DATASETS)
    if len(set(datasets)) != len(datasets):
        raise ValueError(f"dataset: named twice in {', '.join(datasets)}")
    rules = list(args.rule or theory.DEFAULT_RULES)
    if not args.no_chains:
        for rule in rules:
            parse(rule)  # a bad spec fails before any model loads
    settings = theory.TheorySettings(
        k=args.k,
        num_prompts=args.num_prompts,
        max_new_tokens=args.max_new_tokens,
        sampling=sampling_from_args(args),
        batch_size=args.batch_size,
        seed=args.seed,
    )
    trees = list(args.tree or [])
    if args.no_chains and not trees:
        raise ValueError("no_chains: give --tree, or there is nothing to compare")
    for tree in trees:
        for rule in rules:
            theory_trees._tree_parts(rule, tree)  # bad trees fail before any model loads
    setups = _setups(args, default_pair, datasets)
    result = {"rows": []}
    if not args.no_chains:
        result = theory.run(setups, settings, rules, cache, device=args.device, dtype=args.dtype)
    if trees:
        result["tree_rows"] = theory_trees.run_trees(
            setups, settings, rules, trees, cache, device=args.device, dtype=args.dtype
        )
    first = next(iter(setups.values()))
    result = {
        **result,
        "pair": {"verifier": first.pair.verifier, "draft": first.pair.draft},
        "threads": torch.get_num_threads(),
        "cache": str(cache),
    }
    sampling = settings.sampling
    chains = "" if args.no_chains else f"k={settings.k}, "
    print(
        f"\n{chains}{settings.num_prompts} prompts x {settings.max_new_tokens} new "
        f"tokens per dataset, T={sampling.temperature:g}, top-k={sampling.top_k or 'off'}, "
        f"top-p={sampling.top_p:g}, {args.device} {args.dtype}, {torch.get_num_threads()} "
        f"threads, seed {settings.seed}"
    )
    print(f"verifier {first.pair.verifier}\ndraft    {first.pair.draft}")
    if result["rows"]:
        print("\n".join(table_lines(result)))
    if trees:
        print("\n".join(tree_table_lines(result["tree_rows"])))
        print(
            "pool E[L] = a whole tree's exact expected accepted length over the pool's "
            "positions; E starts = the same at the decoder's own step starts, z = (E starts − "
            "meas. AL) / its martingale SE; meas. AL = accepted drafts per tree step; z pool = "
            "(pool E[L] − meas. AL) / SE of the paired difference by prompt "
            "(cactus_theory.real.theory_trees)"
        )
    if result["rows"]:
        print(
            "pool α = the rule's exact acceptance over the pool's positions (the verifier's own "
            "continuations); measured α₁ = accepted / drafted at draft position 1 over every "
            "verify step; ± = standard error by prompt; z = (pool α − α₁) / SE of the paired "
            "difference; α starts = exact acceptance at the decoder's own step starts (its "
            "sequences teacher-forced), z = (α starts − α₁) / its martingale SE; α all = at every "
            "decoded position; α sim. = pool α at step starts simulated on the pool's own "
            "trajectories, z against α₁ as for pool α; pred. AL = Σ_j α^j (pool α, each step's "
            "own k), meas. AL = accepted drafts per verify step (cactus_theory.real.theory)"
        )
    if args.json:
        atomic_write_json(args.json, result, indent=2)
    return 0
