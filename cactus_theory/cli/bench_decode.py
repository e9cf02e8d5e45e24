"""``cactus bench decode``: the paper's decoding table, every rule against autoregressive.

One run decodes the same prompts with the same sampling settings and seed for the
autoregressive baseline and every (rule, k) config, in ``--repeats`` interleaved rounds
(each row keeps its median round's tokens/s), and reports side by side: AL (accepted
drafts per verify step, bonus excluded), tokens per call, tokens/s, the speed-up over the
baseline (median of the per-round paired ratios) with its 95% order-statistic interval,
the divergence meter's KL per token, the verifier NLL (nats/token, T = 1), the
measured per-position acceptance α and cost ratio c, Leviathan's predicted speed-up from
them, the sampler's share of decode time and the meter's cost relative to a verify step
(``cactus_theory.real.decode_table`` defines every column). Finished rows are cached
(``--cache DIR``), so an interrupted run resumes.

A speed-up is given only with an honest interval: with fewer than 6 rounds the speed-up
and interval columns show "-" and a line says why. ``--batch-sizes 1 2 4 8`` runs the
table at each batch size (each with its own baseline, interleaved in the same rounds) and
adds every row's speed-up over the first size's baseline: where plain batching overtakes
speculation. JSON rows also carry ``steps``, ``reached_by_position``,
``alpha_by_position`` (acceptance at draft positions 1..k) and ``verify_cost`` (v).

Defaults: the default pair and its prompts, the paper's sampling setting (T = 0.6, top-k
20, top-p 0.95), batch size 1 (latency), ``--dtype auto`` (the dtype measured fastest for
a verify forward here, ``cactus_theory.real.precision``), rules sps, tas, cactus δ = 0.5
and 1, cactus-exact δ = 1, frontier δ = 1, at k = 3 and 5, 6 rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path

from cactus_theory.cli.decode import add_model_arguments, run_settings, setup_from_args
from cactus_theory.cli.tree_args import add_tree_arguments, choose_auto
from cactus_theory.util.files import atomic_write_json, check_writable, check_writable_folder

DEFAULT_PROMPTS = 24


def configure(parser: argparse.ArgumentParser) -> None:
    from cactus_theory.real.decode_table import PAPER_KS, PAPER_RULES

    add_model_arguments(parser)
    parser.set_defaults(batch_size=1, num_prompts=DEFAULT_PROMPTS)
    parser.add_argument(
        "--rule",
        action="append",
        help=f"rule spec, repeatable (default: {', '.join(PAPER_RULES)})",
    )
    parser.add_argument(
        "-k",
        type=int,
        nargs="*",
        default=list(PAPER_KS),
        help=f"draft lengths (default {' '.join(map(str, PAPER_KS))}; '-k' alone with "
        "--tree: trees only)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=6,
        help="interleaved rounds over the whole table; 6 or more give each speed-up with a "
        "95%% interval, fewer give no speed-up at all (default 6)",
    )
    parser.add_argument(
        "--batch-sizes",
        type=int,
        nargs="+",
        metavar="B",
        help="run the whole table at each batch size (e.g. 1 2 4 8), each with its own "
        "baseline, interleaved; adds each row's speed-up over the first size's baseline, "
        "to see where plain batching overtakes speculation (replaces --batch-size)",
    )
    add_tree_arguments(parser, several=True)
    parser.add_argument(
        "--cache", metavar="DIR", help="cache finished rows here, so a rerun resumes"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the table as JSON")


def table_lines(table: dict) -> list[str]:
    """The table as aligned text lines; "-" for a speed-up without an honest interval
    (fewer than 6 rounds) and for columns a row lacks. With several batch sizes, a batch
    column and the speed-up over the reference batch's baseline ("vs b1")."""
    batches = len(table["settings"]["batch_sizes"] or ()) > 1
    reference = table.get("reference_batch_size", 1)
    width = max([3, *(len(shape_label(row)) for row in table["rows"])])
    header = f"{'rule':<24} {'k':>{width}} " + (f"{'batch':>5} " if batches else "")
    header += (
        f"{'AL':>5} {'tok/call':>8} {'tokens/s':>9} {'speed-up':>8} {'interval':>12} "
        + (f"{f'vs b{reference}':>8} {'interval':>12} " if batches else "")
        + f"{'KL/token':>9} {'NLL':>6} {'α1':>5} {'α':>5} {'c':>5} {'v':>5} {'pred.':>6} "
        f"{'sampler':>7} {'meter':>6}"
    )
    lines = [header, "-" * len(header)]
    for row in table["rows"]:
        kl = "-" if row["kl_per_token"] is None else f"{row['kl_per_token']:.4f}"
        alphas = row.get("alpha_by_position") or []
        first_alpha = "-" if not alphas or alphas[0] is None else f"{alphas[0]:.2f}"
        extra = "".join(
            f" {row[key]:>{width}.{digits}f}{suffix}"
            if row.get(key) is not None
            else f" {'-':>{width + len(suffix)}}"
            for key, width, digits, suffix in (
                ("alpha", 5, 2, ""),
                ("cost_ratio", 5, 3, ""),
                ("verify_cost", 5, 2, ""),
                ("predicted_speedup", 5, 2, "x"),
                ("sampler_share", 6, 1, "%"),
                ("meter_over_verify", 5, 1, "%"),
            )
        )
        line = f"{row['label']:<24} {shape_label(row):>{width}} " + (
            f"{row['batch_size']:>5} " if batches else ""
        )
        line += (
            f"{row['acceptance_length']:>5.2f} {row['tokens_per_call']:>8.2f} "
            f"{row['tokens_per_second']:>9.1f} {speedup(row)} {interval(row):>12} "
        )
        if batches:
            line += f"{speedup(row, '_over_reference')} {interval(row, '_over_reference'):>12} "
        line += f"{kl:>9} {row['verifier_nll']:>6.3f} {first_alpha:>5}" + extra.replace(" %", "%")
        lines.append(line)
    return lines


