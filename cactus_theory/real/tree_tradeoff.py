"""The exact acceptance–KL trade-off of tree rules on a real pool: one node of K children at
every position of the pool, K in {1, 2, 4}, children drafted deterministically (the
draft's top-K, EAGLE/SGLang) or sampled from the draft (with or without replacement).

For each configuration (scheme, K) and tree rule, over the pool's positions c:

    acceptance   = E_c[P(some child accepted)]      KL per token = E_c[KL(e_c ‖ q_c)]
    TV per token = E_c[TV(e_c, q_c)]

with e_c the node's exact law, and the pool-level frontier at the rule's KL: the most
mean acceptance any scheme reaches with mean KL per node at most that (0 violations,
checked). The frontier reduces to the single-draft pool frontier (``core.pool_frontier``)
with each row's draft replaced by its core representative s_c (``trees.frontier``): q on
S renormalised for deterministic children S (then the frontier is the two-level tilt, exact),
the lexicographically optimal base for i.i.d. children (exact at KL 0 and attained; its
optimality at every KL is the claim ``trees.frontier-exact``, held against cvxpy).

How each number is computed (``method`` in every row):

- ``enumerated``: the rule's node law summed over every drafted tuple of the row (exact);
  deterministic children are one tuple per row, batched;
- ``closed form``: the rule's declared closed forms (lossless laws = q, RRS's
  1 − Π TV(q_i, p), K-SEQ's 1 − (1 − β(ρ*))^K, the optimum's sorted scan), exact;
- ``not computed``: sampled children whose tuples per row exceed ``MAX_TUPLES`` (K = 4 at
  the pool's draft support of up to 20 tokens: 160,000 ordered tuples) and a rule with no
  closed form; such rows say so and carry no numbers.

Without-replacement children get no frontier here (its core decomposition enumerates
subsets of the draft's support: 2^20 per row), and a row whose draft has fewer than K
tokens drafts all of them. Predicted accepted length for a tree of
depth D with the same K at every depth, AL_D = Σ_{d=1..D} α^d, assumes every depth accepts
like the pool's first position; a pool does not observe deeper depths (the draft's j-th
level reads its own features: ``real.pools``), so AL_D is optimistic for D >= 2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from cactus_theory.core import divergences, pool_frontier, trees
from cactus_theory.real.pools import RealPool

Array = np.ndarray

#: The node widths of the default trade-off.
DEFAULT_WIDTHS = (1, 2, 4)
#: The schemes, as written in the JSON.
SCHEMES = (trees.DETERMINISTIC, trees.WITH_REPLACEMENT, trees.WITHOUT_REPLACEMENT)
#: Enumerate sampled children only when a row has at most this many drafted tuples.
MAX_TUPLES = 1000
DELTAS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)


def default_tree_rules(scheme: str) -> list[str]:
    """The tree rules the trade-off shows for ``scheme`` (lossless, Cactus over δ, the
    engines' relaxed rules at their published settings)."""
    if scheme == trees.DETERMINISTIC:
        specs = ["walk", *(f"cactus-tree:delta={d:g}" for d in DELTAS)]
        specs += ["cactus-tree:delta=1,exact=false"]
        specs += [f"sglang-tree:threshold_acc={t:g}" for t in (0.9, 0.7, 0.5, 0.3)]
        return [*specs, "medusa-typical"]
    if scheme == trees.WITH_REPLACEMENT:
        specs = ["rrs", "k-seq", "optimal"]
        return [*specs, *(f"cactus-rrs:delta={d:g}" for d in DELTAS), "cactus-tree:delta=1"]
    return ["rrs", "walk", "cactus-rrs:delta=1", "sglang-tree:threshold_acc=0.5"]


@dataclass
class TreeRow:
    """One tree rule at one configuration (module docstring); NaN where not computed."""

    spec: str
    label: str
    method: str
    acceptance: float
    kl_per_token: float
    tv_per_token: float
    frontier_acceptance: float
    predicted_al: dict[int, float] = field(default_factory=dict)


@dataclass
class Configuration:
    """One (scheme, K): its rows and the pool frontier curve [(mean KL, acceptance)]
    (empty where the frontier is not computed)."""

    scheme: str
    width: int
    rows: list[TreeRow]
    frontier: list[tuple[float, float]]


def _rule(spec: str, scheme: str) -> trees.TreeRule:
    rule = trees.make("optimal", scheme=scheme) if spec == "optimal" else trees.parse(spec)
    if not rule.support_only:
        raise ValueError(
            f"rule: {spec} does not declare support_only; the tree trade-off runs on the "
            "pool's packed rows"
        )
    return rule


def top_children(draft: Array, width: int) -> Array:
    """[N, K]: each row's top-K columns by draft probability (first index on ties)."""
    return np.argsort(-draft, axis=-1, kind="stable")[:, :width]


def _node_kl_tv(law: Array, target: Array) -> tuple[Array, Array]:
    law = law / law.sum(axis=-1, keepdims=True)
    return divergences.kl_rows(law, target), divergences.tv_rows(law, target)


def rule_rows(
    rule: trees.TreeRule, target: Array, draft: Array, width: int, scheme: str
) -> tuple[Array, Array, Array, str]:
    """(acceptance [N], KL [N], TV [N], method) of ``rule`` on rows of (q, p) with
    ``width`` children by ``scheme`` (module docstring; NaN rows when not computed)."""
    count = target.shape[0]
    if scheme == trees.DETERMINISTIC:
        law, accepted = trees.node_law_rows(rule, target, draft, top_children(draft, width))
        return accepted, *_node_kl_tv(law, target), "enumerated"
    law, accepted = trees.closed_form(rule, target, draft, width, scheme)
    if law is not None and accepted is not None:
        return accepted, *_node_kl_tv(np.broadcast_to(law, target.shape), target), "closed form"
    support = np.count_nonzero(draft, axis=-1)
    if np.max(support.astype(float) ** width) > MAX_TUPLES:  # an upper bound on the tuples
        nothing = np.full(count, np.nan)
        return nothing, nothing, nothing, "not computed"
    accepted, kl, tv = np.empty(count), np.empty(count), np.empty(count)
    for row in range(count):
        # Without replacement a row whose draft has fewer than K tokens drafts them all.
        fits = width if scheme == trees.WITH_REPLACEMENT else min(width, int(support[row]))
        node = trees.Node(target=target[row], draft=draft[row], k=fits, scheme=scheme)
        exact = trees.enumerate_node(rule, node)
        accepted[row] = exact.acceptance
        kl[row], tv[row] = (float(v[0]) for v in _node_kl_tv(exact.law[None], target[row][None]))
    return accepted, kl, tv, "enumerated"


def core_rows(target: Array, draft: Array, width: int, scheme: str) -> Array | None:
    """[N, W]: each row's core representative s_c (module docstring), or None (no
    frontier for ``scheme`` here)."""
    if scheme == trees.DETERMINISTIC:
        children = top_children(draft, width)
        inside = np.zeros_like(target, dtype=bool)
        np.put_along_axis(inside, children, True, axis=-1)
        mass = np.where(inside, target, 0.0)
        total = mass.sum(axis=-1, keepdims=True)
        uniform = inside / inside.sum(axis=-1, keepdims=True)
        return np.where(total > 0, mass / np.where(total > 0, total, 1.0), uniform)
    if scheme == trees.WITH_REPLACEMENT or width == 1:
        pairs = zip(target, draft, strict=True)
        return np.stack([trees.lexicographic_base(t, d, width) for t, d in pairs])
    return None


def configuration(
    pool: RealPool, scheme: str, width: int, specs: Sequence[str] | None = None, k_max: int = 5
) -> Configuration:
    """Every rule's exact statistics at (``scheme``, K = ``width``) beside the frontier."""
    target, draft = pool.rows(slice(None))
    rules = [_rule(spec, scheme) for spec in (specs or default_tree_rules(scheme))]
    found = []
    for rule in rules:
        if scheme not in rule.schemes:
            raise ValueError(f"rule: {trees.spec_of(rule)} is not defined for {scheme} children")
        accepted, kl, tv, method = rule_rows(rule, target, draft, width, scheme)
        mean_kl = math.inf if np.any(np.isinf(kl)) else float(np.mean(kl))
        found.append((rule, float(np.mean(accepted)), mean_kl, float(np.mean(tv)), method))
    base = core_rows(target, draft, width, scheme)
    frontier, curve = [math.nan] * len(found), []
    if base is not None:
        known = [i for i, item in enumerate(found) if not math.isnan(item[2])]
        levels = [found[i][2] for i in known]
        values, curve = pool_frontier.frontier_acceptances(target, base, levels)
        for index, value in zip(known, values, strict=True):
            frontier[index] = float(value)
    rows = []
    for (rule, accepted, kl, tv, method), best in zip(found, frontier, strict=True):
        als = {d: trees.predicted_length([accepted] * d) for d in range(1, k_max + 1)}
        rows.append(TreeRow(trees.spec_of(rule), rule.label, method, accepted, kl, tv, best, als))
    return Configuration(scheme, width, rows, [(float(k), float(a)) for k, a in curve])


def tree_tradeoff(
    pool: RealPool,
    widths: Sequence[int] = DEFAULT_WIDTHS,
    schemes: Sequence[str] = SCHEMES,
    rules: Mapping[str, Sequence[str]] | None = None,
    k_max: int = 5,
) -> list[Configuration]:
    """Every configuration (scheme, K) of ``schemes`` x ``widths`` (without replacement
    only where K fits the draft's support)."""
    return [
        configuration(pool, scheme, width, (rules or {}).get(scheme), k_max)
        for scheme in schemes
        for width in widths
    ]


def violations(result: Sequence[Configuration], tolerance: float = 1e-9) -> list[str]:
    """Rows whose acceptance exceeds the frontier at their KL (there must be none)."""
    return [
        f"{config.scheme} K={config.width} {row.spec}: {row.acceptance:.6f} > frontier "
        f"{row.frontier_acceptance:.6f} at KL {row.kl_per_token:.6g}"
        for config in result
        for row in config.rows
        if math.isfinite(row.frontier_acceptance)
        and row.acceptance > row.frontier_acceptance + tolerance
    ]


def _number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def to_json(result: Sequence[Configuration], **extra) -> dict:
    """``{"configurations": [{"scheme", "width", "rows": [{"rule", "label", "method",
    "acceptance", "kl_per_token", "tv_per_token", "frontier_acceptance",
    "predicted_al": {"1": ...}}], "frontier": [{"kl", "acceptance"}]}], "violations": [...],
    **extra}``; infinite or not-computed numbers are null."""
    configs = []
    for config in result:
        rows = [
            {
                "rule": row.spec,
                "label": row.label,
                "method": row.method,
                "acceptance": _number(row.acceptance),
                "kl_per_token": _number(row.kl_per_token),
                "kl_infinite": math.isinf(row.kl_per_token),
                "tv_per_token": _number(row.tv_per_token),
                "frontier_acceptance": _number(row.frontier_acceptance),
                "predicted_al": {str(d): _number(v) for d, v in row.predicted_al.items()},
            }
            for row in config.rows
        ]
        frontier = [{"kl": kl, "acceptance": value} for kl, value in config.frontier]
        configs.append(
            {"scheme": config.scheme, "width": config.width, "rows": rows, "frontier": frontier}
        )
    return {"configurations": configs, "violations": violations(result), **extra}


CSV_COLUMNS = (
    "scheme",
    "width",
    "rule",
    "method",
    "acceptance",
    "kl_per_token",
    "tv_per_token",
    "frontier_acceptance",
)


def csv_text(data: Mapping) -> str:
    """One line per (configuration, rule): ``CSV_COLUMNS`` then predicted_al_D."""
    import csv
    import io

    depths = sorted(
        {int(d) for c in data["configurations"] for r in c["rows"] for d in r["predicted_al"]}
    )
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*CSV_COLUMNS, *(f"predicted_al_{d}" for d in depths)])
    for config in data["configurations"]:
        for row in config["rows"]:
            kl = "inf" if row["kl_infinite"] else row["kl_per_token"]
            values = [config["scheme"], config["width"], row["rule"], row["method"]]
            values += [row["acceptance"], kl, row["tv_per_token"], row["frontier_acceptance"]]
            values += [row["predicted_al"].get(str(d)) for d in depths]
            writer.writerow(["" if value is None else value for value in values])
    return buffer.getvalue()
