"""cactus-theory: constrained-acceptance speculative sampling as exact mathematics.

The numpy core (float64): ``rules`` (every acceptance rule), ``law`` (the exact law of the
emitted token), ``divergences``, ``gamma`` (γ* per divergence), ``block`` (block statistics)
and ``validate``. The torch export lives in ``cactus_theory.sampler`` and
``cactus_theory.decode`` and is imported only when asked for.
"""

from cactus_theory import block, divergences, gamma, law, rules, validate

__all__ = ["block", "divergences", "gamma", "law", "rules", "validate"]
__version__ = "0.1.0"
