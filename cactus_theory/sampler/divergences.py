"""Divergences in torch, the twins of ``cactus_theory.core.divergences`` (same formulas).

Elementwise KL terms (``kl_div``) for the frontier and the divergence meter, and the binary
divergences D((x, 1−x) ‖ (y, 1−y)) with their slopes, on which ``sampler.gamma`` solves γ*.
Accuracy follows the numpy core: log1p near x = y, so tiny budgets keep full precision.
"""

from __future__ import annotations

import math

import torch

Tensor = torch.Tensor


def log_ratio(a: Tensor, b: Tensor, diff: Tensor | None = None) -> Tensor:
    """log(a/b) for a, b > 0: log1p(d/b) near a = b, log a − log b otherwise (as numpy)."""
    difference = a - b if diff is None else diff
    near = torch.log1p(difference / b)
    far = torch.log(a) - torch.log(b)
    return torch.where(difference.abs() < 0.5 * b, near, far)


def kl_div(x: Tensor, y: Tensor) -> Tensor:
    """x log(x/y) − x + y >= 0 elementwise (``divergences.kl_terms``): y at x = 0, +inf at
    x > 0 = y, and O(ε |x − y|) rounding near x = y."""
    positive = (x > 0) & (y > 0)
    safe_x = torch.where(positive, x, torch.ones_like(x))
    safe_y = torch.where(positive, y, torch.ones_like(y))
    inside = safe_x * log_ratio(safe_x, safe_y) - (safe_x - safe_y)
    at_zero = torch.where((x == 0) & (y >= 0), y, torch.full_like(x, math.inf))
    return torch.clamp(torch.where(positive, inside, at_zero), min=0.0)


def _binary_kl(x: Tensor, y: Tensor, diff: Tensor | None = None) -> Tensor:
    """x log(x/y) + (1−x) log((1−x)/(1−y)) from the exact difference (``divergences``)."""
    difference = x - y if diff is None else diff
    up_ok = (x > 0) & (y > 0)
    down_ok = (x < 1) & (y < 1)
    ones = torch.ones_like(difference)
    up = x * log_ratio(torch.where(up_ok, x, ones), torch.where(up_ok, y, ones), difference)
    rest_x = torch.where(down_ok, 1.0 - x, ones)
    rest_y = torch.where(down_ok, 1.0 - y, ones)
    down = rest_x * log_ratio(rest_x, rest_y, -difference)
    zero = torch.zeros_like(difference)
    value = torch.where(up_ok, up, zero) + torch.where(down_ok, down, zero)
    impossible = ((y <= 0) & (x > 0)) | ((y >= 1) & (x < 1))
    return torch.where(impossible, torch.full_like(value, math.inf), torch.clamp(value, min=0.0))


def _root_gap(a: Tensor, b: Tensor, diff: Tensor) -> Tensor:
    """√a − √b as (a − b)/(√a + √b)."""
    total = torch.sqrt(a) + torch.sqrt(b)
    return torch.where(total > 0, diff / torch.where(total > 0, total, 1.0), 0.0)


def binary_divergence(name: str, x: Tensor, y: Tensor) -> Tensor:
    """D((x, 1−x) ‖ (y, 1−y)), the torch twin of ``divergences.binary`` (same formulas)."""
    if name == "kl":
        return _binary_kl(x, y)
    if name == "reverse-kl":
        return _binary_kl(y, x)
    if name == "tv":
        return torch.abs(x - y)
    if name == "chi2":
        spread = y * (1.0 - y)
        value = (x - y) ** 2 / torch.where(spread > 0, spread, torch.ones_like(spread))
        fallback = torch.where(x == y, torch.zeros_like(x), torch.full_like(x, math.inf))
        return torch.where(spread > 0, value, fallback)
    if name == "hellinger":
        diff = x - y
        return 0.5 * (_root_gap(x, y, diff) ** 2 + _root_gap(1.0 - x, 1.0 - y, -diff) ** 2)
    if name == "js":
        middle, half = 0.5 * (x + y), 0.5 * (x - y)
        return 0.5 * _binary_kl(x, middle, half) + 0.5 * _binary_kl(y, middle, -half)
    raise ValueError(f"divergence: unknown divergence {name!r}")


def binary_divergence_slope(name: str, x: Tensor, y: Tensor) -> Tensor:
    """d/dx of ``binary_divergence`` for the root-based divergences (kl, reverse-kl, js).

    KL: log(x/y) − log((1−x)/(1−y)); reverse KL: −y/x + (1−y)/(1−x);
    JS: ½ [log(x/m) − log((1−x)/(1−m))] with m = (x + y)/2.
    """
    if name == "kl":
        return torch.log(x / y) - torch.log((1.0 - x) / (1.0 - y))
    if name == "reverse-kl":
        return -y / x + (1.0 - y) / (1.0 - x)
    mid = 0.5 * (x + y)
    return 0.5 * (torch.log(x / mid) - torch.log((1.0 - x) / (1.0 - mid)))
