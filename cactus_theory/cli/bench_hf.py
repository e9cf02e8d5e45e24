"""``cactus bench hf``: the decoder through ``model.generate()`` against transformers' own
assisted generation, side by side in one run.

For each pair and each sampling setting (the paper's T = 0.6, top-k 20, top-p 0.95, and
greedy) every config decodes the same prompts, one call per prompt (batch 1) unless said:

    plain          model.generate() alone: the baseline of every speed-up;
    theirs         model.generate(assistant_model=draft): transformers' assisted generation
                   with k fixed (num_assistant_tokens = k, schedule "constant", confidence
                   threshold off);
    sps            speculative_generate(rule="sps") called directly;
    sps hf         model.generate(custom_generate=cactus_generate, rule="sps");
    cactus hf      the same with rule="cactus:delta=1.0";
    sps hf bB      sps hf with B prompts per call (theirs runs batch 1 only).

**Pairs.** ``stdlib``: the pair of ``cactus train-pair`` (a trained standalone draft) on its
own held-out prompts (MT-Bench's English chat is outside what it learnt). ``smollm2``:
SmolLM2-135M-Instruct on MT-Bench's first turns through the chat template, with two
drafts: a standalone draft transformers can run (the verifier's first ``--draft-layers``
layers with its final norm and head, no training) and, for our configs only, the shipped
feature draft, which reads the verifier's hidden states and which assisted generation
cannot run. ``--verifier/--draft/--prompts`` bench any other pair instead.

**Timing.** ``--repeats`` interleaved rounds over every (pair, setting, config) cell, so a
slow spell on a shared machine hits every config alike; tokens/s = generated tokens (EOS
included) / wall seconds of the calls. The speed-up over plain, ours/theirs and
generate()/direct are medians of the per-round paired ratios with the order-statistic
interval of ``cactus_theory.real.decode_table.median_interval`` (R >= 6: coverage >= 95%;
fewer rounds: the range, its coverage stated). Every call is reseeded (prompt i, seed s:
the same for every config), so a config's tokens are the same in every round on CPU.

**AL** = accepted drafts per verify step: ours from the decoder's accepted counts; theirs
= generated tokens / verifier forwards − 1 (a forward hook counts the verifier's calls;
assisted generation's first forward is its first verify step; its last step can emit
tokens past the budget that are cut, so this can read a little low). At greedy every
config must emit the same tokens (the verifier's greedy text); the run checks it.

**The assistant's processors.** At T = 0.6 the run also re-measures whether transformers
applies the sampling processors twice to the assistant (``AssistedCandidateGenerator``
passes the verifier's processors, temperature included, as ``logits_processor`` to the
assistant's ``generate()``, which appends its own from the same generation config): the
law of the assistant's first draft is compared with its logits through the processors
once and twice.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from cactus_theory.cli.bench_hf_cells import (
    CACTUS,
    PAIRS,
    SETTINGS,
    Cell,
    Config,
    Group,
    assistant_processing,
    decode_cell,
    load_groups,
    set_assistant,
)
from cactus_theory.cli.bench_hf_tables import summarise, table_lines
from cactus_theory.util.files import atomic_write_json, check_writable, check_writable_folder

__all__ = ["CACTUS", "PAIRS", "SETTINGS", "configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pairs",
        nargs="+",
        choices=PAIRS,
        default=list(PAIRS),
        help="pairs to bench (default: both; module docstring)",
    )
    parser.add_argument("--verifier", metavar="PATH", help="bench this verifier instead")
    parser.add_argument("--draft", metavar="PATH", help="its draft (standalone or feature)")
    parser.add_argument("--prompts", metavar="FILE", help="its prompt file")
    parser.add_argument(
        "--dataset",
        default="mt-bench",
        help="SmolLM2's prompts: mt-bench, humaneval, heldout or a file (default mt-bench)",
    )
    parser.add_argument(
        "--settings",
        nargs="+",
        choices=list(SETTINGS),
        default=list(SETTINGS),
        help="sampled = T 0.6, top-k 20, top-p 0.95; greedy (default: both)",
    )
    parser.add_argument("--num-prompts", type=int, default=6, help="prompts (default 6)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=48, help="tokens per prompt (default 48)"
    )
    parser.add_argument("-k", type=int, default=3, help="drafts per verify step (default 3)")
    parser.add_argument(
        "--batch-size", type=int, default=4, help="prompts per call of the batch rows (default 4)"
    )
    parser.add_argument(
        "--draft-layers",
        type=int,
        default=2,
        help="SmolLM2's standalone draft: its first N layers (default 2)",
    )
    parser.add_argument(
        "--repeats", type=int, default=6, help="interleaved rounds (default 6; >= 6 for 95%%)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("float32", "bfloat16", "float16"),
        help="model weights (default bfloat16, as the benchmarks in docs/benchmarks.md)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--cache", metavar="DIR", help="cache finished cells: a rerun resumes")
    parser.add_argument("--json", metavar="PATH", help="also write the tables as JSON")


def check_arguments(args: argparse.Namespace) -> None:
    for name in ("num_prompts", "max_new_tokens", "k", "batch_size", "draft_layers", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    if args.threads < 1:
        raise ValueError(f"threads: must be >= 1, got {args.threads}")
    if args.json:
        check_writable("json", args.json)
    if args.cache:
        check_writable_folder("cache", args.cache)


def cell_path(args, group: Group, setting: str, config: Config, round_index: int):
    """The cache file of a cell (keyed by every setting, the pair and the code)."""
    if not args.cache:
        return None
    from cactus_theory.util import provenance

    key = provenance.fingerprint(
        {name: value for name, value in vars(args).items() if not name.startswith("_")}
        | {"cache": None, "json": None, "settings": None, "pairs": None, "repeats": None},
        group.name,
        group.setup.pair.verifier,
        group.setup.pair.draft,
        group.setup.prompts,
        dataclasses.asdict(config),
        setting,
        provenance.source_fingerprint("cactus_theory/decode", "cactus_theory/sampler"),
    )
    return Path(args.cache) / f"hf-{key}-round{round_index}.json"


def measure(groups: list[Group], args) -> dict:
    """Every cell of every round, interleaved; cached cells are read back."""
    from tqdm.auto import tqdm

    cells = {}
    plan = [
        (group, setting, config)
        for group in groups
        for setting in args.settings
        for config in group.configs
    ]
    warmed = set()
    with tqdm(total=len(plan) * args.repeats, desc="bench hf") as bar:
        for round_index in range(args.repeats):
            for group, setting, config in plan:
                path = cell_path(args, group, setting, config, round_index)
                cell = _load(path)
                if cell is None:
                    if group.name not in warmed:  # one-time costs stay out of the timings
                        _warm(group, args)
                        warmed.add(group.name)
                    cell = decode_cell(group, config, SETTINGS[setting], args)
                    if path is not None:
                        atomic_write_json(path, dataclasses.asdict(cell))
                cells[group.name, setting, config, round_index] = cell
                bar.update()
    return cells


def _warm(group: Group, args) -> None:
    """Every config once on the first prompt for 4 tokens (one-time costs)."""
    short = argparse.Namespace(**{**vars(args), "max_new_tokens": 4})
    for config in group.configs:
        decode_cell(_first_prompt(group), config, SETTINGS[args.settings[0]], short)


def _first_prompt(group: Group) -> Group:
    setup = dataclasses.replace(group.setup, prompts=group.setup.prompts[:1])
    return dataclasses.replace(group, setup=setup)


def _load(path) -> Cell | None:
    if path is None or not path.exists():
        return None
    try:
        return Cell(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def run(args: argparse.Namespace) -> int:
    import torch
    import transformers

    check_arguments(args)
    torch.set_num_threads(args.threads)
    groups = load_groups(args)
    for group in groups:
        if "standalone" in group.drafts:
            set_assistant(group.drafts["standalone"], args.k)
    findings = {}
    if "sampled" in args.settings:
        for group in groups:
            if "standalone" in group.drafts:
                findings[group.name] = assistant_processing(group, SETTINGS["sampled"], args)
    cells = measure(groups, args)
    tables = summarise(groups, cells, args)
    coverage = tables[0]["rows"][-1]["speedup"]["coverage"] if tables else 0.0
    intervals = (
        "no intervals (one round)"
        if args.repeats < 2
        else "intervals: order statistics of the per-round paired ratios (coverage "
        f"{100 * coverage:.1f}%)"
    )
    print(
        f"\n{args.num_prompts} prompts x {args.max_new_tokens} new tokens, k={args.k}, "
        f"{args.device} {args.dtype}, {torch.get_num_threads()} thread(s), seed {args.seed}, "
        f"transformers {transformers.__version__}; tokens/s: median of {args.repeats} "
        f"interleaved rounds; {intervals}"
    )
    for table in tables:
        print("\n".join(table_lines(table)))
    for name, applied in findings.items():
        twice = applied["2x"] < applied["1x"]
        print(
            f"\n{name}: the assistant's first draft law vs its logits through temperature, "
            f"top-k, top-p once: max |Δ| {applied['1x']:.2e}; twice: {applied['2x']:.2e} -> "
            + ("applied twice (the draft samples at T² = "
               f"{SETTINGS['sampled'].temperature ** 2:g})" if twice else "applied once")
        )  # fmt: skip
    print(
        "\nAL = accepted drafts per verify step (theirs: tokens / verifier forwards − 1); "
        "speed-up = over plain generate() of the same round"
    )
    if args.json:
        atomic_write_json(
            args.json,
            {"arguments": {k: v for k, v in vars(args).items() if not k.startswith("_")},
             "transformers": transformers.__version__, "tables": tables,
             "assistant_processors": findings},
            indent=2,
        )  # fmt: skip
    return 0
