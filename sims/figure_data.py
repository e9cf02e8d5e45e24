"""Small data sets behind single figures: γ* curves, frontier masses, a worked example.

- ``gamma_curves``: γ*(q_n, δ) from the paper's closed form (Corollary 5) and the exact
  binary-KL root, on a grid of q_n, for a few δ.
- ``drafted_masses``: what each rule gives the drafted token in real contexts: the
  frontier's h_n = clip(p_n, c_lo q_n, c_hi q_n) depends on p_n as well as q_n, while
  cactus-exact's γ*(q_n, δ) depends on q_n only.
- ``worked_example``: one real held-out context with q, p, and the h each rule targets
  when the draft proposes its most likely token.
"""

from __future__ import annotations

import numpy as np

from cactus_theory import law, rules
from cactus_theory.core import gamma, validate
from cactus_theory.core.rules.base import DecisionRule
from sims.pools import PairPool

Array = np.ndarray


def gamma_curves(deltas: tuple[float, ...], points: int = 401) -> list[dict]:
    """Rows (delta, target_mass, closed_form, exact) over q_n in [0, 1]."""
    grid = np.linspace(0.0, 1.0, validate.positive_int("points", points))
    out = []
    for delta in deltas:
        budget = validate.nonnegative("delta", delta)
        closed = gamma.closed_form_raised_mass(grid, budget)
        exact = gamma.exact_raised_mass(grid, budget)
        for q_n, c, e in zip(grid, closed, exact, strict=True):
            out.append({"delta": budget, "target_mass": q_n, "closed_form": c, "exact": e})
    return out


def drafted_masses(
    pool: PairPool, deltas: tuple[float, ...], samples: int = 1500, seed: int = 0
) -> list[dict]:
    """For drafted tokens n ~ p in random pool rows: q_n, p_n, and h_n of each rule."""
    rng = np.random.default_rng(seed)
    count = validate.positive_int("samples", samples)
    chosen = rng.integers(0, pool.size, count)
    target, draft = pool.target_probs[chosen], pool.draft_probs[chosen]
    cumulative = np.cumsum(draft, axis=1)
    drafted = np.minimum(
        (cumulative <= rng.random(count)[:, None] * cumulative[:, -1:]).sum(axis=1),
        draft.shape[1] - 1,
    )
    rows = np.arange(count)
    out = []
    for delta in deltas:
        frontier = rules.make("frontier", delta=delta).target_law(target, draft)
        exact = gamma.exact_raised_mass(target[rows, drafted], delta)
        closed = gamma.closed_form_raised_mass(target[rows, drafted], delta)
        for r in rows:
            n = drafted[r]
            out.append(
                {
                    "delta": delta,
                    "target_mass": target[r, n],
                    "draft_mass": draft[r, n],
                    "frontier_mass": frontier[r, n],
                    "cactus_exact_mass": exact[r],
                    "cactus_mass": closed[r],
                }
            )
    return out


#: The rules the worked example shows, in order.
EXAMPLE_RULES = (
    "sps",
    "cactus:delta=0.25",
    "cactus-exact:delta=0.25",
    "frontier:delta=0.25",
    "interp:alpha=0.5",
    "tas",
)


def pick_example(pool: PairPool) -> int:
    """A readable context, the first row (deterministic) where: the verifier and the draft
    each put mass on 3–8 tokens, the draft's favourite n has 0 < q_n < p_n (so SpS may reject
    it and the relaxed rules raise it), and SpS acceptance lies strictly in (0.2, 0.7)."""
    target, draft = pool.target_probs, pool.draft_probs
    target_width = (target > 0).sum(axis=1)
    draft_width = (draft > 0).sum(axis=1)
    favourite = np.argmax(draft, axis=1)
    rows = np.arange(pool.size)
    q_n, p_n = target[rows, favourite], draft[rows, favourite]
    sps = law.acceptance_rows(rules.make("sps"), target, draft)
    good = (
        (target_width >= 3)
        & (target_width <= 8)
        & (draft_width >= 3)
        & (draft_width <= 8)
        & (q_n > 0)
        & (q_n < p_n)
        & (sps > 0.2)
        & (sps < 0.7)
    )
    candidates = np.flatnonzero(good)
    if candidates.size == 0:
        raise ValueError("pool: no context fits the worked example's criteria")
    return int(candidates[0])


def worked_example(pool: PairPool, row: int, token_text) -> dict:
    """q, p and each rule's h for the draft's most likely token n in context ``row``.

    For decision rules (TAS) the bars are the law of the emitted token given n (e_n when
    accepted, the recovery law otherwise). ``token_text(id)`` renders a token.
    """
    target = pool.target_probs[row]
    draft = pool.draft_probs[row]
    keep = np.flatnonzero((target > 0) | (draft > 0))
    drafted = int(np.argmax(draft))
    bars = {"target q": target[keep], "draft p": draft[keep]}
    acceptance = {}
    for spec in EXAMPLE_RULES:
        rule = rules.parse(spec)
        adjusted = rule.adjusted_target(target=target, draft=draft, token=drafted)
        label = rule.label if not isinstance(rule, DecisionRule) else f"{rule.name} (given n)"
        bars[label] = adjusted[keep]
        acceptance[label] = {
            "drafted": rule.accept_prob(target=target, draft=draft, token=drafted),
            "overall": float(law.acceptance(rule, target=target, draft=draft)),
        }
    order = ["target q", "draft p"]
    order += [label for label in bars if label not in order]
    ids = pool.ids[row, keep]
    context = pool.contexts[row] if pool.contexts is not None else []
    return {
        "row": row,
        "context_ids": [int(t) for t in context],
        "context_text": "".join(token_text(int(t)) for t in context),
        "token_ids": [int(t) for t in ids],
        "tokens": [token_text(int(t)) for t in ids],
        "drafted_index": int(np.flatnonzero(keep == drafted)[0]),
        "order": order,
        "bars": {label: [float(v) for v in values] for label, values in bars.items()},
        "acceptance": acceptance,
    }
