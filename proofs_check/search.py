"""Worst-case search over (target, draft) pairs: random families, then scipy.optimize.

``maximise_over_pairs`` looks for the pair (q, p) on V tokens that maximises a vectorised
objective. It works in logit space, q = softmax(x[:V]), p = softmax(x[V:]) with x in
[−``LOGIT_BOUND``, ``LOGIT_BOUND``]^(2V) (so masses down to e^(−2·LOGIT_BOUND) are
reachable):

1. evaluate the objective on random instances from every family (``instances``) and keep
   the best as seeds;
2. run ``scipy.optimize.differential_evolution`` (vectorised, population seeded with them);
3. polish the best few points with Nelder–Mead (a multi-start local search: scipy's
   Nelder–Mead from each start, the starts run side by side so that each round's points
   are evaluated in one call, ``neldermead``).

Every evaluation counts as one instance. The result is a lower bound on the supremum: a
found value is attained by the returned pair.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from proofs_check import instances, neldermead

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


class _PairTracker:
    """The objective over pairs, counting evaluations and keeping the best pair seen."""

    def __init__(self, objective: Objective, vocab_size: int) -> None:
        self.objective = objective
        self.vocab_size = vocab_size
        self.evaluations = 0
        uniform = np.full(vocab_size, 1 / vocab_size)
        self.best = SearchResult(-np.inf, uniform, uniform.copy(), 0)

    def consider(self, target: Array, draft: Array) -> Array:
        """The objective's values [N] of pairs [N, V] (non-finite as −inf)."""
        values = _safe(np.asarray(self.objective(target, draft), dtype=np.float64))
        self.evaluations += values.size
        top = int(np.argmax(values))
        if values[top] > self.best.value:
            self.best = SearchResult(float(values[top]), target[top].copy(), draft[top].copy(), 0)
        return values

    def negative(self, points: Array) -> Array:
        """−objective at logit points [2V, S] (differential_evolution's layout), +inf where
        it is not finite."""
        return self.negative_rows(points.T)

    def negative_rows(self, rows: Array) -> Array:
        """−objective at logit points [S, 2V] (one per row), +inf where it is not finite."""
        target, draft = _pairs_from_logits(rows, self.vocab_size)
        found = self.consider(target, draft)
        return np.where(np.isfinite(found), -found, np.inf)


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
    """Maximise ``objective(target [N,V], draft [N,V]) -> [N]`` over pairs on V tokens:
    random pairs (and ``seeds``), then differential evolution in logit space from the best
    of them, then Nelder-Mead from the best points."""
    tracker = _PairTracker(objective, vocab_size)
    init = _initial_population(tracker, rng, vocab_size, random_pairs, population, seeds)
    if generations > 0:
        result = optimize.differential_evolution(
            tracker.negative,
            [(-LOGIT_BOUND, LOGIT_BOUND)] * (2 * vocab_size),
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

    neldermead.minimise_side_by_side(
        lambda points: tracker.negative_rows(np.clip(points, -LOGIT_BOUND, LOGIT_BOUND)),
        starts[:polish_starts],
        maxfev=polish_evaluations,
        xatol=1e-12,
        fatol=1e-15,
    )
    tracker.best.evaluations = tracker.evaluations
    return tracker.best


def _initial_population(
    tracker: _PairTracker,
    rng: np.random.Generator,
    vocab_size: int,
    random_pairs: int,
    population: int,
    seeds: list[tuple[Array, Array]] | None,
) -> Array:
    """Evaluate random pairs and the seeds; the evolution's first population [S, 2V]: the
    logits of the best half, the rest uniform in a quarter of the logit bound."""
    pool_targets, pool_drafts, pool_values = [], [], []
    for batch in instances.batches(rng, random_pairs, (vocab_size,)):
        pool_targets.append(batch.target)
        pool_drafts.append(batch.draft)
        pool_values.append(tracker.consider(batch.target, batch.draft))
    if seeds:
        seed_target = np.stack([pair[0] for pair in seeds])
        seed_draft = np.stack([pair[1] for pair in seeds])
        pool_targets.append(seed_target)
        pool_drafts.append(seed_draft)
        pool_values.append(tracker.consider(seed_target, seed_draft))
    targets = np.concatenate(pool_targets)
    drafts = np.concatenate(pool_drafts)
    values = np.concatenate(pool_values)
    size = max(population, 5)
    chosen = np.argsort(-values)[: size // 2]
    random_rows = rng.uniform(
        -LOGIT_BOUND / 4, LOGIT_BOUND / 4, size=(size - chosen.size, 2 * vocab_size)
    )
    return np.concatenate([_logits_from_pairs(targets[chosen], drafts[chosen]), random_rows])


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

    Random points first, then Nelder–Mead from the best ``polish_starts`` of them (side by
    side, ``neldermead``). Returns (best value, best point, evaluations).
    """
    low = np.array([edge[0] for edge in bounds])
    high = np.array([edge[1] for edge in bounds])
    points = low + (high - low) * rng.random((random_points, len(bounds)))
    values = _safe(np.asarray(objective(points), dtype=np.float64))
    evaluations = values.size
    order = np.argsort(-values)
    best_value, best_point = float(values[order[0]]), points[order[0]].copy()

    def negative(polished: Array) -> Array:
        nonlocal evaluations, best_value, best_point
        clipped = np.clip(polished, low, high)  # [S, d]
        found = _safe(np.asarray(objective(clipped), dtype=np.float64))
        evaluations += found.size
        for index in range(found.size):  # in order: the first of equal values is kept
            if found[index] > best_value:
                best_value, best_point = float(found[index]), clipped[index].copy()
        return np.where(np.isfinite(found), -found, np.inf)

    neldermead.minimise_side_by_side(
        negative,
        [points[index] for index in order[:polish_starts]],
        maxfev=polish_evaluations,
        xatol=1e-13,
        fatol=1e-16,
    )
    return best_value, best_point, evaluations
