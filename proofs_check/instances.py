"""Instance families: (target q, draft p) rows on which every claim is tested.

Each family returns float64 arrays ``target [N, V]`` and ``draft [N, V]`` on the simplex,
drawn from an explicit ``numpy.random.Generator``:

- ``dirichlet-0.1``, ``dirichlet-1``, ``dirichlet-10``: both rows Dirichlet(α·1) (spiky,
  uniform on the simplex, near-uniform).
- ``zipf``: q_x ∝ rank^(−s) with s ~ U[0.5, 2.5] over a random permutation; p likewise with
  its own s and permutation (language-model-like tails).
- ``near-one-hot``: q = (1 − ε) e_i + ε d with ε log-uniform in [1e−9, 0.2] and d Dirichlet;
  p the same with its own i and ε (confident verifier and draft, often disagreeing).
- ``adversarial``: a mix of hand-made hard cases, one per row in rotation: zeros in q and p
  (disjoint supports included), p concentrated on q's least likely tokens, p = q,
  masses at 1e−12 and below, q_n near the saturation kink 1/(1 + 2δ) of the closed form,
  q_n at 1/2, and the many-tiny-tokens construction that makes the emitted KL large.

``sample_deltas`` draws budgets log-uniformly in [1e−4, 4] with a few fixed values mixed in.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

Array = np.ndarray

FAMILIES = ("dirichlet-0.1", "dirichlet-1", "dirichlet-10", "zipf", "near-one-hot", "adversarial")

#: Budgets always included when budgets are sampled.
SPECIAL_DELTAS = (1e-6, 1e-3, 0.1, 0.5, 1.0, 1.2564, 4.0)


@dataclass(frozen=True)
class Batch:
    """One family's instances at one vocabulary size, with a budget per row."""

    family: str
    target: Array
    draft: Array
    delta: Array

    def __len__(self) -> int:
        return self.target.shape[0]


def _normalised(rows: Array) -> Array:
    return rows / rows.sum(axis=-1, keepdims=True)


def _dirichlet(rng: np.random.Generator, count: int, vocab_size: int, alpha: float) -> Array:
    # Gamma draws with tiny α can underflow to an all-zero row; redraw those rows.
    rows = rng.gamma(alpha, size=(count, vocab_size))
    empty = rows.sum(axis=-1) <= 0
    while np.any(empty):
        rows[empty] = rng.gamma(alpha, size=(int(empty.sum()), vocab_size))
        empty = rows.sum(axis=-1) <= 0
    return _normalised(rows)


def _zipf(rng: np.random.Generator, count: int, vocab_size: int) -> Array:
    exponent = rng.uniform(0.5, 2.5, size=(count, 1))
    weights = np.arange(1, vocab_size + 1, dtype=np.float64)[None, :] ** -exponent
    order = np.argsort(rng.random((count, vocab_size)), axis=-1)
    return _normalised(np.take_along_axis(weights, order, axis=-1))


def _near_one_hot(rng: np.random.Generator, count: int, vocab_size: int) -> Array:
    spread = np.exp(rng.uniform(np.log(1e-9), np.log(0.2), size=(count, 1)))
    peak = rng.integers(vocab_size, size=count)
    rows = spread * _dirichlet(rng, count, vocab_size, 1.0)
    rows[np.arange(count), peak] += 1.0 - spread[:, 0]
    return _normalised(rows)


def _with_zeros(rng: np.random.Generator, rows: Array) -> Array:
    """Zero a random subset of each row (never all of it)."""
    keep = rng.random(rows.shape) < 0.6
    keep[np.arange(rows.shape[0]), rng.integers(rows.shape[1], size=rows.shape[0])] = True
    return _normalised(np.where(keep, rows, 0.0))


def tiny_tokens_pair(vocab_size: int, tiny: float) -> tuple[Array, Array]:
    """q = (1 − Mε, ε, …, ε), p = (0, 1/M, …, 1/M) with M = V − 1 tokens of mass ε.

    When every tiny token's branch raises it to at least 1/M, every draft is accepted, the
    emitted law is p, and KL(emitted‖q) = log(1/(M ε)) grows without bound as ε → 0.
    """
    tokens = vocab_size - 1
    target = np.concatenate([[1.0 - tokens * tiny], np.full(tokens, tiny)])
    draft = np.concatenate([[0.0], np.full(tokens, 1.0 / tokens)])
    return target, draft


