"""``cactus_theory.trees`` is the core's ``cactus_theory.core.trees``:
this file puts that very module object here, so ``import cactus_theory.trees`` and
``from cactus_theory import trees`` both give it (no copy, no second definition)."""

import sys

from cactus_theory.core import trees

sys.modules[__name__] = trees
