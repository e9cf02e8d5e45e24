"""``cactus bench pool``: how fast real pools are built, and how fast their exact
statistics are computed.

    cactus bench pool [--dataset NAME_OR_FILE] [--rounds R] [--num-prompts N]
        [--max-new-tokens M] [--batch-size B] [--dtype D ...] [--stats-positions N]
        [--no-stats] [--cache DIR] [--json PATH]

**Building** (``real.pools.build_pool``): each round builds, for every dtype in turn (the
order alternates between rounds, so a slow spell of the shared machine hits both), a fresh
pool with no cache of the first ``--num-prompts`` prompts × ``--max-new-tokens`` tokens,
after one untimed warm-up build per dtype. Per build: positions per second of the
generation (the verifier's own sampled continuations, autoregressive, batched), of the
teacher forcing (one forward of each model over prompt + continuation, then the rows
processed and packed) and of the whole build. Per dtype the median over rounds; per
round the paired ratio of each dtype's rate to the first dtype's, summarised by its
median and the order-statistic interval of ``real.decode_table.median_interval``.
Also printed: context tokens per position, (prompt + generated) / generated, what the
teacher forcing reads per row it yields.

**Statistics** (``real.tradeoff.rule_stats``): the exact acceptance, KL and TV per token
and the largest branch KL of 20 rule settings (``tradeoff.default_rules()`` and
``EXTRA_RULES``) over a pool of ``--stats-positions`` positions (default 20,000), timed
rule by rule. Building 20,000 positions of SmolLM2 takes minutes on a CPU, so that pool is
built once (in ``--stats-dtype``, default bfloat16: the rows are float32 either way) from
the prompts of MT-Bench, HumanEval and the held-out set in turn (``--stats-dataset``), and
cached (default: the user cache); the line says whether it was read back or built.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from cactus_theory.cli.sampling_args import add_sampling_arguments, sampling_from_args
from cactus_theory.core.processors import SamplingSettings
from cactus_theory.util.files import atomic_write_json, check_writable, check_writable_folder

DTYPES = ("float32", "bfloat16", "float16")
#: The two settings added to ``tradeoff.default_rules()``'s 18 for 20.
EXTRA_RULES = ("frontier:delta=1", "cactus-exact:delta=1,divergence=chi2")
#: The prompts of the statistics pool, in this order.
STATS_DATASETS = ("mt-bench", "humaneval", "heldout")
#: What the statistics pool is generated with (beside the sampling flags).
STATS_MAX_NEW_TOKENS = 128
STATS_BATCH_SIZE = 16


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verifier", metavar="PATH_OR_ID", help="verifier; default pair")
    parser.add_argument("--draft", metavar="PATH_OR_ID", help="draft (same tokenizer)")
    parser.add_argument(
        "--dataset",
        default="mt-bench",
        metavar="NAME_OR_FILE",
        help="prompts of the timed builds: mt-bench, humaneval, heldout or a prompt file "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--rounds", type=int, default=6, help="interleaved rounds (default %(default)s)"
    )
    parser.add_argument(
        "--num-prompts", type=int, default=8, help="prompts per build (default %(default)s)"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=32, help="tokens per prompt (default %(default)s)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=8, help="prompts per shard (default %(default)s)"
    )
    parser.add_argument(
        "--dtype",
        nargs="+",
        choices=DTYPES,
        default=["float32", "bfloat16"],
        help="dtypes built side by side; ratios are to the first (default float32 bfloat16)",
    )
    add_sampling_arguments(parser)
    parser.add_argument(
        "--stats-positions",
        type=int,
        default=20_000,
        help="positions of the statistics pool (default %(default)s)",
    )
    parser.add_argument(
        "--stats-dtype",
        choices=DTYPES,
        default="bfloat16",
        help="dtype the statistics pool is built in (default %(default)s)",
    )
    parser.add_argument(
        "--stats-dataset",
        action="append",
        metavar="NAME_OR_FILE",
        help="prompts of the statistics pool, in turn; repeatable (default: "
        f"{', '.join(STATS_DATASETS)})",
    )
    parser.add_argument("--no-stats", action="store_true", help="skip the statistics timing")
    parser.add_argument(
        "--cache",
        metavar="DIR",
        help="where the statistics pool is cached (default: the user cache, $CACTUS_CACHE/pools)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")


def _check(args: argparse.Namespace) -> None:
    for name in ("rounds", "num_prompts", "max_new_tokens", "batch_size", "stats_positions"):
        value = getattr(args, name)
        if value < 1:
            raise ValueError(f"{name}: must be >= 1, got {value}")
    if len(set(args.dtype)) != len(args.dtype):
        raise ValueError(f"dtype: named twice in {' '.join(args.dtype)}")
    if (args.verifier is None) != (args.draft is None):
        raise ValueError("verifier: give both --verifier and --draft, or neither (default pair)")


def _sampling(args: argparse.Namespace) -> SamplingSettings:
    return sampling_from_args(args)


def time_builds(setups: dict, settings, rounds: int) -> dict:
    """Per dtype the list of builds (positions, seconds of generation, teacher forcing and
    the whole build), ``rounds`` interleaved rounds after one warm-up build per dtype."""
    import dataclasses

    from cactus_theory.real import pools

    warm = dataclasses.replace(settings, num_prompts=1, positions=1, max_new_tokens=4)
    for dtype, setup in setups.items():
        pools.build_pool(setup, warm, None, device=str(setup.device), dtype=dtype, progress=False)
    builds = {dtype: [] for dtype in setups}
    order = list(setups)
    for round_index in range(rounds):
        for dtype in order if round_index % 2 == 0 else order[::-1]:
            started = time.perf_counter()
            pool = pools.build_pool(
                setups[dtype],
                dataclasses.replace(settings, seed=round_index),
                None,
                device=str(setups[dtype].device),
                dtype=dtype,
                progress=False,
            )
            builds[dtype].append(
                {
                    "positions": len(pool),
                    "generation_seconds": pool.info["generation_seconds"],
                    "teacher_forcing_seconds": pool.info["teacher_forcing_seconds"],
                    "total_seconds": time.perf_counter() - started,
                }
            )
    return builds


PARTS = (
    ("generation", "generation_seconds"),
    ("teacher_forcing", "teacher_forcing_seconds"),
    ("total", "total_seconds"),
)


def summarise_builds(builds: dict) -> dict:
    """Per dtype the median positions/s of each part, and the paired per-round ratios to
    the first dtype (median, order-statistic interval, its coverage)."""
    from cactus_theory.real.decode_table import median_interval

    def rates(dtype: str, key: str) -> list[float]:
        return [b["positions"] / max(b[key], 1e-12) for b in builds[dtype]]

    first = next(iter(builds))
    summary = {}
    for dtype in builds:
        row = {"positions": statistics.median(b["positions"] for b in builds[dtype])}
        for part, key in PARTS:
            row[part] = statistics.median(rates(dtype, key))
            if dtype != first:
                ratios = [
                    mine / base
                    for mine, base in zip(rates(dtype, key), rates(first, key), strict=True)
                ]
                median, low, high, coverage = median_interval(ratios)
                row[f"{part}_ratio"] = {
                    "median": median,
                    "low": low,
                    "high": high,
                    "coverage": coverage,
                }
        summary[dtype] = row
    return summary


def ratio_text(row: dict) -> str:
    """The paired ratios of a dtype's row: medians, with their interval when there is one
    (one round gives none: a single ratio is printed as such, never as [x, x])."""
    coverage = row["total_ratio"]["coverage"]
    parts = []
    for part, _ in PARTS:
        ratio = row[part + "_ratio"]
        interval = f" [{ratio['low']:.2f}, {ratio['high']:.2f}]" if coverage > 0 else ""
        parts.append(f"{part} {ratio['median']:.2f}x{interval}")
    if coverage > 0:
        note = f"median of paired per-round ratios, interval coverage {100 * coverage:.1f}%"
    else:
        note = "one round: no interval"
    return "  ".join(parts) + f" ({note})"


def verifier_parameters(model) -> int:
    """Parameters of the verifier (a tied embedding and head counted once)."""
    return sum(parameter.numel() for parameter in model.parameters())


def compute_rates(summary: dict, parameters: int, context: float) -> dict:
    """The verifier's arithmetic behind each median rate: ≈ 2·parameters FLOPs per token
    it reads (the embedding lookup aside, every weight is used once in a multiply-add),
    ``context`` tokens read per position in each part; the draft's share is left out."""
    per_token = 2 * parameters / 1e9  # GFLOP
    per_position = per_token * context
    return {
        "parameters": parameters,
        "gflop_per_token": per_token,
        "gflops": {
            dtype: {part: row[part] * per_position for part in ("generation", "teacher_forcing")}
            for dtype, row in summary.items()
        },
        "needed_for_1000": 1000 * 2 * per_position,  # both parts
    }


