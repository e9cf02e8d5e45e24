"""Chi-square goodness of fit of sampled counts against an exact law (shared by tests)."""

from __future__ import annotations

import numpy as np
from scipy import stats

#: Significance level used by every sampling test in the suite.
LEVEL = 1e-3


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi-square test of ``counts`` against ``probs``.

    Bins whose expected count is below ``min_expected`` are pooled into one bin (so the
    chi-square approximation holds). A sample in a bin of probability exactly 0 is
    impossible under the law, so the p-value is 0.
    """
    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    if np.any(counts[probs <= 0] > 0):
        return 0.0
    total = counts.sum()
    expected = probs * total
    big = expected >= min_expected
    observed = list(counts[big])
    wanted = list(expected[big])
    if (~big).any() and expected[~big].sum() > 0:
        observed.append(counts[~big].sum())
        wanted.append(expected[~big].sum())
    if len(observed) < 2:
        return 1.0
    wanted_array = np.asarray(wanted)
    wanted_array *= np.sum(observed) / wanted_array.sum()
    return float(stats.chisquare(observed, wanted_array).pvalue)