#: How a tree row's label marks sampled children.
SCHEME_TAGS = {"with-replacement": " iid", "without-replacement": " wor", "hub": " hub"}


def shape_label(row: dict) -> str:
    """The k column: k for a chain, the tree's label for a tree ("-" for the baseline)."""
    if row.get("tree"):
        from cactus_theory.decode.tree_shape import parse_tree

        scheme = SCHEME_TAGS.get(row.get("children") or "deterministic", "")
        return parse_tree(row["tree"]).label + scheme
    return str(row["k"]) if row["k"] else "-"


def speedup(row: dict, suffix: str = "") -> str:
    """The speed-up, 8 wide, or "-" where none is given (fewer than 6 rounds)."""
    value = row.get(f"speedup{suffix}")
    return f"{'-':>8}" if value is None else f"{value:>7.2f}x"


def _coverage(table: dict) -> str:
    coverages = {
        round(row["speedup_coverage"], 3) for row in table["rows"] if "speedup_coverage" in row
    }
    return ", ".join(f"{100 * value:.1f}%" for value in sorted(coverages))


def interval(row: dict, suffix: str = "") -> str:
    """The speed-up's order-statistic interval, "[low, high]"
    (``cactus_theory.real.decode_table``), or "-" where none is given."""
    if f"speedup{suffix}_low" not in row:
        return "-"
    return f"[{row[f'speedup{suffix}_low']:.2f}, {row[f'speedup{suffix}_high']:.2f}]"


def _percent(table: dict) -> dict:
    """Shares as percentages for printing (the JSON keeps fractions)."""
    rows = []
    for row in table["rows"]:
        row = dict(row)
        for key in ("sampler_share", "meter_over_verify"):
            if key in row:
                row[key] = 100 * row[key]
        rows.append(row)
    return {**table, "rows": rows}


