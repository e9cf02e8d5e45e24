"""``cactus tradeoff``: the exact acceptance–divergence trade-off of every rule on a real
pair's contexts, with no sampling noise in the rules' statistics.

    cactus tradeoff [--pair smollm2|stdlib | --verifier PATH --draft PATH]
        [--dataset mt-bench|humaneval|heldout|FILE] [--num-prompts N] [--max-new-tokens M]
        [--positions P] [--rule SPEC ...] [--temperature T --top-k K --top-p P]
        [--dtype bfloat16] [--device cpu] [--k-max 5] [--json PATH] [--out DIR]

1. **The pool** (``cactus_theory.real.pools``): the verifier's own sampled continuations of
   the dataset's prompts (so the contexts have the law of lossless decoding), then one
   teacher-forced pass per model: at every generated position the verifier's row q and the
   draft's row p after the same processors (a feature draft at its first draft position,
   fed the verifier's features). Built shard by shard and cached, so a rerun reads it
   back and an interrupted build resumes.
2. **Every rule, exactly** (``cactus_theory.real.tradeoff``): acceptance, KL and TV of the
   emitted law per token, the largest branch KL, and the pool-level frontier's acceptance
   at the rule's KL (the most any rule reaches there), checked, not assumed, to dominate.
3. **Costs** (``cactus_theory.real.costs``, unless ``--no-costs``): the draft cost c and the
   verify cost v_k in autoregressive steps, measured with the decoder, for predicted
   speed-ups (AL_k + 1)/(k c + v_k) under Leviathan et al.'s i.i.d. assumption (every draft
   position accepts with the pool's α; deeper positions of a feature draft accept less).

It prints a table and a sentence for Cactus δ = 1 against SpS, and writes ``--out``
(default ``cactus-tradeoff``): ``tradeoff.json`` (schema in ``real.tradeoff.to_json``),
``tradeoff.csv`` and the figure ``tradeoff.png``/``.svg`` (acceptance against KL per token,
log-x, the frontier as the envelope, one curve per family).

``--tree 1,2,4`` computes the trade-off of tree rules instead (``real.tree_tradeoff``): one
node of K children at every position, for each K and each drafting scheme of
``--children`` (deterministic top-K, sampled with or without replacement), every tree rule
beside the tree frontier, written as ``tree-tradeoff.json``, ``.csv`` and ``.png``; ``--rule``
then names tree rules.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from cactus_theory.cli.sampling_args import add_sampling_arguments, sampling_from_args
from cactus_theory.core.processors import SamplingSettings
from cactus_theory.util.files import atomic_write_json, atomic_write_text, check_writable_folder

DTYPES = ("auto", "float32", "bfloat16", "float16")
#: The k whose predicted AL and speed-up the printed table shows.
SHOWN_K = 3


def configure(parser: argparse.ArgumentParser) -> None:
    from cactus_theory.real import pairs

    parser.add_argument(
        "--pair",
        choices=pairs.NAMES,
        help="a named pair: smollm2 (SmolLM2-135M-Instruct and its shipped feature draft, "
        "the default) or stdlib (the small pair of cactus train-pair)",
    )
    parser.add_argument(
        "--verifier", metavar="PATH_OR_ID", help="verifier: a folder, a .gguf file or a hub id"
    )
    parser.add_argument(
        "--draft",
        metavar="PATH_OR_ID",
        help="draft: a causal LM with the verifier's tokenizer, or a feature-draft folder",
    )
    parser.add_argument(
        "--dataset",
        metavar="NAME_OR_FILE",
        help="prompts: mt-bench, humaneval, heldout or a prompt file (default: mt-bench; "
        "the stdlib pair's own code openings for --pair stdlib)",
    )
    parser.add_argument(
        "--num-prompts", type=int, default=80, help="use at most the first N prompts (80)"
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=128,
        help="tokens sampled per prompt for the contexts (default 128)",
    )
    parser.add_argument(
        "--positions",
        type=int,
        default=2000,
        help="stop adding prompts once the pool holds this many positions (default 2000)",
    )
    parser.add_argument(
        "--rule",
        action="append",
        metavar="SPEC",
        help="rule spec, repeatable (default: sps, tas, cactus and cactus-exact over δ in "
        "0.1..4, frontier, the engines' relaxed and sglang rules)",
    )
    add_sampling_arguments(parser)
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="model weights; auto (the default): measured on this device, the fastest for "
        "the pool's generation step and, for the costs, for the decoder's verify call "
        "(cactus_theory.real.precision; float32 on CPUs without bfloat16 units)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument(
        "--threads", type=int, help="CPU threads for torch (default: torch's choice)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=8, help="prompts per pool shard (default 8)"
    )
    parser.add_argument(
        "--k-max", type=int, default=5, help="predicted AL and speed-up for k = 1..K (5)"
    )
    parser.add_argument(
        "--no-costs",
        action="store_true",
        help="skip measuring the draft and verify costs (no predicted speed-ups)",
    )
    parser.add_argument(
        "--raw", action="store_true", help="send prompts as plain text, not via the chat template"
    )
    parser.add_argument(
        "--cache",
        metavar="DIR",
        help="where pools are kept (default: the cactus cache, $CACTUS_CACHE or "
        "~/.cache/cactus-theory)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        default="cactus-tradeoff",
        help="folder for tradeoff.json, tradeoff.csv and the figure (default %(default)s)",
    )
    parser.add_argument(
        "--tree",
        metavar="K,...",
        help="tree rules instead of chain rules: one node of K children per position, for "
        "each K given (e.g. 1,2,4)",
    )
    parser.add_argument(
        "--children",
        default="deterministic,with-replacement,without-replacement",
        metavar="SCHEMES",
        help="with --tree: how children are drafted, comma-separated (default: all three)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the JSON here")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def interrupted_message(args: argparse.Namespace) -> str:
    return "interrupted; the pool's finished shards are cached, so a rerun resumes"


def _check(args: argparse.Namespace) -> SamplingSettings:
    for name in ("num_prompts", "max_new_tokens", "positions", "batch_size", "k_max"):
        value = getattr(args, name)
        if value < 1:
            raise ValueError(f"{name.replace('_', '-')}: must be >= 1, got {value}")
    sampling = sampling_from_args(args)
    if args.json:
        from cactus_theory.util.files import check_writable

        check_writable("json", args.json)
    check_writable_folder("out", args.out)
    return sampling


def _rules(args: argparse.Namespace) -> list[str]:
    from cactus_theory.core import rules, trees
    from cactus_theory.real.tradeoff import default_rules

    if args.tree:
        return [trees.spec_of(trees.parse(spec)) for spec in args.rule or []]
    specs = args.rule or default_rules()
    return [rules.spec_of(rules.parse(spec)) for spec in specs]  # a bad spec fails now


def _tree_shape(args: argparse.Namespace) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(node widths, drafting schemes) of ``--tree`` and ``--children``."""
    from cactus_theory.core import trees
    from cactus_theory.real.tree_tradeoff import SCHEMES

    widths = trees.parse_widths(args.tree.replace("tree", ""))
    schemes = tuple(item.strip() for item in args.children.split(",") if item.strip())
    unknown = [scheme for scheme in schemes if scheme not in SCHEMES]
    if unknown or not schemes:
        raise ValueError(f"children: expected some of {', '.join(SCHEMES)}, got {args.children!r}")
    return widths, schemes


