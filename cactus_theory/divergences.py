"""``cactus_theory.divergences`` is the core's ``cactus_theory.core.divergences``:
this file puts that very module object here, so ``import cactus_theory.divergences`` and
``from cactus_theory import divergences`` both give it (no copy, no second definition)."""

import sys

from cactus_theory.core import divergences

sys.modules[__name__] = divergences
