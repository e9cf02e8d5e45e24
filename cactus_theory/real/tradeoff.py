"""The exact acceptance–divergence trade-off of rules on a real pool (no sampling noise).

A pool (``real.pools``) holds N positions c of real contexts with the verifier's row q_c
and the draft's row p_c at each. For a rule with acceptance probabilities a^c and emitted
law μ_c at position c (``core.stats.position_stats``), the pool-level statistics are means
over positions, the pool being the empirical law of the contexts:

    acceptance   α      = E_c[Σ_n p_c,n a^c_n]
    KL per token        = E_c[KL(μ_c‖q_c)]          TV per token = E_c[TV(μ_c, q_c)]
    largest branch KL   = max_c max_{n: p_c,n > 0} KL(h^{c,n}‖q_c)   (branch/target rules)

and the frontier's acceptance at a rule's KL is the pool-level A*(K) of
``core.pool_frontier``: the most any rule reaches at the same mean KL per token. A rule is
dominated by the frontier, α <= A*(KL), which ``dominance_violations`` checks rather than
assumes.

Predicted accepted length and speed-up for k drafts per verify call follow Leviathan et al.
under their i.i.d. assumption (every draft position accepts with the pool's α, positions
independent): AL_k = Σ_{j=1..k} α^j and speed-up (AL_k + 1)/(k c + v_k), with c the draft
cost in verifier steps and v_k the cost of one verify call of k + 1 tokens in
autoregressive steps (1 in Leviathan's model). Both assumptions are optimistic for the
feature draft: its positions 2..k read its own features and accept less than position 1,
which the pool describes (``real.pools`` module docstring).

Rows are packed to their support in the pool; a rule that does not declare
``support_only`` (it may depend on the vocabulary size or on zero entries) is computed on
whole rows (``RealPool.rows(full=True)``), so packing never changes a number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from cactus_theory.core import block, pool_frontier, stats
from cactus_theory.core.rules import Rule, exact_family, parse, spec_of
from cactus_theory.real.pools import RealPool

Array = np.ndarray

#: Positions per chunk for packed rows, and for whole rows (V columns).
PACKED_CHUNK = 4096
WHOLE_CHUNK = 64

#: The δ grid of the default rules (cactus and cactus-exact).
DEFAULT_DELTAS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)


def default_rules() -> list[str]:
    """sps, tas, cactus and cactus-exact over ``DEFAULT_DELTAS``, frontier, and the engines'
    relaxed rules at the settings they publish (TensorRT-LLM: top-K 10, δ 0.6)."""
    specs = ["sps", "tas"]
    specs += [f"cactus:delta={delta:g}" for delta in DEFAULT_DELTAS]
    specs += [f"cactus-exact:delta={delta:g}" for delta in DEFAULT_DELTAS]
    specs += ["frontier:delta=0.05", "frontier:delta=0.2"]
    specs += ["relaxed:top_k=10,delta=0.6", "sglang"]
    return specs


@dataclass(frozen=True)
class RuleStats:
    """One rule's exact statistics over a pool (means over positions; module docstring).

    ``kl_infinite``: share of positions where the rule can emit a token the verifier gives
    probability 0 (KL per token is then +inf); ``max_branch_kl`` is NaN for rules without a
    per-branch target (decision rules, the general family).
    """

    spec: str
    family: str
    positions: int
    acceptance: float
    kl_per_token: float
    tv_per_token: float
    max_branch_kl: float
    kl_infinite: float


def _as_rule(rule: Rule | str) -> Rule:
    return parse(rule) if isinstance(rule, str) else rule


def rule_stats(pool: RealPool, rule: Rule | str) -> RuleStats:
    """Exact acceptance, KL and TV per token and the largest branch KL of ``rule`` on
    ``pool`` (whole rows unless the rule declares ``support_only``)."""
    chosen = _as_rule(rule)
    whole = pool.ids is not None and not chosen.support_only
    size = WHOLE_CHUNK if whole else PACKED_CHUNK
    sums = np.zeros(3)
    worst_branch, infinite, count = -math.inf, 0, 0
    for part in pool.chunks(size):
        target, draft = pool.rows(part, full=whole)
        found = stats.exact_stats(chosen, target, draft)
        finite = np.isfinite(found.kl)
        infinite += int((~finite).sum())
        sums += [found.acceptance.sum(), np.where(finite, found.kl, 0.0).sum(), found.tv.sum()]
        branch = found.branch_kl
        if not np.all(np.isnan(branch)):
            worst_branch = max(worst_branch, float(np.nanmax(branch)))
        count += target.shape[0]
    if count == 0:
        raise ValueError("pool: has no positions")
    mean_kl = math.inf if infinite else float(sums[1] / count)
    return RuleStats(
        spec=spec_of(chosen),
        family=exact_family(chosen) or "general",
        positions=count,
        acceptance=float(sums[0] / count),
        kl_per_token=mean_kl,
        tv_per_token=float(sums[2] / count),
        max_branch_kl=math.nan if worst_branch == -math.inf else worst_branch,
        kl_infinite=infinite / count,
    )


def predicted_al(acceptance: float, k: int) -> float:
    """AL_k = Σ_{j=1..k} α^j: accepted drafts per verify call, i.i.d. positions."""
    return block.expected_accepted(acceptance, k)


def predicted_speedup(
    acceptance: float, k: int, draft_cost: float, verify_cost: float = 1.0
) -> float:
    """(AL_k + 1)/(k c + v_k): tokens per verify call over its cost in autoregressive
    steps (``core.block.speedup``; Leviathan et al. when v_k = 1)."""
    return block.speedup(acceptance, k, cost_ratio=draft_cost, verify_cost=verify_cost)


@dataclass
class TradeoffRow:
    """One rule's row: its statistics, the frontier's acceptance at its KL per token, and
    predicted AL (and speed-up where the costs are known) for k = 1..k_max."""

    stats: RuleStats
    frontier_acceptance: float
    predicted_al: dict[int, float]
    predicted_speedup: dict[int, float] = field(default_factory=dict)


@dataclass
class Tradeoff:
    """Rows for each rule, and the pool's frontier curve [(mean KL, mean acceptance)]."""

    positions: int
    rows: list[TradeoffRow]
    frontier: list[tuple[float, float]]


