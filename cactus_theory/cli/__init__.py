"""The ``cactus`` command and the benchmarks: the only layer that imports every other one.

``main`` dispatches (``cli.dispatch``); each subcommand is a module with ``configure(parser)``
and ``run(args)``: ``decode`` (``cactus decode``), ``bench_law``, ``bench_sampler``,
``bench_decode`` (``cactus bench ...``). ``cactus report``, ``cactus check``,
``cactus train-pair`` and ``cactus bench solvers`` live with their packages
(``paper_figs``, ``proofs_check``, ``sims``).
"""

from cactus_theory.cli.dispatch import COMMANDS, build_parser, main

__all__ = ["COMMANDS", "build_parser", "main"]
