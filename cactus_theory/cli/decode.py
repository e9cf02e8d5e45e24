"""``cactus decode``: speculative decoding with a rule on two Hugging Face causal LMs.

    cactus decode --verifier PATH_OR_ID --draft PATH_OR_ID --rule cactus --delta 1.0 -k 10 \\
        --prompts FILE [--device cuda] [--dtype bfloat16] [--batch-size N] [--max-kl NATS]

Without --verifier/--draft it uses the default pair (``cactus_theory.cli.dispatch``) and,
without --prompts, that pair's prompts. Prompts go through the tokenizer's chat template
when it has one (``--raw`` sends them as plain text). It prints each generation, then a
summary: AL (mean accepted drafts per verify step, bonus excluded, as in the paper),
tokens per verifier call, tokens/s, the divergence meter (mean KL(μ ‖ q) per token and
per sequence, ``cactus_theory.decode.meter``), the speed-up over plain autoregressive
decoding of the same prompts with the same settings (measured in the same run), the
acceptance histogram and the verifier NLL of both outputs.

Prompt files: ``.jsonl`` holds one JSON string or {"prompt": "..."} object per line; any
other file holds one prompt per non-empty line, with ``\\n`` and ``\\t`` read as escapes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cactus_theory.core import rules
from cactus_theory.core.processors import PAPER_SETTING
from cactus_theory.util.files import atomic_write_json, check_writable

DTYPES = ("float32", "bfloat16", "float16")
#: The flags that set one rule parameter each (merged into --rule).
PARAMETER_FLAGS = ("delta", "alpha", "epsilon", "divergence")


@dataclass(frozen=True)
class Pair:
    """A verifier/draft pair (paths or hub ids) and the prompts that go with it."""

    verifier: str
    draft: str
    prompts: str | None = None
    name: str = "custom"


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
        "--num-prompts", type=int, help="use only the first N prompts (default: all)"
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
        "--dtype", default="float32", choices=DTYPES, help="model weights dtype (default float32)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=8, help="prompts decoded together (default %(default)s)"
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
        default="cactus",
        help="rule name or spec, e.g. cactus, sps, frontier, topk:k=5 (default cactus); "
        f"one of {', '.join(rules.NAMES)}",
    )
    parser.add_argument("--delta", type=float, help="δ for cactus, cactus-exact, frontier")
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
        help="cap every sequence's total KL(emitted ‖ verifier) at NATS (rules with a δ)",
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the autoregressive baseline"
    )
    parser.add_argument("--quiet", action="store_true", help="do not print the generations")
    parser.add_argument("--json", metavar="PATH", help="also write the summary as JSON")


def rule_from_args(args: argparse.Namespace) -> rules.Rule:
    """``--rule`` (name or spec) with --delta/--alpha/--epsilon/--divergence merged in; a
    parameter given both in the spec and as a flag is an error."""
    from cactus_theory.decode import parse_rule

    spec = args.rule
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


def check_pair(verifier, verifier_tokenizer, draft, draft_tokenizer) -> None:
    """The draft must share the verifier's tokenizer and output vocabulary."""
    from cactus_theory.decode.checks import vocab_size

    verifier_vocab, draft_vocab = verifier_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if verifier_vocab != draft_vocab:
        differing = len(set(verifier_vocab.items()) ^ set(draft_vocab.items()))
        raise ValueError(
            f"draft: its tokenizer differs from the verifier's ({len(draft_vocab)} vs "
            f"{len(verifier_vocab)} tokens, {differing} (token, id) pairs differ)"
        )
    if vocab_size(verifier) != vocab_size(draft):
        raise ValueError(
            f"draft: output vocabulary {vocab_size(draft)} differs from the verifier's "
            f"{vocab_size(verifier)}"
        )
    if len(verifier_tokenizer) > vocab_size(verifier):
        raise ValueError(
            f"verifier: tokenizer has {len(verifier_tokenizer)} tokens but the model only "
            f"{vocab_size(verifier)} outputs"
        )


