"""cactus-theory: constrained-acceptance speculative sampling as exact mathematics.

Layers (subpackages), each importing only the ones before it:

- ``cactus_theory.core``: the numpy core (float64; never imports torch). Its modules are
  re-exported here, so ``from cactus_theory import rules, law, divergences`` works;
- ``cactus_theory.sampler``: the torch export, the same rules batched, and ``verify``;
- ``cactus_theory.decode``: speculative decoding for Hugging Face causal LMs;
- ``cactus_theory.cli``: the ``cactus`` command and the benchmarks.

``cactus_theory.util`` (atomic writes, cache paths, timing, process lifetime) serves every
layer. Nothing is imported until asked for: the core on first use of its names here, the
torch layers only when imported.
"""

import importlib

#: The numpy core's modules, re-exported here on first use (PEP 562), so that
#: ``from cactus_theory import rules, law`` works and ``import cactus_theory.util`` stays cheap.
CORE_MODULES = (
    "block",
    "divergences",
    "gamma",
    "law",
    "processors",
    "roots",
    "rules",
    "validate",
    "verify",
)
__all__ = list(CORE_MODULES)
__version__ = "0.2.0"


def __getattr__(name: str):
    if name in CORE_MODULES:
        module = importlib.import_module(f"cactus_theory.core.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'cactus_theory' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *CORE_MODULES])
