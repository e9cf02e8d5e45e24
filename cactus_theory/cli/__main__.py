"""``python -m cactus_theory.cli`` is the ``cactus`` command."""

import sys

from cactus_theory.cli.dispatch import main

sys.exit(main())
