"""The sampling flags of the commands that build real pools (``cactus tradeoff``, ``cactus
bench pool``, ``cactus bench theory``): the contexts are the verifier's own sampled
continuations, so the temperature must be positive (at temperature 0 every rule reduces to
greedy matching and a pool says nothing)."""

from __future__ import annotations

import argparse

from cactus_theory.core.processors import PAPER_SETTING, SamplingSettings


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """--temperature, --top-k, --top-p, defaulting to the paper's setting."""
    parser.add_argument(
        "--temperature",
        type=float,
        default=PAPER_SETTING.temperature,
        help="sampling temperature, > 0 (default %(default)s, the paper's)",
    )
    parser.add_argument(
        "--top-k", type=int, default=PAPER_SETTING.top_k, help="top-k, 0 = off (default 20)"
    )
    parser.add_argument(
        "--top-p", type=float, default=PAPER_SETTING.top_p, help="top-p, 1 = off (default 0.95)"
    )


def sampling_from_args(args: argparse.Namespace) -> SamplingSettings:
    """The settings of those flags; ValueError naming the flag when one is out of range."""
    if not args.temperature > 0:
        raise ValueError(
            f"temperature: must be > 0 (a pool needs sampled contexts), got {args.temperature}"
        )
    return SamplingSettings(args.temperature, args.top_k or None, args.top_p)