def _prompts(args: argparse.Namespace, pair) -> tuple[str, str]:
    """(the dataset's label, its prompt file)."""
    from cactus_theory.real import datasets

    name = args.dataset
    if name is None and pair.name == "stdlib" and pair.prompts:
        return "stdlib held-out", pair.prompts
    name = name or "mt-bench"
    return name, str(datasets.prompt_file(name))


def _dtypes(args: argparse.Namespace, pair, device) -> dict[str, str]:
    """{"pools": dtype, "decoder": dtype}: --dtype for both, or with auto each measured
    (``precision.workload_dtypes``), the choices printed."""
    if args.dtype != "auto":
        return {"pools": args.dtype, "decoder": args.dtype}
    import torch

    from cactus_theory.real import precision

    choices = precision.workload_dtypes(
        pair.verifier,
        device,
        pool_batch_size=args.batch_size,
        verify_tokens=args.k_max + 1,
        threads=torch.get_num_threads(),
    )
    for role, choice in choices.items():
        print(f"{role}: {choice.describe()}", flush=True)
    return {role: choice.dtype for role, choice in choices.items()}


def run(args: argparse.Namespace) -> int:

    from cactus_theory.cli.decode import device_from_args, set_threads
    from cactus_theory.decode.runs import load_setup
    from cactus_theory.real import costs, pairs, pools, tradeoff
    from cactus_theory.util import provenance

    sampling = _check(args)
    specs = _rules(args)
    shape = _tree_shape(args) if args.tree else None
    set_threads(args.threads)
    device = device_from_args(args.device)
    say = (lambda text: None) if args.quiet else print
    pair = pairs.resolve(args.pair, args.verifier, args.draft, say)
    dataset, prompt_file = _prompts(args, pair)
    dtypes = _dtypes(args, pair, device)
    args.dtype = dtypes["pools"]
    setup = load_setup(pair, device, args.dtype, prompt_file, args.num_prompts, args.raw)
    print(f"verifier {pair.verifier}\ndraft    {pair.draft}\ndataset  {dataset}")
    settings = pools.PoolSettings(
        positions=args.positions,
        num_prompts=args.num_prompts,
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        batch_size=args.batch_size,
        seed=args.seed,
    )
    cache = Path(args.cache) if args.cache else provenance.cache_root() / "pools"
    started = time.perf_counter()
    pool = pools.build_pool(
        setup, settings, cache, device=str(device), dtype=args.dtype, progress=not args.quiet
    )
    print(f"pool: {pools.describe(pool)}")
    if shape is not None:
        return run_tree(args, pool, shape, specs, dataset, started)
    measured = None
    if not args.no_costs:
        timed = setup
        if dtypes["decoder"] != args.dtype:  # the costs in the dtype the decoder would choose
            timed = load_setup(
                pair, device, dtypes["decoder"], prompt_file, args.num_prompts, args.raw
            )
        measured = costs.measure_costs(
            timed, range(1, args.k_max + 1), sampling=sampling, progress=say
        )
        print(
            f"costs: draft c = {measured.draft_cost:.3f}, verify v_k = "
            + ", ".join(f"{v:.2f}" for v in measured.verify_costs.values())
            + f" (k = 1..{args.k_max}) autoregressive steps of {measured.step_seconds * 1e3:.1f} ms"
        )
    stats_started = time.perf_counter()
    result = tradeoff.tradeoff(
        pool,
        specs,
        k_max=args.k_max,
        draft_cost=None if measured is None else measured.draft_cost,
        verify_costs=None if measured is None else measured.verify_costs,
    )
    stats_seconds = time.perf_counter() - stats_started
    data = tradeoff.to_json(
        result,
        pair={"name": pair.name, "verifier": pair.verifier, "draft": pair.draft},
        settings={
            "dataset": dataset,
            "num_prompts": args.num_prompts,
            "max_new_tokens": args.max_new_tokens,
            "sampling": sampling.label,
            "seed": args.seed,
            "dtype": args.dtype,
            "costs_dtype": dtypes["decoder"],
            "device": str(device),
            "k_max": args.k_max,
        },
    )
    data["pool"] = {key: value for key, value in pool.info.items() if key != "settings"}
    data["costs"] = None if measured is None else measured.as_json()
    data["violations"] = tradeoff.dominance_violations(result)
    data["seconds"] = {
        "total": time.perf_counter() - started,
        "statistics": stats_seconds,
    }
    print()
    for line in table_lines(data):
        print(line)
    print()
    print(check_line(data))
    sentence = tradeoff.headline(data, dataset, digits=4)
    if sentence:
        print(sentence)
    _write(args, data, dataset)
    return 0


