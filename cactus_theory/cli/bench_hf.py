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
import copy
import dataclasses
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from cactus_theory.core.processors import PAPER_SETTING, SamplingSettings
from cactus_theory.util.files import atomic_write_json, check_writable, check_writable_folder

PAIRS = ("stdlib", "smollm2")
SETTINGS = {"sampled": PAPER_SETTING, "greedy": SamplingSettings(temperature=0.0)}
CACTUS = "cactus:delta=1.0"


@dataclass(frozen=True)
class Config:
    """One row: how to decode (``kind``), with which draft, rule and batch size."""

    kind: str  # "plain", "theirs", "direct" (speculative_generate), "hf" (cactus_generate)
    draft: str | None = None  # "standalone" or "feature"
    rule: str | None = None
    batch: int = 1

    @property
    def label(self) -> str:
        if self.kind in ("plain", "theirs"):
            return self.kind
        name = "sps" if self.rule == "sps" else "cactus δ=1"
        return (
            name
            + ("" if self.kind == "direct" else " hf")
            + (f" b{self.batch}" if self.batch > 1 else "")
        )


@dataclass
class Cell:
    """One config's decoding of every prompt in one round."""

    tokens: int
    seconds: float
    steps: int  # verify steps (plain: tokens)
    accepted: int  # accepted drafts over those steps
    texts: list  # generated token ids per prompt (for the greedy check)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(self.seconds, 1e-12)

    @property
    def acceptance_length(self) -> float:
        return self.accepted / self.steps if self.steps else 0.0


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


# --- the pairs -------------------------------------------------------------------------------


@dataclass
class Group:
    """A verifier, its prompts and its drafts (by kind), and the configs run on them."""

    name: str
    setup: object  # decode.runs.Setup (verifier, tokenizer, prompts, chat)
    drafts: dict
    configs: list

    def draft_description(self, kind: str) -> str:
        return self.setup.extra.get(f"{kind}_description", kind)


def truncated_draft(verifier, layers: int):
    """A standalone draft: a copy of ``verifier`` keeping its first ``layers`` layers (with
    its embedding, final norm and head; no training)."""
    draft = copy.deepcopy(verifier)
    model = draft.model
    model.layers = model.layers[:layers]
    draft.config.num_hidden_layers = layers
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:layers]
    return draft.eval()


def configs_for(drafts: dict, batch: int) -> list[Config]:
    configs = [Config("plain")]
    for kind in drafts:
        if kind == "standalone":
            configs.append(Config("theirs", kind))
        configs += [
            Config("direct", kind, "sps"),
            Config("hf", kind, "sps"),
            Config("hf", kind, CACTUS),
        ]
        if batch > 1:
            configs.append(Config("hf", kind, "sps", batch))
    return configs


def load_groups(args: argparse.Namespace) -> list[Group]:
    import torch

    from cactus_theory.cli.decode import device_from_args
    from cactus_theory.decode.feature_draft import FeatureDraft
    from cactus_theory.decode.runs import Pair, load_setup

    device = device_from_args(args.device)
    if args.verifier or args.draft or args.prompts:
        if not (args.verifier and args.draft and args.prompts):
            raise ValueError("verifier: give --verifier, --draft and --prompts together")
        pairs = [("custom", Pair(args.verifier, args.draft, args.prompts), None)]
    else:
        pairs = [(name, *default_pairs(name, args.dataset)) for name in args.pairs]
    groups = []
    for name, pair, prompts in pairs:
        setup = load_setup(pair, device, args.dtype, prompts, args.num_prompts)
        kind = "feature" if isinstance(setup.draft, FeatureDraft) else "standalone"
        drafts = {kind: setup.draft}
        setup.extra[f"{kind}_description"] = f"{kind} draft {pair.draft}"
        if name == "smollm2":
            drafts = {"standalone": truncated_draft(setup.verifier, args.draft_layers), **drafts}
            setup.extra["standalone_description"] = (
                f"standalone draft: the verifier's first {args.draft_layers} layers"
            )
        for model in drafts.values():
            model.to(device)
        groups.append(Group(name, setup, drafts, configs_for(drafts, args.batch_size)))
    torch.manual_seed(args.seed)
    return groups


def default_pairs(name: str, dataset: str):
    """(Pair, prompt file or None) of a named pair (prompts: ``cactus_theory.real.datasets``)."""
    from cactus_theory.cli import dispatch

    if name == "stdlib":
        return dispatch.stdlib_pair(), None
    from cactus_theory.real.datasets import prompt_file

    return dispatch.default_pair(), str(prompt_file(dataset))


# --- decoding one cell -----------------------------------------------------------------------


def generate_keywords(sampling: SamplingSettings) -> dict:
    """generate()'s sampling keywords for a setting (greedy: do_sample=False)."""
    if sampling.temperature == 0:
        return {"do_sample": False}
    return {
        "do_sample": True,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k or 0,
        "top_p": sampling.top_p,
    }


