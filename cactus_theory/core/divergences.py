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

from cactus_theory.core import validate

Array = np.ndarray


# --- row functions (no validation; inputs are float64 rows on the simplex) -----------------


def log_ratio(a: Array, b: Array, diff: Array | None = None) -> Array:
    """log(a/b) for a, b > 0, accurate both near a = b and for extreme ratios.

    log1p(d/b) with d = a − b when |d| < b/2 (no loss near 1), log a − log b otherwise (no
    overflow or underflow of a/b). Pass ``diff`` when a − b is known more exactly than the
    rounded a and b give it (e.g. (1 − x) − (1 − y) = y − x).
    """
    difference = a - b if diff is None else diff
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        near = np.log1p(difference / b)
        far = np.log(a) - np.log(b)
    return np.where(np.abs(difference) < 0.5 * b, near, far)


def kl_terms(a: Array, b: Array) -> Array:
    """a log(a/b) − a + b >= 0, elementwise (``scipy.special.kl_div``), accurate when a ≈ b.

    With d = a − b the term is a·log(a/b) − d, and ``log_ratio`` keeps log(a/b) exact to
    rounding near a = b, so the error is O(ε |d|) rather than the O(ε max(a, b)) of the
    textbook form. 0 log 0 = 0, and a > 0 = b gives +inf.
    """
    positive = (a > 0) & (b > 0)
    safe_a = np.where(positive, a, 1.0)
    safe_b = np.where(positive, b, 1.0)
    inner = safe_a * log_ratio(safe_a, safe_b) - (safe_a - safe_b)
    value = np.where(positive, inner, np.where(a > 0, np.inf, b))
    return np.maximum(value, 0.0)


def kl_rows(a: Array, b: Array) -> Array:
    """KL(a‖b) = Σ_x [a log(a/b) − a + b] (equal to Σ a log(a/b) on the simplex).

    Every term is non-negative (``kl_terms``), so a tiny KL is summed without cancellation
    between positive and negative terms.
    """
    return kl_terms(a, b).sum(axis=-1)


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


def _root_gap(a: Array, b: Array, diff: Array) -> Array:
    """√a − √b computed as (a − b)/(√a + √b): no cancellation when a ≈ b."""
    total = np.sqrt(a) + np.sqrt(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, diff / np.where(total > 0, total, 1.0), 0.0)


def hellinger_rows(a: Array, b: Array) -> Array:
    """Squared Hellinger distance ½ Σ (√a − √b)²."""
    return 0.5 * (_root_gap(a, b, a - b) ** 2).sum(axis=-1)


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


def _binary_kl(x: Array, y: Array, diff: Array | None = None) -> Array:
    """x log(x/y) + (1−x) log((1−x)/(1−y)), accurate when x ≈ y.

    Both logs use ``log_ratio`` with the exact difference d = x − y (``diff`` when the
    caller knows it better), so near x = y both terms are O(d) with O(ε d) error and their
    O(d²) sum keeps full relative precision; the textbook form cancels O(1) terms and
    leaves ~1e−16 of absolute noise, too much for budgets like 1e−10.
    """
    difference = x - y if diff is None else diff
    up_ok = (x > 0) & (y > 0)
    down_ok = (x < 1) & (y < 1)
    ones = np.ones_like(difference)
    up = x * log_ratio(np.where(up_ok, x, ones), np.where(up_ok, y, ones), difference)
    rest_x = np.where(down_ok, 1.0 - x, ones)
    rest_y = np.where(down_ok, 1.0 - y, ones)
    down = rest_x * log_ratio(rest_x, rest_y, -difference)
    value = np.where(up_ok, up, 0.0) + np.where(down_ok, down, 0.0)
    impossible = ((y <= 0) & (x > 0)) | ((y >= 1) & (x < 1))
    return np.where(impossible, np.inf, np.maximum(value, 0.0))


def _binary_reverse_kl(x: Array, y: Array) -> Array:
    return _binary_kl(y, x)


def _binary_js(x: Array, y: Array) -> Array:
    middle = 0.5 * (x + y)
    half = 0.5 * (x - y)  # x − m, exactly
    return 0.5 * _binary_kl(x, middle, half) + 0.5 * _binary_kl(y, middle, -half)


def _binary_tv(x: Array, y: Array) -> Array:
    return np.abs(x - y)


def _binary_chi2(x: Array, y: Array) -> Array:
    spread = y * (1.0 - y)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = (x - y) ** 2 / spread
    return np.where(spread > 0, value, np.where(x == y, 0.0, np.inf))


def _binary_hellinger(x: Array, y: Array) -> Array:
    diff = x - y
    up = _root_gap(x, y, diff)
    down = _root_gap(1.0 - x, 1.0 - y, -diff)
    return 0.5 * (up**2 + down**2)


#: Elementwise two-point forms; each equals ``rows(name, (x, 1−x), (y, 1−y))``.
BINARY_FUNCTIONS: dict[str, Callable[[Array, Array], Array]] = {
    "kl": _binary_kl,
    "reverse-kl": _binary_reverse_kl,
    "tv": _binary_tv,
    "chi2": _binary_chi2,
    "hellinger": _binary_hellinger,
    "js": _binary_js,
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
    from cactus_theory.core import gamma  # the root finder lives with the other γ* solvers

    return gamma.exact_raised_mass(y, delta, "kl")
