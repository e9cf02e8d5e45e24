"""The law tests' statistics: the chi-square test of counts against an exact law, and its
power stated as the smallest total variation it detects.

**Test.** Pearson's chi-square (the kit's ``search.chi_square_pvalue``): bins expecting
fewer than ``MIN_EXPECTED`` draws are pooled into one bin, and a draw where the exact law
is 0 is impossible (p-value 0).

**Power.** For a law ν with TV(ν, μ) = ε and n draws, Pearson's statistic is
approximately noncentral chi-square with df = bins − 1 and noncentrality
λ = n Σ_i (ν_i − μ_i)² / μ_i. By Cauchy–Schwarz, (Σ_i |ν_i − μ_i|)² <= λ/n · Σ_i μ_i, so
λ >= 4 n ε² for *every* ν at TV ε (equality when ν − μ is ±c·μ on two halves of mass
1/2). With λ* the noncentrality at which the test at level α rejects with probability
``POWER`` (``scipy.stats.ncx2``), every law at TV >= ε* = sqrt(λ* / (4 n)) is detected
with probability >= ``POWER`` (in the chi-square approximation). Pooling bins of total
exact mass m can hide a difference inside the pool; then ``detectable_tv`` states
2 ε* + m, which covers it: if ν puts at least m + 2ε* on the pooled bins the pooled bin
alone shows TV ε*, else at most m + ε* of the TV hides in them.

Measured against the goal "10^6 draws on V <= 16 detect TV 0.005": at df = 15 and a
per-test level of 1e-5, λ* = 55.1 and ε* = 0.0037.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from cactus_theory.testing.search import chi_square_pvalue

#: Detection probability the stated detectable TV refers to.
POWER = 0.9
#: Bins expecting fewer draws than this are pooled (as ``chi_square_pvalue`` does).
MIN_EXPECTED = 5.0

__all__ = ["MIN_EXPECTED", "POWER", "chi_square_pvalue", "detectable_tv", "law_test"]


@functools.lru_cache(maxsize=256)
def _noncentrality(df: int, level: float, power: float) -> float:
    """λ* with P(ncx2(df, λ*) > chi2.isf(level, df)) = power."""
    from scipy import optimize, stats

    critical = stats.chi2.isf(level, df)
    return float(optimize.brentq(lambda lam: stats.ncx2.sf(critical, df, lam) - power, 1e-9, 1e7))


def pooling(law: np.ndarray, draws: int) -> tuple[int, float]:
    """(bins the test keeps, exact mass of the pooled bins) for ``draws`` draws of ``law``
    (bins of zero mass are not bins: a draw there fails the test outright)."""
    expected = np.asarray(law, dtype=np.float64) * draws
    positive = expected > 0
    big = positive & (expected >= MIN_EXPECTED)
    small = positive & ~big
    bins = int(big.sum()) + (1 if small.any() else 0)
    return bins, float(np.asarray(law)[small].sum())


def detectable_tv(draws: int, bins: int, level: float, pooled_mass: float = 0.0) -> float:
    """The smallest TV the chi-square test detects with probability ``POWER`` (module
    docstring): sqrt(λ* / (4 n)), or 2 ε* + m when bins of mass m are pooled. A test with
    one bin or no draws detects nothing (inf)."""
    if draws <= 0 or bins < 2:
        return math.inf
    epsilon = math.sqrt(_noncentrality(bins - 1, level, POWER) / (4.0 * draws))
    return 2.0 * epsilon + pooled_mass if pooled_mass > 0 else epsilon


def law_test(counts: np.ndarray, law: np.ndarray, level: float) -> dict:
    """One chi-square test of ``counts [V]`` against the exact ``law [V]`` at ``level``.

    Returns plain data: draws, p-value, passed, the detectable TV, the counts and the law
    (rounded), and the largest |empirical − exact| (the observed difference).
    """
    counts = np.asarray(counts, dtype=np.float64)
    law = np.asarray(law, dtype=np.float64)
    draws = int(counts.sum())
    if draws == 0:
        return {
            "draws": 0,
            "pvalue": 1.0,
            "passed": True,
            "detectable_tv": math.inf,
            "counts": counts.astype(int).tolist(),
            "law": np.round(law, 8).tolist(),
        }
    pvalue = chi_square_pvalue(counts, law)
    bins, pooled = pooling(law, draws)
    empirical = counts / draws
    return {
        "draws": draws,
        "pvalue": pvalue,
        "passed": bool(pvalue >= level),
        "detectable_tv": detectable_tv(draws, bins, level, pooled),
        "observed_tv": float(0.5 * np.abs(empirical - law).sum()),
        "counts": counts.astype(int).tolist(),
        "law": np.round(law, 8).tolist(),
    }
