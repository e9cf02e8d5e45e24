"""``python -m proofs_check``: the same as ``cactus check``."""

import sys

from proofs_check.cli import main

sys.exit(main())
