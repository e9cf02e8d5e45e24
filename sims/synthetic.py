"""Synthetic (target, draft) pools whose shape and mismatch we control.

- ``dirichlet_pool``: target q ~ Dir(c·1_V) (small c: peaked rows, large c: flat rows), and
  a draft that is a noisy copy, p ~ Dir(β q + c·1_V) with precision β.
- ``zipf_pool``: a Zipf-like verifier q_i ∝ rank_i^(−s) over a random permutation of the
  vocabulary, and a draft that is a tempered and noised copy,
  p ∝ exp(log q / τ + σ ε), ε ~ N(0, 1). ``zipf_pool_at_tv`` dials σ so that the mean
  TV(q, p) over the pool equals a requested value.
- ``peaked_pool``: one-hot-ish verifiers q = m e_top + (1 − m) Dir(1_V), and a draft of the
  same shape whose top token agrees with the verifier's with probability ``agreement``.

Every pool is seeded: the same arguments give the same rows.
"""

from __future__ import annotations

import numpy as np
from scipy import optimize, special

from cactus_theory.core import validate
from sims.pools import PairPool

Array = np.ndarray


def _sizes(vocab_size: object, num_pairs: object) -> tuple[int, int]:
    size = validate.positive_int("vocab_size", vocab_size)
    if size < 2:
        raise ValueError(f"vocab_size: must be >= 2, got {size}")
    return size, validate.positive_int("num_pairs", num_pairs)


def dirichlet_pool(
    concentration: float,
    *,
    vocab_size: int = 50,
    num_pairs: int = 2000,
    draft_precision: float = 20.0,
    seed: int = 0,
) -> PairPool:
    """q ~ Dir(c·1_V); p ~ Dir(β q + c·1_V), β = ``draft_precision`` (larger: closer p)."""
    size, count = _sizes(vocab_size, num_pairs)
    alpha = validate.positive("concentration", concentration)
    precision = validate.positive("draft_precision", draft_precision)
    rng = np.random.default_rng(seed)
    target = _dirichlet_rows(rng, np.full((count, size), alpha))
    draft = _dirichlet_rows(rng, precision * target + alpha)
    return PairPool.full(
        f"dirichlet-{alpha:g}",
        target,
        draft,
        f"Dirichlet pairs, V={size}: q ~ Dir({alpha:g}), p ~ Dir({precision:g} q + {alpha:g})",
        {"concentration": alpha, "vocab_size": size, "draft_precision": precision, "seed": seed},
    )


def _dirichlet_rows(rng: np.random.Generator, alphas: Array) -> Array:
    """Dirichlet rows via normalised gammas (rows that underflow to 0 get a uniform row)."""
    draws = rng.standard_gamma(alphas)
    totals = draws.sum(axis=1, keepdims=True)
    uniform = np.full_like(draws, 1.0 / draws.shape[1])
    with np.errstate(invalid="ignore", divide="ignore"):
        rows = np.where(totals > 0, draws / totals, uniform)
    return rows / rows.sum(axis=1, keepdims=True)


def _zipf_parts(size: int, count: int, exponent: float, seed: int) -> tuple[Array, Array]:
    rng = np.random.default_rng(seed)
    weights = np.arange(1, size + 1, dtype=np.float64) ** (-exponent)
    ranks = np.argsort(rng.random((count, size)), axis=1)
    log_target = np.log(weights / weights.sum())[ranks]
    return log_target, rng.standard_normal((count, size))


def _zipf_draft(log_target: Array, noise: Array, temperature: float, scale: float) -> Array:
    return special.softmax(log_target / temperature + scale * noise, axis=1)


