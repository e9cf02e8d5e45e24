"""``python -m proofs_check``: the same as ``cactus check``."""

import sys

from cactus_theory.util.process import exit_with_parent

exit_with_parent()  # first: a child of `cactus report` must not outlive it, even in start-up

from proofs_check.cli import main  # noqa: E402

sys.exit(main())