def generated_count(row: list[int], eos: set[int]) -> int:
    """Tokens a row generated: up to and including its first EOS, else all."""
    for index, token in enumerate(row):
        if token in eos:
            return index + 1
    return len(row)


class ForwardCounter:
    """Counts a model's forward calls while active (the verifier's verify steps)."""

    def __init__(self, model) -> None:
        self.model, self.calls, self.handle = model, 0, None

    def __enter__(self):
        self.handle = self.model.register_forward_hook(self._count)
        return self

    def _count(self, *_) -> None:
        self.calls += 1

    def __exit__(self, *_) -> None:
        self.handle.remove()


def decode_cell(group: Group, config: Config, sampling, args) -> Cell:
    """Every prompt of ``group`` decoded by ``config`` (module docstring)."""
    import torch

    from cactus_theory.decode import speculative_generate
    from cactus_theory.decode.hf import cactus_generate
    from cactus_theory.decode.runs import batches

    setup = group.setup
    verifier, tokenizer = setup.verifier, setup.tokenizer
    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    pad = tokenizer.pad_token_id
    keywords = generate_keywords(sampling)
    draft = group.drafts.get(config.draft)
    tokens = steps = accepted = 0
    seconds = 0.0
    texts = []
    for index, (_, ids, mask) in enumerate(batches(setup, config.batch)):
        ids, mask = ids.to(setup.device), mask.to(setup.device)
        seed = args.seed * 100_003 + index
        common = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": args.max_new_tokens}
        common.update(pad_token_id=pad, eos_token_id=sorted(eos) or None)
        if config.kind in ("plain", "theirs"):
            extra = {} if config.kind == "plain" else {"assistant_model": draft}
            torch.manual_seed(seed)
            with ForwardCounter(verifier) as counter:
                start = time.perf_counter()
                output = verifier.generate(**common, **keywords, **extra)
                seconds += time.perf_counter() - start
            rows = output[:, ids.shape[1] :].tolist()
            counts = [generated_count(row, eos) for row in rows]
            tokens += sum(counts)
            steps += counter.calls
            accepted += sum(counts) - counter.calls
            texts += [row[:count] for row, count in zip(rows, counts, strict=True)]
            continue
        generator = torch.Generator().manual_seed(seed)
        start = time.perf_counter()
        if config.kind == "direct":
            result = speculative_generate(
                verifier, draft, ids, rule=config.rule, k=args.k,
                max_new_tokens=args.max_new_tokens, temperature=sampling.temperature,
                top_k=sampling.top_k, top_p=sampling.top_p, eos_token_id=sorted(eos),
                pad_token_id=pad, generator=generator, attention_mask=mask,
            )  # fmt: skip
            seconds += time.perf_counter() - start
            counts, lengths = result.num_generated, result.accepted_lengths
        else:
            result = verifier.generate(
                **common, **keywords, custom_generate=cactus_generate, draft_model=draft,
                rule=config.rule, k=args.k, generator=generator, return_dict_in_generate=True,
            )  # fmt: skip
            seconds += time.perf_counter() - start
            counts, lengths = result.num_generated, result.accepted_lengths
        active = lengths >= 0  # [steps, B]
        tokens += int(counts.sum())
        steps += int(active.sum())
        accepted += int(lengths[active].sum())
        rows = result.sequences[:, ids.shape[1] :].tolist()
        texts += [row[:count] for row, count in zip(rows, counts.tolist(), strict=True)]
    return Cell(tokens, seconds, steps, accepted, texts)


def set_assistant(draft, k: int) -> None:
    """Assisted generation with k fixed: k drafts per step, constant, no confidence stop."""
    config = draft.generation_config
    config.num_assistant_tokens = k
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = None


def assistant_processing(group: Group, sampling: SamplingSettings, args) -> dict:
    """How often transformers applies the sampling processors to the assistant: the law of
    its first draft after the first prompt against its logits through the processors
    once and twice (max |difference| of the probabilities)."""
    import torch
    from transformers.generation import candidate_generator
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    from cactus_theory.decode.runs import batches

    setup, draft = group.setup, group.drafts["standalone"]
    _, ids, mask = next(batches(setup, 1))
    ids, mask = ids.to(setup.device), mask.to(setup.device)
    seen = []
    original = candidate_generator.AssistedCandidateGenerator._generate_candidates

    def spy(self, arguments):
        candidates, logits = original(self, arguments)
        seen.append(logits[:, 0].float())  # [1, V] the processed scores of draft 1
        return candidates, logits

    candidate_generator.AssistedCandidateGenerator._generate_candidates = spy
    try:
        torch.manual_seed(args.seed)
        setup.verifier.generate(
            input_ids=ids, attention_mask=mask, assistant_model=draft, max_new_tokens=2,
            pad_token_id=setup.tokenizer.pad_token_id, **generate_keywords(sampling),
        )  # fmt: skip
    finally:
        candidate_generator.AssistedCandidateGenerator._generate_candidates = original
    with torch.no_grad():
        logits = draft(input_ids=ids, attention_mask=mask).logits[:, -1].float()  # [1, V]
    warpers = [
        TemperatureLogitsWarper(sampling.temperature),
        TopKLogitsWarper(sampling.top_k),
        TopPLogitsWarper(sampling.top_p),
    ]
    applied = {}
    for times in (1, 2):
        scores = logits.clone()
        for _ in range(times):
            for warper in warpers:
                scores = warper(ids, scores)
        difference = (scores.softmax(-1) - seen[0].softmax(-1)).abs().max()
        applied[f"{times}x"] = float(difference)
    return applied