def zipf_pool(
    exponent: float = 1.1,
    *,
    noise: float = 0.5,
    draft_temperature: float = 1.3,
    vocab_size: int = 200,
    num_pairs: int = 2000,
    seed: int = 0,
) -> PairPool:
    """q_i ∝ rank_i^(−s) (random ranks); p ∝ exp(log q / τ + σ ε) with σ = ``noise``."""
    size, count = _sizes(vocab_size, num_pairs)
    power = validate.positive("exponent", exponent)
    scale = validate.nonnegative("noise", noise)
    temperature = validate.positive("draft_temperature", draft_temperature)
    log_target, standard = _zipf_parts(size, count, power, seed)
    target = np.exp(log_target)
    draft = _zipf_draft(log_target, standard, temperature, scale)
    tv = float(0.5 * np.abs(target - draft).sum(axis=1).mean())
    return PairPool.full(
        f"zipf-tv{tv:.2f}",
        target,
        draft,
        f"Zipf(s={power:g}) verifier, V={size}; draft tempered (τ={temperature:g}) and "
        f"noised (σ={scale:.3g}); mean TV = {tv:.3f}",
        {
            "exponent": power,
            "noise": scale,
            "draft_temperature": temperature,
            "vocab_size": size,
            "seed": seed,
            "mean_tv": tv,
        },
    )


def zipf_pool_at_tv(
    tv: float,
    exponent: float = 1.1,
    *,
    draft_temperature: float = 1.3,
    vocab_size: int = 200,
    num_pairs: int = 2000,
    seed: int = 0,
) -> PairPool:
    """``zipf_pool`` with σ chosen (by a bracketed root) so that mean TV(q, p) = ``tv``."""
    goal = validate.unit_interval("tv", tv)
    size, count = _sizes(vocab_size, num_pairs)
    temperature = validate.positive("draft_temperature", draft_temperature)
    log_target, standard = _zipf_parts(size, count, validate.positive("exponent", exponent), seed)
    target = np.exp(log_target)

    def mean_tv(scale: float) -> float:
        draft = _zipf_draft(log_target, standard, temperature, scale)
        return float(0.5 * np.abs(target - draft).sum(axis=1).mean())

    floor, ceiling = mean_tv(0.0), mean_tv(20.0)
    if not floor <= goal <= ceiling:
        raise ValueError(
            f"tv: must lie in [{floor:.3f}, {ceiling:.3f}] for this verifier and draft "
            f"temperature (tempering alone gives {floor:.3f}), got {goal!r}"
        )
    scale = optimize.brentq(lambda s: mean_tv(s) - goal, 0.0, 20.0, xtol=1e-10)
    pool = zipf_pool(
        exponent,
        noise=scale,
        draft_temperature=temperature,
        vocab_size=size,
        num_pairs=count,
        seed=seed,
    )
    return PairPool(
        f"zipf-tv{goal:g}",
        pool.target_probs,
        pool.draft_probs,
        pool.ids,
        pool.vocab_size,
        pool.description,
        {**pool.settings, "requested_tv": goal},
    )


def peaked_pool(
    mass: float = 0.9,
    *,
    agreement: float = 0.7,
    draft_mass: float = 0.8,
    vocab_size: int = 50,
    num_pairs: int = 2000,
    seed: int = 0,
) -> PairPool:
    """q = m e_top + (1−m) Dir(1); p = m' e_top' + (1−m') Dir(1), top' = top w.p. agreement."""
    size, count = _sizes(vocab_size, num_pairs)
    peak = validate.unit_interval("mass", mass)
    agree = validate.unit_interval("agreement", agreement)
    draft_peak = validate.unit_interval("draft_mass", draft_mass)
    rng = np.random.default_rng(seed)
    top = rng.integers(0, size, count)
    other = (top + rng.integers(1, size, count)) % size
    draft_top = np.where(rng.random(count) < agree, top, other)
    target = (1 - peak) * _dirichlet_rows(rng, np.ones((count, size)))
    target[np.arange(count), top] += peak
    draft = (1 - draft_peak) * _dirichlet_rows(rng, np.ones((count, size)))
    draft[np.arange(count), draft_top] += draft_peak
    return PairPool.full(
        f"peaked-{peak:g}",
        target,
        draft,
        f"One-hot-ish verifier (top mass {peak:g}), V={size}; draft top mass {draft_peak:g}, "
        f"same top token w.p. {agree:g}",
        {
            "mass": peak,
            "agreement": agree,
            "draft_mass": draft_peak,
            "vocab_size": size,
            "seed": seed,
        },
    )