def run_tree(args, pool, shape, specs, dataset: str, started: float) -> int:
    """``--tree``: the tree trade-off on the pool, printed and written (module docstring)."""
    from cactus_theory.core import trees
    from cactus_theory.real import tree_tradeoff
    from paper_figs.figures_trees import figure_tree_tradeoff

    widths, schemes = shape
    chosen = None
    if specs:
        chosen = {s: [x for x in specs if s in trees.parse(x).schemes] for s in schemes}
    result = tree_tradeoff.tree_tradeoff(pool, widths, schemes, chosen, k_max=args.k_max)
    data = tree_tradeoff.to_json(
        result, dataset=dataset, positions=len(pool), seconds=time.perf_counter() - started
    )
    for line in tree_table_lines(data):
        print(line)
    print()
    if data["violations"]:
        print("FRONTIER VIOLATED (a bug, please report): " + "; ".join(data["violations"]))
    else:
        print(
            f"frontier check: no tree rule exceeds the frontier at its KL ({len(pool):,} positions)"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "tree-tradeoff.json", data, indent=1)
    atomic_write_text(out / "tree-tradeoff.csv", tree_tradeoff.csv_text(data))
    figure = figure_tree_tradeoff(data, out, name="tree-tradeoff")
    if args.json:
        atomic_write_json(args.json, data, indent=1)
    written = [out / "tree-tradeoff.json", out / "tree-tradeoff.csv", figure]
    print("wrote " + ", ".join(str(path) for path in written), file=sys.stderr)
    return 1 if data["violations"] else 0


