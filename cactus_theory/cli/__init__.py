"""The ``cactus`` command and the benchmarks: the only layer that imports every other one.

``main`` dispatches (``cli.dispatch``, whose ``COMMANDS`` is the table below); each
subcommand is a module with ``configure(parser)`` and ``run(args)``, imported only when
it runs. Every command and the module that holds it:

- ``cactus report``: ``paper_figs.cli`` (sweeps, claims, figures -> report.html);
- ``cactus check``: ``proofs_check.cli`` (an exact verdict for every claim);
- ``cactus decode``: ``cactus_theory.cli.decode`` (speculative decoding with a rule);
- ``cactus tradeoff``: ``cactus_theory.cli.tradeoff`` (the exact trade-off on a real pair);
- ``cactus conform``: ``cactus_theory.cli.conform`` (engines' verify steps against the
  exact law of the rule they claim: ``cactus_theory.testing.conformance``);
- ``cactus serve``: ``cactus_theory.cli.serve`` (vLLM's OpenAI server with a rule);
- ``cactus train-pair``: ``cactus_theory.real.train_pair`` (the small stdlib pair);
- ``cactus train-draft``: ``cactus_theory.real.distill`` (the SmolLM2 feature draft);
- ``cactus bench law``: ``cactus_theory.cli.bench_law`` (exact-law instances per second);
- ``cactus bench solvers``: ``proofs_check.bench`` (fast solvers against cvxpy);
- ``cactus bench sampler``: ``cactus_theory.cli.bench_sampler`` (the torch sampler);
- ``cactus bench decode``: ``cactus_theory.cli.bench_decode`` (the paper's decoding table);
- ``cactus bench pool``: ``cactus_theory.cli.bench_pool`` (real pool building, float32
  against bfloat16, and the exact statistics' speed);
- ``cactus bench theory``: ``cactus_theory.cli.bench_theory`` (a pool's exact acceptance
  against the decoder's measured α₁ and AL);
- ``cactus bench hf``: ``cactus_theory.cli.bench_hf`` (``model.generate()`` with a rule
  against transformers' assisted generation);
- ``cactus bench vllm``: ``cactus_theory.cli.bench_vllm`` (every rule inside vLLM).
"""

from cactus_theory.cli.dispatch import COMMANDS, build_parser, main

__all__ = ["COMMANDS", "build_parser", "main"]
