"""Standard errors by cluster (prompt): positions and steps of one prompt are not
independent, so a ratio over prompts gets the cluster (linearisation) SE.

A ratio R = Σ_i x_i / Σ_i y_i over clusters i has
SE² = m/(m−1) Σ_i (x_i − R y_i)² / (Σ_i y_i)², m clusters (``ratio_se``); the difference of
two ratios on the same clusters (paired) uses the per-cluster differences of those
linearised terms (``paired_difference_se``).
"""

from __future__ import annotations

import math

import numpy as np

Array = np.ndarray


def by_cluster(values: Array, clusters: Array, labels: Array) -> Array:
    """Σ of ``values`` per label of ``labels`` (0 for a label with no value)."""
    index = np.searchsorted(labels, clusters)
    return np.bincount(index, weights=np.asarray(values, dtype=np.float64), minlength=len(labels))


def ratio_se(numerators: Array, denominators: Array) -> float:
    """The cluster SE of R = Σ x_i / Σ y_i over clusters i (module docstring); NaN with
    fewer than 2 clusters."""
    x, y = np.asarray(numerators, float), np.asarray(denominators, float)
    m = len(x)
    if m < 2 or y.sum() <= 0:
        return math.nan
    ratio = x.sum() / y.sum()
    return float(math.sqrt(m / (m - 1) * np.sum((x - ratio * y) ** 2)) / y.sum())


def paired_difference_se(x_a: Array, y_a: Array, x_b: Array, y_b: Array) -> float:
    """The cluster SE of Σx_a/Σy_a − Σx_b/Σy_b with both ratios over the same clusters
    (index i): the per-cluster difference of the linearised terms (module docstring)."""
    x_a, y_a, x_b, y_b = (np.asarray(v, float) for v in (x_a, y_a, x_b, y_b))
    m = len(x_a)
    if m < 2 or y_a.sum() <= 0 or y_b.sum() <= 0:
        return math.nan
    ratio_a, ratio_b = x_a.sum() / y_a.sum(), x_b.sum() / y_b.sum()
    terms = (x_a - ratio_a * y_a) / y_a.sum() - (x_b - ratio_b * y_b) / y_b.sum()
    return float(math.sqrt(m / (m - 1) * np.sum(terms**2)))


def z_score(difference: float, se: float) -> float:
    """difference / se; ±inf (0 for no difference) when the SE is 0 or NaN."""
    if not se > 0:
        return 0.0 if difference == 0 else math.copysign(math.inf, difference)
    return difference / se