def tradeoff(
    pool: RealPool,
    rules: Sequence[Rule | str] | None = None,
    *,
    k_max: int = 5,
    draft_cost: float | None = None,
    verify_costs: Mapping[int, float] | None = None,
) -> Tradeoff:
    """Every rule's exact statistics on ``pool`` beside the frontier at its KL, with
    predicted AL for k = 1..``k_max`` and, given ``draft_cost`` c, predicted speed-ups
    (module docstring): at every k with v_k = 1 (Leviathan's assumption) when no
    ``verify_costs`` are given, else at the k whose v_k was measured."""
    if k_max < 1:
        raise ValueError(f"k_max: must be >= 1, got {k_max}")
    if draft_cost is not None and not (draft_cost >= 0 and math.isfinite(draft_cost)):
        raise ValueError(f"draft_cost: must be a finite number >= 0, got {draft_cost}")
    chosen = [_as_rule(rule) for rule in (rules if rules is not None else default_rules())]
    found = [rule_stats(pool, rule) for rule in chosen]
    target, draft = pool.rows(slice(None))  # packed rows: the frontier is support-invariant
    at_kl, curve = pool_frontier.frontier_acceptances(
        target, draft, [row.kl_per_token for row in found]
    )
    rows = []
    for row, frontier_here in zip(found, at_kl, strict=True):
        als = {k: predicted_al(row.acceptance, k) for k in range(1, k_max + 1)}
        speedups = {}
        if draft_cost is not None:  # v_k = 1 without verify costs; else where measured
            speedups = {
                k: predicted_speedup(
                    row.acceptance, k, draft_cost, 1.0 if verify_costs is None else verify_costs[k]
                )
                for k in range(1, k_max + 1)
                if verify_costs is None or k in verify_costs
            }
        rows.append(TradeoffRow(row, float(frontier_here), als, speedups))
    return Tradeoff(len(pool), rows, [(float(kl), float(a)) for kl, a in curve])


def dominance_violations(result: Tradeoff, tolerance: float = 1e-9) -> list[str]:
    """Rules whose acceptance exceeds the frontier's at their KL by more than
    ``tolerance`` (there should be none: the frontier is the most any rule reaches)."""
    return [
        f"{row.stats.spec}: acceptance {row.stats.acceptance:.6f} > frontier "
        f"{row.frontier_acceptance:.6f} at KL {row.stats.kl_per_token:.6f}"
        for row in result.rows
        if row.stats.acceptance > row.frontier_acceptance + tolerance
    ]


def _number(value: float) -> float | None:
    """JSON has no infinity or NaN: those are written as null (``kl_infinite`` and the
    family say which)."""
    return float(value) if math.isfinite(value) else None


