"""Input validation shared by every public entry point.

Each check raises ``ValueError`` whose message starts with the argument's name, so a user
sees at once *which* input is wrong and *why*. Nothing here ever repairs garbage silently;
the one repair it makes is documented: a row that sums to 1 within ``SIMPLEX_ATOL`` (but
not within ``RENORMALISE_ATOL``) is divided by its sum, so that downstream identities (SpS
emits q exactly, every law sums to 1) hold to rounding.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

#: A probability row is accepted when ``|sum(row) - 1| <= SIMPLEX_ATOL``.
SIMPLEX_ATOL = 1e-6
#: Accepted rows whose sum is off by more than this are divided by their sum.
RENORMALISE_ATOL = 1e-12


def distribution(name: str, values: object, *, atol: float = SIMPLEX_ATOL) -> np.ndarray:
    """Return ``values`` as float64 rows on the probability simplex (last axis = vocabulary).

    Raises ``ValueError`` naming ``name`` for: a non-numeric or empty array, a scalar,
    NaN or inf, negative entries, or a row whose sum differs from 1 by more than ``atol``.
    Rows within tolerance are renormalised (``row / row.sum()``) unless already within
    ``RENORMALISE_ATOL`` of 1, so validating twice changes nothing.
    """
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name}: must be an array of probabilities ({error})") from None
    if array.ndim == 0:
        raise ValueError(f"{name}: must have a vocabulary axis, got a scalar")
    if array.shape[-1] == 0 or array.size == 0:
        raise ValueError(f"{name}: is empty (shape {array.shape})")
    if not np.all(np.isfinite(array)):
        bad = np.argwhere(~np.isfinite(array))[0]
        raise ValueError(
            f"{name}: contains NaN or inf (first at index {tuple(int(i) for i in bad)})"
        )
    if np.any(array < 0):
        bad = np.argwhere(array < 0)[0]
        raise ValueError(
            f"{name}: contains negative values (first {array[tuple(bad)]:.3g} at index "
            f"{tuple(int(i) for i in bad)})"
        )
    sums = array.sum(axis=-1, keepdims=True)
    off = np.abs(sums - 1.0)
    if np.any(off > atol):
        worst = float(sums.reshape(-1)[np.argmax(off.reshape(-1))])
        raise ValueError(f"{name}: rows must sum to 1 within {atol:g}; a row sums to {worst:.9g}")
    # Rows within RENORMALISE_ATOL of 1 pass through unchanged, which makes validation
    # idempotent: validating an already validated row never moves it by an ulp.
    return np.where(off > RENORMALISE_ATOL, array / sums, array)


def pair(target: object, draft: object) -> tuple[np.ndarray, np.ndarray]:
    """Validate a (target, draft) pair: both distributions of the same shape."""
    target_probs = distribution("target", target)
    draft_probs = distribution("draft", draft)
    if target_probs.shape != draft_probs.shape:
        raise ValueError(
            f"draft: shape {draft_probs.shape} does not match target shape {target_probs.shape}"
            " (vocabulary or batch mismatch)"
        )
    return target_probs, draft_probs


def token(name: str, value: object, draft_probs: np.ndarray) -> int:
    """A drafted token id: an integer in [0, V) with positive draft probability.

    A drafted token with draft probability 0 cannot have been sampled from the draft, so
    it is an error rather than a case to define.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: must be an integer token id, got {value!r}")
    vocab_size = draft_probs.shape[-1]
    index = int(value)
    if not 0 <= index < vocab_size:
        raise ValueError(f"{name}: token id {index} is out of range [0, {vocab_size})")
    if draft_probs.ndim != 1:
        raise ValueError(f"{name}: needs one draft row, got draft of shape {draft_probs.shape}")
    if draft_probs[index] <= 0:
        raise ValueError(
            f"{name}: draft probability of token {index} is 0, so it cannot have been drafted"
        )
    return index


def nonnegative(name: str, value: object) -> float:
    """A finite real number >= 0 (a budget such as δ)."""
    number = _real(name, value)
    if number < 0:
        raise ValueError(f"{name}: must be >= 0, got {number!r}")
    return number


def positive(name: str, value: object) -> float:
    """A finite real number > 0."""
    number = _real(name, value)
    if number <= 0:
        raise ValueError(f"{name}: must be > 0, got {number!r}")
    return number


def unit_interval(name: str, value: object) -> float:
    """A finite real number in [0, 1] (an acceptance rate or mixing weight)."""
    number = _real(name, value)
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"{name}: must lie in [0, 1], got {number!r}")
    return number


def unit_interval_array(name: str, values: object) -> np.ndarray:
    """An array of finite reals in [0, 1]."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name}: must be numbers in [0, 1] ({error})") from None
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: contains NaN or inf")
    if np.any((array < 0) | (array > 1)):
        raise ValueError(f"{name}: values must lie in [0, 1]")
    return array


def positive_int(name: str, value: object) -> int:
    """An integer >= 1 (k drafted tokens, a top-k size)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
    if int(value) < 1:
        raise ValueError(f"{name}: must be >= 1, got {int(value)}")
    return int(value)


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: must be a real number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name}: must be finite, got {number!r}")
    return number