def _cell(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def tree_table_lines(data: dict) -> list[str]:
    """The tree trade-off as aligned text: per configuration, one line per rule (α of the
    node, KL and TV per token, the frontier at its KL, how it was computed)."""
    lines = []
    for config in data["configurations"]:
        lines.append(f"{config['scheme']} children, K = {config['width']}")
        width = max(len("rule"), *(len(row["rule"]) for row in config["rows"]))
        header = f"  {'rule':<{width}} {'α':>6} {'KL/token':>9} {'TV':>7} {'frontier':>8}  method"
        lines += [header, "  " + "-" * (len(header) - 2)]
        for row in config["rows"]:
            if row["kl_infinite"]:
                kl = "inf"
            else:
                kl = "-" if row["kl_per_token"] is None else _kl_text(row["kl_per_token"])
            lines.append(
                f"  {row['rule']:<{width}} {_cell(row['acceptance']):>6} {kl:>9}"
                f" {_cell(row['tv_per_token']):>7} {_cell(row['frontier_acceptance']):>8}"
                f"  {row['method']}"
            )
        lines.append("")
    return lines


def _write(args: argparse.Namespace, data: dict, dataset: str) -> None:
    from cactus_theory.real import tradeoff
    from paper_figs.figures_real import figure_real_tradeoff

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "tradeoff.json", data, indent=1)
    atomic_write_text(out / "tradeoff.csv", tradeoff.csv_text(data))
    figure = figure_real_tradeoff({dataset: data}, out, name="tradeoff")
    if args.json:
        atomic_write_json(args.json, data, indent=1)
    written = [out / "tradeoff.json", out / "tradeoff.csv", figure.png]
    print("wrote " + ", ".join(str(path) for path in written), file=sys.stderr)


def _kl_text(kl: float | None) -> str:
    if kl is None:
        return "inf"
    return "0" if kl < 1e-12 else f"{kl:.2e}"  # an exact 0 up to float rounding


def table_lines(data: dict) -> list[str]:
    """The trade-off as aligned text: one line per rule (α, KL and TV per token, the
    largest branch KL, the frontier's α at the rule's KL, predicted AL and speed-up at
    ``SHOWN_K``)."""
    k = str(SHOWN_K)
    speeds = any(k in row["predicted_speedup"] for row in data["rows"])
    width = max(len("rule"), *(len(row["rule"]) for row in data["rows"]))
    header = (
        f"{'rule':<{width}} {'α':>6} {'KL/token':>9} {'TV/token':>8} {'branch KL':>9} "
        f"{'frontier':>8} {'AL@' + k:>6}" + (f" {'speed@' + k:>8}" if speeds else "")
    )
    lines = [header, "-" * len(header)]
    for row in data["rows"]:
        branch = row["max_branch_kl"]
        line = (
            f"{row['rule']:<{width}} {row['acceptance']:>6.4f} {_kl_text(row['kl_per_token']):>9}"
            f" {row['tv_per_token']:>8.4f} {'-' if branch is None else f'{branch:.3f}':>9}"
            f" {row['frontier_acceptance']:>8.4f} {row['predicted_al'].get(k, math.nan):>6.3f}"
        )
        if speeds:
            line += f" {row['predicted_speedup'].get(k, math.nan):>7.2f}x"
        lines.append(line)
    return lines


def check_line(data: dict) -> str:
    """Whether the frontier dominated every rule (it must; a violation is a bug)."""
    if data["violations"]:
        return "FRONTIER VIOLATED (a bug, please report): " + "; ".join(data["violations"])
    return (
        f"frontier check: no rule exceeds the frontier at its KL ({len(data['rows'])} rules, "
        f"{data['positions']:,} positions)"
    )