def to_json(result: Tradeoff, *, pair: Mapping | None = None, settings: Mapping | None = None):
    """The trade-off as plain JSON data::

        {"positions": N, "pair": {...}, "settings": {...},
         "rows": [{"rule": spec, "label", "family", "acceptance", "kl_per_token",
                   "tv_per_token", "max_branch_kl", "kl_infinite", "frontier_acceptance",
                   "predicted_al": {"1": AL_1, ...}, "predicted_speedup": {...}}],
         "frontier": [{"kl": K, "acceptance": A*(K)}, ...]}

    An infinite KL per token (the rule can emit a token the verifier excludes) or a
    missing branch KL is null."""
    rows = []
    for row in result.rows:
        found = row.stats
        rows.append(
            {
                "rule": found.spec,
                "label": parse(found.spec).label,
                "family": found.family,
                "acceptance": found.acceptance,
                "kl_per_token": _number(found.kl_per_token),
                "tv_per_token": found.tv_per_token,
                "max_branch_kl": _number(found.max_branch_kl),
                "kl_infinite": found.kl_infinite,
                "frontier_acceptance": row.frontier_acceptance,
                "predicted_al": {str(k): value for k, value in row.predicted_al.items()},
                "predicted_speedup": {str(k): value for k, value in row.predicted_speedup.items()},
            }
        )
    return {
        "positions": result.positions,
        "pair": dict(pair or {}),
        "settings": dict(settings or {}),
        "rows": rows,
        "frontier": [{"kl": kl, "acceptance": value} for kl, value in result.frontier],
    }


#: The CSV's columns, in order (``write_csv``).
CSV_COLUMNS = (
    "rule",
    "label",
    "family",
    "acceptance",
    "kl_per_token",
    "tv_per_token",
    "max_branch_kl",
    "kl_infinite",
    "frontier_acceptance",
)


def csv_text(data: Mapping) -> str:
    """One line per rule of ``to_json``'s data: ``CSV_COLUMNS``, then predicted_al_k and
    predicted_speedup_k for each k (empty where unknown; inf for an infinite KL)."""
    import csv
    import io

    ks = sorted({int(k) for row in data["rows"] for k in row["predicted_al"]})
    speed_ks = sorted({int(k) for row in data["rows"] for k in row["predicted_speedup"]})
    header = [*CSV_COLUMNS]
    header += [f"predicted_al_{k}" for k in ks]
    header += [f"predicted_speedup_{k}" for k in speed_ks]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for row in data["rows"]:
        values = [row[column] for column in CSV_COLUMNS]
        if row["kl_per_token"] is None:
            values[CSV_COLUMNS.index("kl_per_token")] = "inf"
        values += [row["predicted_al"].get(str(k), "") for k in ks]
        values += [row["predicted_speedup"].get(str(k), "") for k in speed_ks]
        writer.writerow(["" if value is None else value for value in values])
    return buffer.getvalue()


# -- reading a trade-off document -----------------------------------------------------------

#: A KL this small is written as 0 (a lossless rule's rounding).
KL_ZERO = 1e-12


def find_row(document: Mapping, spec: str) -> dict | None:
    """The row of a ``to_json`` document whose rule is ``spec`` (compared after parsing,
    so ``cactus:delta=1`` finds ``cactus:delta=1.0``), or None."""
    wanted = spec_of(parse(spec))
    for row in document.get("rows", []):
        if spec_of(parse(row["rule"])) == wanted:
            return row
    return None


def format_kl(value: float | None) -> str:
    """A KL per token in nats: None (infinite) as ∞, rounding of 0 as 0, values below
    1e-3 in scientific notation, others to 4 decimals."""
    if value is None:
        return "∞"
    if abs(value) < KL_ZERO:
        return "0"
    if abs(value) >= 1e-3:
        return f"{value:.4f}"
    return f"{value:.2e}"


def headline(document: Mapping, dataset: str, digits: int = 3) -> str | None:
    """The sentence a reader can quote: what Cactus δ = 1 accepts over SpS on ``dataset``,
    at what divergence, and the frontier at that divergence (acceptances to ``digits``
    decimals). None when either row is missing or Cactus's KL is infinite."""
    lossless, relaxed = find_row(document, "sps"), find_row(document, "cactus:delta=1")
    if lossless is None or relaxed is None or relaxed["kl_per_token"] is None:
        return None
    gain = 100 * (relaxed["acceptance"] - lossless["acceptance"])
    return (
        f"On {dataset} ({document['positions']:,} positions), Cactus δ=1 accepts "
        f"{relaxed['acceptance']:.{digits}f} vs SpS's {lossless['acceptance']:.{digits}f} "
        f"({gain:+.1f} points) at KL {format_kl(relaxed['kl_per_token'])} nats/token, TV "
        f"{relaxed['tv_per_token']:.{digits}f}; the frontier reaches "
        f"{relaxed['frontier_acceptance']:.{digits}f} at that KL."
    )
