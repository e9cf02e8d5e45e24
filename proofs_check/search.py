"""Worst-case search over (target, draft) pairs: random families, then scipy.optimize.

``maximise_over_pairs`` looks for the pair (q, p) on V tokens that maximises a vectorised
objective. It works in logit space, q = softmax(x[:V]), p = softmax(x[V:]) with x in
[−``LOGIT_BOUND``, ``LOGIT_BOUND``]^(2V) (so masses down to e^(−2·LOGIT_BOUND) are
reachable):

1. evaluate the objective on random instances from every family (``instances``) and keep
   the best as seeds;
2. run ``scipy.optimize.differential_evolution`` (vectorised, population seeded with them);
3. polish the best few points with Nelder–Mead (a multi-start local search).

Every evaluation counts as one instance. The result is a lower bound on the supremum: a
found value is attained by the returned pair.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from proofs_check import instances

Array = np.ndarray
Objective = Callable[[Array, Array], Array]

LOGIT_BOUND = 40.0


@dataclass
class SearchResult:
    """The best value found, the pair that attains it, and how many pairs were evaluated."""

    value: float
    target: Array
    draft: Array
    evaluations: int


def softmax_rows(logits: Array) -> Array:
    """Row-wise softmax over the last axis."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=-1, keepdims=True)


def _pairs_from_logits(points: Array, vocab_size: int) -> tuple[Array, Array]:
    return softmax_rows(points[..., :vocab_size]), softmax_rows(points[..., vocab_size:])


def _logits_from_pairs(target: Array, draft: Array) -> Array:
    def logits(rows: Array) -> Array:
        values = np.log(np.maximum(rows, np.exp(-2 * LOGIT_BOUND)))
        values = values - values.max(axis=-1, keepdims=True) + LOGIT_BOUND
        return np.clip(values, -LOGIT_BOUND, LOGIT_BOUND)

    return np.concatenate([logits(target), logits(draft)], axis=-1)


def _safe(values: Array) -> Array:
    return np.where(np.isfinite(values), values, -np.inf)


def maximise_over_pairs(
    objective: Objective,
    vocab_size: int,
    rng: np.random.Generator,
    *,
    random_pairs: int = 2000,
    population: int = 40,
    generations: int = 30,
    polish_starts: int = 3,
    polish_evaluations: int = 400,
    seeds: list[tuple[Array, Array]] | None = None,
) -> SearchResult:
    """Maximise ``objective(target [N,V], draft [N,V]) -> [N]`` over pairs on V tokens."""
    evaluations = 0
    best = SearchResult(
        -np.inf, np.full(vocab_size, 1 / vocab_size), np.full(vocab_size, 1 / vocab_size), 0
    )

    def consider(target: Array, draft: Array) -> Array:
        nonlocal evaluations, best
        values = _safe(np.asarray(objective(target, draft), dtype=np.float64))
        evaluations += values.size
        top = int(np.argmax(values))
        if values[top] > best.value:
            best = SearchResult(float(values[top]), target[top].copy(), draft[top].copy(), 0)
        return values

    pool_targets, pool_drafts, pool_values = [], [], []
    for batch in instances.batches(rng, random_pairs, (vocab_size,)):
        pool_targets.append(batch.target)
        pool_drafts.append(batch.draft)
        pool_values.append(consider(batch.target, batch.draft))
    if seeds:
        seed_target = np.stack([pair[0] for pair in seeds])
        seed_draft = np.stack([pair[1] for pair in seeds])
        pool_targets.append(seed_target)
        pool_drafts.append(seed_draft)
        pool_values.append(consider(seed_target, seed_draft))
    targets = np.concatenate(pool_targets)
    drafts = np.concatenate(pool_drafts)
    values = np.concatenate(pool_values)

    dimension = 2 * vocab_size
    size = max(population, 5)
    chosen = np.argsort(-values)[: size // 2]
    init = np.concatenate(
        [
            _logits_from_pairs(targets[chosen], drafts[chosen]),
            rng.uniform(-LOGIT_BOUND / 4, LOGIT_BOUND / 4, size=(size - chosen.size, dimension)),
        ]
    )
    bounds = [(-LOGIT_BOUND, LOGIT_BOUND)] * dimension

    def negative(points: Array) -> Array:  # differential_evolution: x of shape (dim, S)
        target, draft = _pairs_from_logits(points.T, vocab_size)
        found = consider(target, draft)
        return np.where(np.isfinite(found), -found, np.inf)

    if generations > 0:
        result = optimize.differential_evolution(
            negative,
            bounds,
            maxiter=generations,
            init=init,
            vectorized=True,
            updating="deferred",
            polish=False,
            seed=rng,
            tol=0.0,
        )
        starts = [result.x] + list(init[:polish_starts])
    else:
        starts = list(init[:polish_starts])

    def negative_one(point: Array) -> float:
        return float(negative(np.clip(point, -LOGIT_BOUND, LOGIT_BOUND)[:, None])[0])

    for start in starts[:polish_starts]:
        optimize.minimize(
            negative_one,
            start,
            method="Nelder-Mead",
            options={"maxfev": polish_evaluations, "xatol": 1e-12, "fatol": 1e-15},
        )
    best.evaluations = evaluations
    return best


def maximise_scalar(
    objective: Callable[[Array], Array],
    bounds: list[tuple[float, float]],
    rng: np.random.Generator,
    *,
    random_points: int = 5000,
    polish_starts: int = 5,
    polish_evaluations: int = 300,
) -> tuple[float, Array, int]:
    """Maximise a vectorised ``objective(points [N, d]) -> [N]`` over a box.

    Random points first, then Nelder–Mead from the best ``polish_starts`` of them.
    Returns (best value, best point, evaluations).
    """
    low = np.array([edge[0] for edge in bounds])
    high = np.array([edge[1] for edge in bounds])
    points = low + (high - low) * rng.random((random_points, len(bounds)))
    values = _safe(np.asarray(objective(points), dtype=np.float64))
    evaluations = values.size
    order = np.argsort(-values)
    best_value, best_point = float(values[order[0]]), points[order[0]].copy()

    def negative(point: Array) -> float:
        nonlocal evaluations, best_value, best_point
        clipped = np.clip(point, low, high)
        value = float(_safe(np.asarray(objective(clipped[None]), dtype=np.float64))[0])
        evaluations += 1
        if value > best_value:
            best_value, best_point = value, clipped.copy()
        return -value if np.isfinite(value) else np.inf

    for index in order[:polish_starts]:
        optimize.minimize(
            negative,
            points[index],
            method="Nelder-Mead",
            options={"maxfev": polish_evaluations, "xatol": 1e-13, "fatol": 1e-16},
        )
    return best_value, best_point, evaluations