def stats_rules() -> list[str]:
    """The 20 rule settings timed: ``tradeoff.default_rules()`` and ``EXTRA_RULES``."""
    from cactus_theory.real.tradeoff import default_rules

    return default_rules() + list(EXTRA_RULES)


def time_stats(pool, rules: list[str]) -> list[dict]:
    """Seconds of ``tradeoff.rule_stats`` per rule on ``pool``, with its acceptance."""
    from cactus_theory.real.tradeoff import rule_stats

    timed = []
    for rule in rules:
        started = time.perf_counter()
        found = rule_stats(pool, rule)
        timed.append(
            {
                "rule": rule,
                "seconds": time.perf_counter() - started,
                "acceptance": found.acceptance,
                "kl_per_token": found.kl_per_token,
            }
        )
    return timed


def _stats_pool(args, pair, device, cache: Path, loaded: dict):
    import dataclasses

    from cactus_theory.decode.runs import load_setup, read_prompts
    from cactus_theory.real import pools
    from cactus_theory.real.datasets import prompt_file

    names = args.stats_dataset or STATS_DATASETS
    prompts = [p for name in names for p in read_prompts(str(prompt_file(name)))]
    setup = loaded.get(args.stats_dtype) or load_setup(
        pair, device, args.stats_dtype, str(prompt_file(names[0]))
    )
    setup = dataclasses.replace(setup, prompts=prompts)
    settings = pools.PoolSettings(
        positions=args.stats_positions,
        num_prompts=len(prompts),
        max_new_tokens=STATS_MAX_NEW_TOKENS,
        sampling=_sampling(args),
        batch_size=STATS_BATCH_SIZE,
        seed=0,
    )
    started = time.perf_counter()
    pool = pools.build_pool(
        setup, settings, cache, device=args.device, dtype=args.stats_dtype, name="stats pool"
    )
    if len(pool) < args.stats_positions:
        raise ValueError(
            f"stats_positions: the prompts of {', '.join(names)} give only {len(pool):,} positions"
        )
    part = slice(0, args.stats_positions)
    trimmed = pools.RealPool(
        pool.target_probs[part],
        pool.draft_probs[part],
        None if pool.ids is None else pool.ids[part],
        pool.vocab_size,
        pool.prompt[part],
        pool.step[part],
        pool.token[part],
        {**pool.info, "seconds": time.perf_counter() - started},
    )
    return trimmed


