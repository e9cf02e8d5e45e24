"""cactus-theory: constrained-acceptance speculative sampling as exact mathematics.

Layers (subpackages), each importing only the ones before it:

- ``cactus_theory.util``: atomic writes, cache paths, timing, process lifetime;
- ``cactus_theory.core``: the numpy core (float64; never imports torch);
- ``cactus_theory.sampler``: the torch export, the same rules batched, and ``verify``;
- ``cactus_theory.decode``: speculative decoding for Hugging Face causal LMs;
- ``cactus_theory.vllm``: the plug-in that puts every rule inside vLLM V1;
- ``cactus_theory.cli``: the ``cactus`` command and the benchmarks.

The public face of the core is four real submodules here, ``rules``, ``law``,
``divergences`` and ``trees`` (``from cactus_theory import rules, law, divergences, trees``,
or ``import cactus_theory.rules``): each is the very module of ``cactus_theory.core``. The rest
of the core is imported from ``cactus_theory.core`` (``from cactus_theory.core import
gamma``). Nothing is imported with this package itself, so ``import cactus_theory.util``
stays cheap.
"""

#: The core modules that are also submodules of the package root (``cactus_theory/rules.py``...).
PUBLIC_CORE_MODULES = ("divergences", "law", "rules", "trees")
__all__ = list(PUBLIC_CORE_MODULES)
__version__ = "0.2.0"
