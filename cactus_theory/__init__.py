"""cactus-theory: constrained-acceptance speculative sampling as exact mathematics.

Layers (subpackages), each importing only the ones before it:

- ``cactus_theory.core``: the numpy core (float64; never imports torch). Its modules are
  re-exported here, so ``from cactus_theory import rules, law, divergences`` works;
- ``cactus_theory.sampler``: the torch export, the same rules batched, and ``verify``;
- ``cactus_theory.decode``: speculative decoding for Hugging Face causal LMs;
- ``cactus_theory.cli``: the ``cactus`` command and the benchmarks.

``cactus_theory.util`` (atomic writes, cache paths, timing) serves every layer. The torch
layers are imported only when asked for.
"""

from cactus_theory.core import (
    block,
    divergences,
    gamma,
    law,
    processors,
    roots,
    rules,
    validate,
    verify,
)

__all__ = [
    "block",
    "divergences",
    "gamma",
    "law",
    "processors",
    "roots",
    "rules",
    "validate",
    "verify",
]
__version__ = "0.2.0"
