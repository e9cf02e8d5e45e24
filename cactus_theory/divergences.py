"""Divergences between distributions on the last axis, with zeros handled exactly.

Conventions (natural logarithms throughout):

- ``kl(a, b)``          KL(a‖b) = Σ a log(a/b); 0·log(0/·) = 0; +inf if some a_x > 0 = b_x.
- ``reverse_kl(a, b)``  KL(b‖a).
- ``tv(a, b)``          ½ Σ |a − b|.
- ``chi2(a, b)``        Pearson χ²(a‖b) = Σ (a − b)² / b; 0/0 = 0; +inf if some a_x > 0 = b_x.
- ``hellinger(a, b)``   squared Hellinger H² = ½ Σ (√a − √b)² = 1 − Σ √(a b), in [0, 1].
- ``js(a, b)``          Jensen–Shannon ½ KL(a‖m) + ½ KL(b‖m), m = (a + b)/2, in [0, log 2].

All of them are f-divergences D_f(a‖b) = Σ b f(a/b) (TV: f = ½|t−1|; χ²: (t−1)²;
H²: ½(√t−1)²; KL: t log t; reverse KL: −log t), which is what makes the per-branch Cactus
problem one-dimensional (see ``cactus_theory.gamma``).

``binary(name, x, y)`` is the divergence between the two-point laws (x, 1−x) and (y, 1−y),
and ``binary_kl_upper_inverse(y, delta)`` is the largest x in [y, 1] with
binary KL(x‖y) <= delta.

The public functions validate their inputs (rows on the simplex, same shape); the
``*_rows`` functions skip validation for internal hot paths.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import special

from cactus_theory import validate

Array = np.ndarray


# --- row functions (no validation; inputs are float64 rows on the simplex) -----------------


def kl_rows(a: Array, b: Array) -> Array:
    """KL(a‖b) = Σ_x [a log(a/b) − a + b] (equal to Σ a log(a/b) on the simplex).

    The form with ``− a + b`` (``scipy.special.kl_div``) has non-negative terms, so a tiny KL
    is computed without cancellation between positive and negative terms.
    """
    return special.kl_div(a, b).sum(axis=-1)


def reverse_kl_rows(a: Array, b: Array) -> Array:
    """KL(b‖a)."""
    return kl_rows(b, a)


def tv_rows(a: Array, b: Array) -> Array:
    """TV(a, b) = ½ Σ |a − b|."""
    return 0.5 * np.abs(a - b).sum(axis=-1)


def chi2_rows(a: Array, b: Array) -> Array:
    """Pearson χ²(a‖b) = Σ (a − b)²/b, with 0/0 = 0 and c/0 = +inf for c > 0."""
    diff_sq = (a - b) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(b > 0, diff_sq / np.where(b > 0, b, 1.0), np.where(a > 0, np.inf, 0.0))
    return terms.sum(axis=-1)


def hellinger_rows(a: Array, b: Array) -> Array:
    """Squared Hellinger distance ½ Σ (√a − √b)²."""
    return 0.5 * ((np.sqrt(a) - np.sqrt(b)) ** 2).sum(axis=-1)


def js_rows(a: Array, b: Array) -> Array:
    """Jensen–Shannon divergence ½ KL(a‖m) + ½ KL(b‖m), m = (a + b)/2."""
    mid = 0.5 * (a + b)
    return 0.5 * kl_rows(a, mid) + 0.5 * kl_rows(b, mid)


#: Row functions by name. Names are the ones accepted by ``divergence=`` everywhere.
ROW_FUNCTIONS: dict[str, Callable[[Array, Array], Array]] = {
    "kl": kl_rows,
    "reverse-kl": reverse_kl_rows,
    "tv": tv_rows,
    "chi2": chi2_rows,
    "hellinger": hellinger_rows,
    "js": js_rows,
}

NAMES = tuple(ROW_FUNCTIONS)


def check_name(name: object, argument: str = "divergence") -> str:
    """Return ``name`` if it is a known divergence, else raise ``ValueError``."""
    if name not in ROW_FUNCTIONS:
        raise ValueError(f"{argument}: unknown divergence {name!r}; choose one of {NAMES}")
    return str(name)


def rows(name: str, a: Array, b: Array) -> Array:
    """The divergence ``name`` between rows (no validation)."""
    return ROW_FUNCTIONS[check_name(name)](a, b)


# --- public, validated -------------------------------------------------------------------


def _validated(a: object, b: object) -> tuple[Array, Array]:
    first = validate.distribution("a", a)
    second = validate.distribution("b", b)
    if first.shape != second.shape:
        raise ValueError(f"b: shape {second.shape} does not match a's shape {first.shape}")
    return first, second


def _scalar_if_row(values: Array) -> float | Array:
    return float(values) if np.ndim(values) == 0 else values


def kl(a: object, b: object) -> float | Array:
    """KL(a‖b) = Σ_x a_x log(a_x / b_x) over the last axis (nats)."""
    return _scalar_if_row(kl_rows(*_validated(a, b)))


def reverse_kl(a: object, b: object) -> float | Array:
    """Reverse KL: KL(b‖a)."""
    return _scalar_if_row(reverse_kl_rows(*_validated(a, b)))


def tv(a: object, b: object) -> float | Array:
    """Total variation ½ Σ_x |a_x − b_x|."""
    return _scalar_if_row(tv_rows(*_validated(a, b)))


def chi2(a: object, b: object) -> float | Array:
    """Pearson χ²(a‖b) = Σ_x (a_x − b_x)² / b_x."""
    return _scalar_if_row(chi2_rows(*_validated(a, b)))


def hellinger(a: object, b: object) -> float | Array:
    """Squared Hellinger distance ½ Σ_x (√a_x − √b_x)²."""
    return _scalar_if_row(hellinger_rows(*_validated(a, b)))


def js(a: object, b: object) -> float | Array:
    """Jensen–Shannon divergence (nats)."""
    return _scalar_if_row(js_rows(*_validated(a, b)))


def divergence(name: str, a: object, b: object) -> float | Array:
    """The divergence called ``name`` (one of ``NAMES``) between a and b."""
    return _scalar_if_row(rows(name, *_validated(a, b)))


# --- binary (two-point) divergences -------------------------------------------------------


def _binary_kl(x: Array, y: Array) -> Array:
    return special.kl_div(x, y) + special.kl_div(1.0 - x, 1.0 - y)


def _binary_reverse_kl(x: Array, y: Array) -> Array:
    return _binary_kl(y, x)


def _binary_tv(x: Array, y: Array) -> Array:
    return np.abs(x - y)


def _binary_chi2(x: Array, y: Array) -> Array:
    spread = y * (1.0 - y)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = (x - y) ** 2 / spread
    return np.where(spread > 0, value, np.where(x == y, 0.0, np.inf))


def _binary_hellinger(x: Array, y: Array) -> Array:
    return 0.5 * ((np.sqrt(x) - np.sqrt(y)) ** 2 + (np.sqrt(1.0 - x) - np.sqrt(1.0 - y)) ** 2)


def _binary_from_rows(name: str) -> Callable[[Array, Array], Array]:
    def two_point(x: Array, y: Array) -> Array:
        a = np.stack([x, 1.0 - x], axis=-1)
        b = np.stack([y, 1.0 - y], axis=-1)
        return ROW_FUNCTIONS[name](a, b)

    return two_point


#: Elementwise two-point forms; each equals ``rows(name, (x, 1−x), (y, 1−y))``.
BINARY_FUNCTIONS: dict[str, Callable[[Array, Array], Array]] = {
    "kl": _binary_kl,
    "reverse-kl": _binary_reverse_kl,
    "tv": _binary_tv,
    "chi2": _binary_chi2,
    "hellinger": _binary_hellinger,
    "js": _binary_from_rows("js"),
}


def binary(name: str, x: object, y: object) -> Array:
    """D((x, 1−x) ‖ (y, 1−y)) for the divergence ``name``, elementwise over x and y.

    This is the scalar to which every per-branch Cactus problem reduces: with h_n = x and
    the rest of h proportional to q, D_f(h‖q) = D_f((x, 1−x) ‖ (q_n, 1−q_n)).
    """
    first, second = np.broadcast_arrays(
        np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    )
    return BINARY_FUNCTIONS[check_name(name)](first, second)


def binary_kl(x: object, y: object) -> Array:
    """Binary KL: x log(x/y) + (1−x) log((1−x)/(1−y))."""
    return binary("kl", x, y)


def binary_kl_upper_inverse(y: object, delta: object) -> Array:
    """The largest x in [y, 1] with binary_kl(x, y) <= delta (elementwise).

    Equal to 1 when −log y <= delta, to 0 when y = 0 (any x > 0 has infinite KL), and
    otherwise the root of binary_kl(x, y) = delta (``cactus_theory.roots``), taken on its
    feasible side, so binary_kl(x, y) <= delta holds as computed.
    """
    from cactus_theory import gamma  # the root finder lives with the other γ* solvers

    return gamma.exact_raised_mass(y, delta, "kl")