def read_prompts(path: str) -> list[str]:
    """The prompts of a file (module docstring); ValueError naming the file and the line
    for a missing file, bytes that are not UTF-8, bad JSON, a JSON object without a
    "prompt" key or a prompt that is not a string."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"prompts: file {path!r} does not exist")
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise ValueError(
            f"prompts: {path} is not UTF-8 text ({error.reason} at byte {error.start})"
        ) from None
    if file.suffix != ".jsonl":
        prompts = [line.replace("\\n", "\n").replace("\\t", "\t") for line in lines if line.strip()]
    else:
        prompts = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"prompts: line {number} of {path} is not JSON ({error})"
                ) from None
            if isinstance(item, dict):
                if "prompt" not in item:
                    raise ValueError(f'prompts: line {number} of {path} has no "prompt" key')
                item = item["prompt"]
            if not isinstance(item, str):
                raise ValueError(
                    f"prompts: line {number} of {path}: the prompt must be a string, got "
                    f"{type(item).__name__}"
                )
            prompts.append(item)
    if not prompts:
        raise ValueError(f"prompts: file {path!r} holds no prompt")
    return prompts


@dataclass
class Setup:
    """Loaded models, tokenizer, prompts and settings for a decode or benchmark run."""

    verifier: object
    draft: object
    tokenizer: object
    prompts: list[str]
    device: object
    pair: Pair
    chat: bool
    extra: dict = field(default_factory=dict)


def setup_from_args(args: argparse.Namespace, default_pair: Callable[[], Pair]) -> Setup:
    """Validate the shared arguments, load the pair and the prompts."""
    import torch

    from cactus_theory.core.processors import SamplingSettings
    from cactus_theory.decode.loading import load_model

    for key in ("max_new_tokens", "batch_size"):
        if getattr(args, key) < 1:
            raise ValueError(f"{key}: must be >= 1, got {getattr(args, key)}")
    if args.num_prompts is not None and args.num_prompts < 1:
        raise ValueError(f"num_prompts: must be >= 1, got {args.num_prompts}")
    SamplingSettings(args.temperature, args.top_k or None, args.top_p)  # validates
    set_threads(args.threads)
    device = device_from_args(args.device)
    if (args.verifier is None) != (args.draft is None):
        raise ValueError("verifier: give both --verifier and --draft, or neither (default pair)")
    if args.verifier is None:
        pair = default_pair()
    else:
        pair = Pair(args.verifier, args.draft)
    prompts = read_prompts(args.prompts or pair.prompts) if (args.prompts or pair.prompts) else None
    if prompts is None:
        raise ValueError("prompts: this pair has no default prompts; pass --prompts FILE")
    verifier, verifier_tokenizer = load_model("verifier", pair.verifier, device, args.dtype)
    draft, draft_tokenizer = load_model("draft", pair.draft, device, args.dtype)
    check_pair(verifier, verifier_tokenizer, draft, draft_tokenizer)
    if args.num_prompts:
        prompts = prompts[: args.num_prompts]
    tokenizer = verifier_tokenizer
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    chat = bool(getattr(tokenizer, "chat_template", None)) and not args.raw
    torch.manual_seed(args.seed)
    return Setup(verifier, draft, tokenizer, prompts, device, pair, chat)


def encode(setup: Setup, prompts: list[str]):
    """(input_ids [B, P], attention_mask [B, P]) left-padded, through the chat template
    (one user turn, generation prompt added) when ``setup.chat``."""
    tokenizer = setup.tokenizer
    if setup.chat:
        texts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            for prompt in prompts
        ]
        encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    else:
        encoded = tokenizer(prompts, return_tensors="pt", padding=True)
    if encoded.input_ids.shape[1] == 0:
        raise ValueError("prompts: a batch of empty prompts")
    return encoded.input_ids, encoded.attention_mask


def batches(setup: Setup, batch_size: int):
    """(prompts, input_ids, attention_mask) per batch, left-padded."""
    for start in range(0, len(setup.prompts), batch_size):
        chunk = setup.prompts[start : start + batch_size]
        yield (chunk, *encode(setup, chunk))


# --- running and summarising ------------------------------------------------------------------


@dataclass
class Totals:
    """Accumulated over batches: tokens, seconds, accepted counts, NLL, the meter."""

    tokens: int = 0
    seconds: float = 0.0
    verifier_calls: int = 0
    accepted: list[int] = field(default_factory=list)
    nll_sum: float = 0.0
    texts: list[str] = field(default_factory=list)
    sequence_kl: list[float] = field(default_factory=list)
    sequence_tv: list[float] = field(default_factory=list)
    timing: dict = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(self.seconds, 1e-12)

    @property
    def acceptance_length(self) -> float:
        """AL: mean accepted drafts per verify step (bonus excluded, as in the paper)."""
        return sum(self.accepted) / len(self.accepted) if self.accepted else 0.0

    @property
    def tokens_per_call(self) -> float:
        """Tokens per verifier call: AL + 1."""
        return 1.0 + self.acceptance_length

    @property
    def nll(self) -> float:
        return self.nll_sum / max(self.tokens, 1)

    @property
    def metered(self) -> bool:
        return bool(self.sequence_kl)

    @property
    def kl_per_token(self) -> float | None:
        """Σ_rows Σ_t KL(μ_t ‖ q_t) / tokens (nats per generated token)."""
        return sum(self.sequence_kl) / max(self.tokens, 1) if self.metered else None

    @property
    def kl_per_sequence(self) -> float | None:
        """Mean over rows of Σ_t KL(μ_t ‖ q_t) (nats per sequence)."""
        return sum(self.sequence_kl) / len(self.sequence_kl) if self.metered else None

    @property
    def tv_per_token(self) -> float | None:
        return sum(self.sequence_tv) / max(self.tokens, 1) if self.metered else None

    def add(self, result, verifier, mask, tokenizer) -> None:
        from cactus_theory.decode import verifier_nll

        self.tokens += result.total_tokens
        self.seconds += result.timing["total"]
        self.verifier_calls += result.timing["verifier_calls"]
        for key, value in result.timing.items():
            self.timing[key] = self.timing.get(key, 0) + value
        valid = result.accepted_lengths[result.accepted_lengths >= 0]
        self.accepted.extend(valid.tolist())
        if result.sequence_kl is not None:
            self.sequence_kl.extend(result.sequence_kl.tolist())
            self.sequence_tv.extend(result.sequence_tv.tolist())
        if result.total_tokens:
            self.nll_sum += verifier_nll(verifier, result, mask) * result.total_tokens
        self.texts.extend(
            tokenizer.decode(tokens, skip_special_tokens=True) for tokens in result.new_tokens
        )


def generate_all(setup: Setup, args, rule, k: int | None, *, baseline: bool, progress=True):
    """Decode every prompt batch; speculative with ``rule`` and ``k`` or the baseline."""
    import torch
    from tqdm.auto import tqdm

    from cactus_theory import decode

    function = decode.autoregressive_generate if baseline else decode.speculative_generate
    totals = Totals()
    generator = torch.Generator().manual_seed(args.seed)
    label = "baseline" if baseline else f"{rule.label} k={k}"
    count = -(-len(setup.prompts) // args.batch_size)
    metered = not getattr(args, "no_divergence", False)
    for _, input_ids, mask in tqdm(
        batches(setup, args.batch_size), total=count, desc=label, disable=not progress
    ):
        result = function(
            setup.verifier,
            setup.draft,
            input_ids,
            rule=rule,
            k=k,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k or None,
            top_p=args.top_p,
            eos_token_id=setup.tokenizer.eos_token_id,
            pad_token_id=setup.tokenizer.pad_token_id,
            generator=generator,
            attention_mask=mask,
            divergence=metered and not baseline,
            max_kl=None if baseline else getattr(args, "max_kl", None),
        )
        totals.add(result, setup.verifier, mask, setup.tokenizer)
    return totals


def warm_up(setup: Setup, args, rule, k: int) -> None:
    """One short generation of each kind, so one-time costs stay out of the timings."""
    from cactus_theory import decode

    _, input_ids, mask = next(batches(setup, min(args.batch_size, 2)))
    for function in (decode.speculative_generate, decode.autoregressive_generate):
        function(
            setup.verifier,
            setup.draft,
            input_ids,
            rule=rule,
            k=k,
            max_new_tokens=4,
            temperature=args.temperature,
            top_k=args.top_k or None,
            top_p=args.top_p,
            attention_mask=mask,
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


def run(args: argparse.Namespace, default_pair: Callable[[], Pair]) -> int:
    from cactus_theory.core import validate

    if args.json:
        check_writable("json", args.json)
    rule = rule_from_args(args)
    k = validate.positive_int("k", args.k)
    if args.max_kl is not None and args.no_divergence:
        raise ValueError("max_kl: needs the divergence meter (drop --no-divergence)")
    setup = setup_from_args(args, default_pair)
    warm_up(setup, args, rule, k)
    speculative = generate_all(setup, args, rule, k, baseline=False)
    baseline = None if args.no_baseline else generate_all(setup, args, rule, k, baseline=True)
    bold, plain = ("\033[1m", "\033[0m") if sys.stdout.isatty() else ("", "")
    if not args.quiet:
        for index, (prompt, text) in enumerate(zip(setup.prompts, speculative.texts, strict=True)):
            print(f"--- prompt {index + 1} ---\n{prompt}\n{bold}{text}{plain}")
    settings = f"T={args.temperature:g}, top-k={args.top_k or 'off'}, top-p={args.top_p:g}"
    cap = "" if args.max_kl is None else f", max KL {args.max_kl:g} nats/sequence"
    print(
        f"\nrule {rule.label}, k={k}{cap}, {settings}; {len(setup.prompts)} prompts x "
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
        "rule": rules.spec_of(rule),
        "k": k,
        "max_kl": args.max_kl,
        "prompts": len(setup.prompts),
        "max_new_tokens": args.max_new_tokens,
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
            "accepted_histogram": [speculative.accepted.count(v) for v in range(k + 1)],
            "timing_s": speculative.timing,
        },
    }
    if baseline is not None:
        speedup = speculative.tokens_per_second / max(baseline.tokens_per_second, 1e-12)
        print(
            f"baseline:    {baseline.tokens_per_second:,.1f} tokens/s "
            f"({baseline.verifier_calls} calls), verifier NLL {baseline.nll:.3f} nats/token"
        )
        print(f"speed-up:    {speedup:.2f}x (tokens/s, same prompts, same run)")
        summary["baseline"] = {
            "tokens_per_second": baseline.tokens_per_second,
            "tokens": baseline.tokens,
            "verifier_nll": baseline.nll,
        }
        summary["speedup"] = speedup
    print("accepted drafts per verify step:")
    print("\n".join(histogram_lines(speculative.accepted, k)))
    if args.json:
        atomic_write_json(args.json, summary, indent=2)
    return 0
