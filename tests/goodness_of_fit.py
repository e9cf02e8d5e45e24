"""Chi-square goodness of fit of sampled counts against an exact law (shared by tests):
the kit's own test (``cactus_theory.testing.search.chi_square_pvalue``: Pearson's, bins
expecting fewer than 5 draws pooled, a draw where the law is 0 gives p = 0)."""

from __future__ import annotations

from cactus_theory.testing.search import chi_square_pvalue

#: Significance level used by every sampling test in the suite.
LEVEL = 1e-3

__all__ = ["LEVEL", "chi_square_pvalue"]
