"""Block statistics of one verification step with k drafted tokens.

Position i (1-based) is reached only if positions 1..i−1 were accepted, and is accepted
with probability α_i (the per-position acceptance, e.g. ``law.acceptance``). With L the
number of accepted drafts (the paper's AL, which excludes the bonus/correction token):

    P(L = j) = (Π_{i<=j} α_i)(1 − α_{j+1})   for j < k,     P(L = k) = Π_{i<=k} α_i,
    E[L]     = Σ_{j=1}^{k} Π_{i<=j} α_i,
    tokens per verifier call = E[L] + 1        (every call emits one more token),
    speed-up = (E[L] + 1) / (k c + 1),          c = draft cost / verifier cost,

which for a constant α is Leviathan et al.'s (1 − α^{k+1}) / ((1 − α)(k c + 1)).
"""

from __future__ import annotations

import numpy as np

from cactus_theory.core import validate

Array = np.ndarray


def _alphas(alphas: object, k: int | None) -> Array:
    values = validate.unit_interval_array("alpha", alphas)
    if values.ndim == 0:
        if k is None:
            raise ValueError("k: needed when alpha is a single number")
        return np.full(validate.positive_int("k", k), float(values))
    if values.ndim != 1 or values.size == 0:
        raise ValueError(
            f"alpha: expected a number or a 1-D list of k values, got shape {values.shape}"
        )
    if k is not None and validate.positive_int("k", k) != values.size:
        raise ValueError(f"k: {k} does not match the {values.size} per-position alphas")
    return values


def accepted_length_distribution(alpha: object, k: int | None = None) -> Array:
    """[k+1]: P(L = j) for j = 0..k. ``alpha`` is one α (then give k) or k values α_i."""
    values = _alphas(alpha, k)
    reach = np.concatenate([[1.0], np.cumprod(values)])  # P(L >= j), j = 0..k
    stop = np.concatenate([1.0 - values, [1.0]])
    return reach * stop


def expected_accepted(alpha: object, k: int | None = None) -> float:
    """E[L] = Σ_j Π_{i<=j} α_i (accepted drafts, bonus excluded)."""
    return float(np.cumprod(_alphas(alpha, k)).sum())


def tokens_per_call(alpha: object, k: int | None = None) -> float:
    """Tokens emitted per verifier call: E[L] + 1."""
    return expected_accepted(alpha, k) + 1.0


def speedup(
    alpha: object, k: int | None = None, cost_ratio: float = 0.0, verify_cost: float = 1.0
) -> float:
    """Walltime speed-up over autoregressive decoding: (E[L] + 1)/(k c + v).

    c is the cost of one draft token and v the cost of one verify call of k + 1 tokens,
    both in autoregressive steps of the verifier (v = 1 in Leviathan et al.'s model, where
    for constant α this equals (1 − α^{k+1})/((1 − α)(k c + 1)), their Thm 3.8; on a
    compute-bound device v grows towards k + 1).
    """
    values = _alphas(alpha, k)
    cost = validate.nonnegative("cost_ratio", cost_ratio)
    verify = validate.positive("verify_cost", verify_cost)
    return tokens_per_call(values) / (values.size * cost + verify)


def leviathan_speedup(alpha: float, k: int, cost_ratio: float) -> float:
    """(1 − α^{k+1}) / ((1 − α)(k c + 1)), with its limit (k+1)/(k c + 1) at α = 1."""
    rate = validate.unit_interval("alpha", alpha)
    steps = validate.positive_int("k", k)
    cost = validate.nonnegative("cost_ratio", cost_ratio)
    tokens = steps + 1.0 if rate == 1.0 else (1.0 - rate ** (steps + 1)) / (1.0 - rate)
    return tokens / (steps * cost + 1.0)


def best_k(alpha: float, cost_ratio: float, k_max: int = 64) -> tuple[int, float]:
    """The k in 1..k_max maximising the constant-α speed-up, and that speed-up.

    Ties go to the smaller k (less wasted draft work for the same speed).
    """
    limit = validate.positive_int("k_max", k_max)
    speeds = [leviathan_speedup(alpha, k, cost_ratio) for k in range(1, limit + 1)]
    index = int(np.argmax(speeds))
    return index + 1, float(speeds[index])
