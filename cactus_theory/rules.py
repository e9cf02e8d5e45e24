"""``cactus_theory.rules`` is the core's ``cactus_theory.core.rules``:
this file puts that very module object here, so ``import cactus_theory.rules`` and
``from cactus_theory import rules`` both give it (no copy, no second definition)."""

import sys

from cactus_theory.core import rules

sys.modules[__name__] = rules