def run(args: argparse.Namespace, default_pair: Callable) -> int:
    import torch

    from cactus_theory.real import decode_table

    if args.json:
        check_writable("json", args.json)
    if args.cache:
        check_writable_folder("cache", args.cache)
    if args.repeats < 1:
        raise ValueError(f"repeats: must be >= 1, got {args.repeats}")
    decoding = run_settings(args)
    trees = tuple(args.tree or ())
    settings = decode_table.TableSettings(
        rules=tuple(args.rule) if args.rule else decode_table.PAPER_RULES,
        ks=tuple(args.k),
        trees=trees,
        children=args.children,
        num_prompts=args.num_prompts or DEFAULT_PROMPTS,
        max_new_tokens=args.max_new_tokens,
        sampling=decoding.sampling,
        batch_size=args.batch_sizes[0] if args.batch_sizes else args.batch_size,
        seed=args.seed,
        repeats=args.repeats,
        batch_sizes=tuple(args.batch_sizes or ()),
    )
    setup = setup_from_args(args, default_pair)
    if any(tree.startswith("auto") for tree in trees):
        settings = dataclasses.replace(settings, chosen=choose_auto_trees(setup, settings))
    table = decode_table.run(
        setup,
        settings,
        Path(args.cache) if args.cache else None,
        device=args.device,
        dtype=args.dtype,
        threads=torch.get_num_threads(),
    )
    sampling = settings.sampling
    batch = (
        "es " + " ".join(map(str, settings.sizes))
        if args.batch_sizes
        else f" {settings.batch_size}"
    )
    print(
        f"\n{len(setup.prompts)} prompts x {settings.max_new_tokens} new tokens, batch"
        f"{batch}, T={sampling.temperature:g}, top-k={sampling.top_k or 'off'}, "
        f"top-p={sampling.top_p:g}, {args.device} {args.dtype}, {torch.get_num_threads()} "
        f"threads, seed {settings.seed}; tokens/s: median of {settings.repeats} interleaved "
        f"rounds{'; chat template' if setup.chat else ''}"
    )
    print(f"verifier {setup.pair.verifier}\ndraft    {setup.pair.draft}")
    print("\n".join(table_lines(_percent(table))))
    print(
        "AL = accepted drafts per verify step (bonus excluded); tok/call = tokens per verifier "
        "call; speed-up = median over rounds of the paired ratio to the same round's "
        "baseline at the same batch size, interval = its order-statistic interval (coverage "
        f"{_coverage(table) or '-'}); "
        + (
            f"vs b{table['reference_batch_size']} = the same over the batch "
            f"{table['reference_batch_size']} baseline; "
            if args.batch_sizes and len(settings.sizes) > 1
            else ""
        )
        + "KL/token = the meter's exact KL(emitted ‖ verifier) per generated token; NLL = "
        "verifier negative log-likelihood (nats/token, T=1); α1 = acceptance at draft "
        "position 1; α = per-position acceptance pooled over positions; c = draft cost per "
        "draft token and v = verify cost per verifier call, in autoregressive steps; pred. = "
        "Leviathan's (1 − α^(k+1)) / ((1 − α)(kc + 1)) (assumes v = 1); sampler = the rule's "
        "share of decode time; meter = the divergence meter's cost / the verify step's"
    )
    if "speedup_note" in table:
        print(table["speedup_note"])
    differing = [f"{row['label']} k={row['k']}" for row in table["rows"] if not row["rounds_agree"]]
    if differing:
        print(
            "note: rounds decoded different tokens for " + ", ".join(differing) + " (statistics "
            "are from the first round; nondeterministic kernels?)"
        )
    if trees:
        print(
            "tree rows: k = the tree (widths or n nodes, d depth); α = accepted / nodes "
            "reached with children (α1 at depth 0); c = per draft forward, v = per verify call "
            "of all the tree's nodes; pred. = (AL + 1)/(L c + v), L = draft forwards per step; "
            "sampler = the walk with the meter's laws (measured as it walks: meter 0); α by "
            "depth and rank in --json"
        )
    if args.json:
        table = {**table, "dtype": args.dtype, "dtype_choice": args.dtype_choice}
        atomic_write_json(args.json, table, indent=2)
    return 0


def choose_auto_trees(setup, settings) -> tuple[tuple[str, str, str], ...]:
    """Each ``auto`` tree chosen for each rule (``tree_args.choose_auto``, calibrated on the
    pair's own prompts): ((rule spec, tree spec, chosen spec), ...)."""
    from cactus_theory.decode.runs import RunSettings
    from cactus_theory.real.decode_table import rule_of, split_tree

    run = RunSettings(sampling=settings.sampling)
    chosen = []
    for tree in settings.trees:
        shape, scheme = split_tree(tree, settings.children)
        if shape.startswith("auto"):
            for spec in settings.rules:
                print(f"tree {tree} for {spec}:")
                used, _ = choose_auto(setup, run, rule_of(spec, shape), shape, scheme)
                chosen.append((spec, tree, used + ("@" + scheme if "@" in tree else "")))
    return tuple(chosen)