def _adversarial(
    rng: np.random.Generator, count: int, vocab_size: int, delta: Array
) -> tuple[Array, Array]:
    target = _dirichlet(rng, count, vocab_size, 0.5)
    draft = _dirichlet(rng, count, vocab_size, 0.5)
    for row in range(count):
        kind = row % 8
        q, p = target[row], draft[row]
        if kind == 0:  # zeros in both, supports possibly disjoint
            target[row], draft[row] = _with_zeros(rng, q[None])[0], _with_zeros(rng, p[None])[0]
        elif kind == 1:  # p piles onto q's least likely tokens
            logits = -rng.uniform(1, 8) * np.log(q + 1e-300)
            draft[row] = _normalised(np.exp(logits - logits.max())[None])[0]
        elif kind == 2:  # p = q
            draft[row] = q
        elif kind == 3:  # masses at 1e-12 and far below
            scale = 10.0 ** -rng.uniform(12, 250, size=vocab_size)
            scale[rng.integers(vocab_size)] = 1.0
            target[row] = _normalised((q * scale)[None])[0]
        elif kind == 4:  # q_n at the closed form's saturation kink 1/(1 + 2δ)
            kink = 1.0 / (1.0 + 2.0 * delta[row])
            rest = rng.dirichlet(np.ones(vocab_size - 1)) * (1.0 - kink) if vocab_size > 1 else []
            target[row] = _normalised(np.r_[kink, rest][None])[0]
        elif kind == 5:  # q_n = 1/2 exactly
            rest = rng.dirichlet(np.ones(vocab_size - 1)) * 0.5 if vocab_size > 1 else []
            target[row] = np.r_[0.5, rest] if vocab_size > 1 else np.ones(1)
        elif kind == 6 and vocab_size > 2:  # many tiny tokens, draft on them
            tiny = 10.0 ** -rng.uniform(2, 30)
            target[row], draft[row] = tiny_tokens_pair(vocab_size, tiny / vocab_size)
        elif kind == 7:  # one-hot draft
            draft[row] = np.eye(vocab_size)[rng.integers(vocab_size)]
    return target, draft


def sample_deltas(rng: np.random.Generator, count: int) -> Array:
    """Budgets: log-uniform in [1e−4, 4], every 7th row one of ``SPECIAL_DELTAS``."""
    deltas = np.exp(rng.uniform(np.log(1e-4), np.log(4.0), size=count))
    special = np.arange(count) % 7 == 0
    deltas[special] = rng.choice(SPECIAL_DELTAS, size=int(special.sum()))
    return deltas


def sample_delta(rng: np.random.Generator, smallest: float = 0.0) -> float:
    """One budget: one of ``SPECIAL_DELTAS`` (those >= ``smallest``) with probability 1/7,
    else log-uniform in [max(1e−4, smallest), 4]."""
    special = [value for value in SPECIAL_DELTAS if value >= smallest]
    if rng.random() < 1.0 / 7.0:
        return float(rng.choice(special))
    return float(np.exp(rng.uniform(np.log(max(1e-4, smallest)), np.log(4.0))))


def sample(
    family: str, rng: np.random.Generator, count: int, vocab_size: int, delta: Array | None = None
) -> Batch:
    """``count`` instances of ``family`` with ``vocab_size`` tokens (budgets drawn if absent)."""
    if family not in FAMILIES:
        raise ValueError(f"family: unknown instance family {family!r}; choose one of {FAMILIES}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size: must be >= 1, got {vocab_size}")
    delta = sample_deltas(rng, count) if delta is None else np.asarray(delta, dtype=np.float64)
    if family.startswith("dirichlet-"):
        alpha = float(family.split("-", 1)[1])
        target = _dirichlet(rng, count, vocab_size, alpha)
        draft = _dirichlet(rng, count, vocab_size, alpha)
    elif family == "zipf":
        target, draft = _zipf(rng, count, vocab_size), _zipf(rng, count, vocab_size)
    elif family == "near-one-hot":
        target, draft = _near_one_hot(rng, count, vocab_size), _near_one_hot(rng, count, vocab_size)
    else:
        target, draft = _adversarial(rng, count, vocab_size, delta)
    if not (np.all(np.isfinite(target)) and np.all(np.isfinite(draft))):  # pragma: no cover
        raise RuntimeError(f"instances: family {family!r} produced a non-finite row")
    return Batch(family, target, draft, delta)


def batches(
    rng: np.random.Generator,
    total: int,
    vocab_sizes: tuple[int, ...],
    chunk: int = 512,
    *,
    one_delta: bool = False,
    smallest_delta: float = 0.0,
) -> Iterator[Batch]:
    """``total`` instances in chunks, cycling through families and vocabulary sizes.

    With ``one_delta`` every row of a chunk shares one budget (for rules built with a scalar
    δ), drawn by ``sample_delta`` with ``smallest_delta``.
    """
    produced = 0
    step = 0
    while produced < total:
        family = FAMILIES[step % len(FAMILIES)]
        vocab_size = vocab_sizes[(step // len(FAMILIES)) % len(vocab_sizes)]
        count = min(chunk, total - produced)
        delta = np.full(count, sample_delta(rng, smallest_delta)) if one_delta else None
        yield sample(family, rng, count, vocab_size, delta)
        produced += count
        step += 1