def run(args: argparse.Namespace, default_pair: Callable) -> int:
    import torch

    from cactus_theory.cli.decode import device_from_args, set_threads
    from cactus_theory.decode.runs import Pair, encode, load_setup
    from cactus_theory.real import pools
    from cactus_theory.real.datasets import prompt_file
    from cactus_theory.util import provenance

    _check(args)
    if args.json:
        check_writable("json", args.json)
    cache = Path(args.cache) if args.cache else provenance.cache_root() / "pools"
    if not args.no_stats:
        check_writable_folder("cache", cache)
    sampling = _sampling(args)
    settings = pools.PoolSettings(
        positions=args.num_prompts * args.max_new_tokens,
        num_prompts=args.num_prompts,
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        batch_size=args.batch_size,
    )
    set_threads(args.threads)
    device = device_from_args(args.device)
    pair = default_pair() if args.verifier is None else Pair(args.verifier, args.draft)
    prompts = str(prompt_file(args.dataset))
    setups = {
        dtype: load_setup(pair, device, dtype, prompts, args.num_prompts) for dtype in args.dtype
    }
    first = next(iter(setups.values()))
    _, mask = encode(first, first.prompts)
    prompt_tokens = float(mask.sum(dim=1).float().mean())
    builds = time_builds(setups, settings, args.rounds)
    summary = summarise_builds(builds)
    positions = statistics.median(summary[d]["positions"] for d in summary)
    context = (prompt_tokens + positions / args.num_prompts) / (positions / args.num_prompts)
    threads = torch.get_num_threads()
    print(
        f"\npool building: {args.num_prompts} prompts of {args.dataset} x {args.max_new_tokens} "
        f"new tokens (~{positions:.0f} positions per build), batch {args.batch_size}, "
        f"{sampling.label}, {args.device}, {threads} threads, {args.rounds} interleaved rounds; "
        f"mean prompt {prompt_tokens:.0f} tokens, so {context:.1f} context tokens per position"
    )
    header = f"{'dtype':<9} {'generation':>11} {'teacher f.':>11} {'total':>11}   positions/s"
    print(header + "\n" + "-" * len(header))
    for dtype, row in summary.items():
        print(
            f"{dtype:<9} {row['generation']:>11.1f} {row['teacher_forcing']:>11.1f} "
            f"{row['total']:>11.1f}"
        )
        if "total_ratio" in row:
            print(f"  {dtype} / {args.dtype[0]}: {ratio_text(row)}")
    flops = compute_rates(summary, verifier_parameters(first.verifier), context)
    print(
        f"where the time goes: the verifier has {flops['parameters'] / 1e6:.0f}M parameters, "
        f"≈ {flops['gflop_per_token']:.2f} GFLOP per token it reads; generation and teacher "
        f"forcing each read ≈ {context:.1f} tokens per position (prompt once, then each "
        "generated token), so the median rates above are "
        + ", ".join(
            f"{dtype} {row['generation']:.0f} and {row['teacher_forcing']:.0f} GFLOP/s"
            for dtype, row in flops["gflops"].items()
        )
        + f"; 1,000 positions/s would take ≈ {flops['needed_for_1000']:,.0f} GFLOP/s"
    )
    result = {
        "pair": {"verifier": pair.verifier, "draft": pair.draft},
        "device": args.device,
        "threads": threads,
        "settings": {**settings.key_fields(), "sampling": sampling.label},
        "dataset": args.dataset,
        "prompt_tokens": prompt_tokens,
        "context_tokens_per_position": context,
        "compute": flops,
        "builds": builds,
        "summary": summary,
    }
    if not args.no_stats:
        pool = _stats_pool(args, pair, device, cache, setups)
        rules = stats_rules()
        timed = time_stats(pool, rules)
        total = sum(row["seconds"] for row in timed)
        built = pool.info.get("shards_built", 0)
        print(
            f"\nexact statistics: {len(rules)} rule settings over {len(pool):,} positions "
            f"(packed to {pool.width} columns; pool "
            f"{'built now' if built else 'read from the cache'}: {pool.info.get('folder')}): "
            f"{total:.1f} s in all, {total / len(rules):.2f} s per rule, "
            f"{len(pool) * len(rules) / total:,.0f} position-rules/s"
        )
        for row in timed:
            print(f"  {row['rule']:<40} {row['seconds']:>6.2f} s  α {row['acceptance']:.4f}")
        result["stats"] = {
            "positions": len(pool),
            "width": pool.width,
            "rules": timed,
            "seconds": total,
            "pool_built_now": bool(built),
            "pool_folder": pool.info.get("folder"),
        }
    if args.json:
        atomic_write_json(args.json, result, indent=2)
    return 0
