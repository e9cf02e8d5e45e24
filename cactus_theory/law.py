"""``cactus_theory.law`` is the core's ``cactus_theory.core.law``:
this file puts that very module object here, so ``import cactus_theory.law`` and
``from cactus_theory import law`` both give it (no copy, no second definition)."""

import sys

from cactus_theory.core import law

sys.modules[__name__] = law