# --- the run ---------------------------------------------------------------------------------


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


def summarise(groups: list[Group], cells: dict, args) -> list[dict]:
    """One table per (pair, setting): rows with tokens/s, AL and speed-up [interval], and
    the paired comparisons (ours/theirs, generate()/direct, best each)."""
    from cactus_theory.real.decode_table import median_interval

    tables = []
    rounds = range(args.repeats)
    for group in groups:
        for setting in args.settings:

            def speeds(config, setting=setting, group=group):
                return [cells[group.name, setting, config, r].tokens_per_second for r in rounds]

            def ratio(top, bottom, speeds=speeds):
                values = [a / b for a, b in zip(speeds(top), speeds(bottom), strict=True)]
                median, low, high, coverage = median_interval(values)
                return {"median": median, "low": low, "high": high, "coverage": coverage}

            plain = group.configs[0]
            rows = []
            for config in group.configs:
                first = cells[group.name, setting, config, 0]
                rows.append(
                    {
                        "config": config.label,
                        "draft": config.draft,
                        "tokens_per_second": statistics.median(speeds(config)),
                        "acceptance_length": first.acceptance_length,
                        "tokens": first.tokens,
                        "speedup": ratio(config, plain),
                        "rounds_agree": all(
                            cells[group.name, setting, config, r].texts == first.texts
                            for r in rounds
                        ),
                    }
                )
            comparisons = {}
            by = {(c.kind, c.draft, c.rule, c.batch): c for c in group.configs}
            theirs = by.get(("theirs", "standalone", None, 1))
            for draft in group.drafts:
                direct = by[("direct", draft, "sps", 1)]
                via_hf = by[("hf", draft, "sps", 1)]
                comparisons[f"{draft}: sps hf / sps (generate() / direct)"] = ratio(via_hf, direct)
                if theirs is not None:
                    comparisons[f"{draft}: sps / theirs"] = ratio(direct, theirs)
                    comparisons[f"{draft}: sps hf / theirs"] = ratio(via_hf, theirs)
                    comparisons[f"{draft}: cactus δ=1 hf / theirs"] = ratio(
                        by[("hf", draft, CACTUS, 1)], theirs
                    )
            reference = cells[group.name, setting, plain, 0].texts
            greedy_same = None
            if SETTINGS[setting].temperature == 0:
                greedy_same = [
                    row["config"]
                    for row, config in zip(rows, group.configs, strict=True)
                    if cells[group.name, setting, config, 0].texts != reference
                ]
            tables.append(
                {
                    "pair": group.name,
                    "setting": setting,
                    "sampling": dataclasses.asdict(SETTINGS[setting]),
                    "drafts": {kind: group.draft_description(kind) for kind in group.drafts},
                    "rows": rows,
                    "comparisons": comparisons,
                    "greedy_differs": greedy_same,
                }
            )
    return tables


def interval_text(value: dict) -> str:
    """ "1.23x [1.10, 1.31]"; without the interval when there is none (one round, or a
    row against itself)."""
    if value["coverage"] <= 0.0 or value["low"] == value["high"]:
        return f"{value['median']:.2f}x"
    return f"{value['median']:.2f}x [{value['low']:.2f}, {value['high']:.2f}]"


def table_lines(table: dict) -> list[str]:
    sampling = table["sampling"]
    name = "greedy"
    if sampling["temperature"] > 0:
        name = f"T={sampling['temperature']:g}, top-k {sampling['top_k']}, "
        name += f"top-p {sampling['top_p']:g}"
    lines = [f"\n{table['pair']}, {name}"]
    lines += [f"  {text}" for text in table["drafts"].values()]
    header = f"  {'config':<18} {'draft':<11} {'tokens/s':>9} {'AL':>5} {'speed-up [interval]':>22}"
    lines += [header, "  " + "-" * (len(header) - 2)]
    for row in table["rows"]:
        lines.append(
            f"  {row['config']:<18} {row['draft'] or '-':<11} {row['tokens_per_second']:>9.1f} "
            f"{row['acceptance_length']:>5.2f} {interval_text(row['speedup']):>22}"
        )
    for label, value in table["comparisons"].items():
        lines.append(f"  {label}: {interval_text(value)}")
    if table["greedy_differs"] is not None:
        differing = table["greedy_differs"]
        lines.append(
            "  greedy: every config emitted the plain generate() tokens"
            if not differing
            else "  greedy: tokens differ from plain generate() for " + ", ".join(differing)
        )
    return lines


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
