"""The paper's decoding table on a real pair: every rule against autoregressive decoding.

``run(setup, settings, cache)`` decodes the same prompts with the same sampling settings
and seed for the autoregressive baseline and every (rule, k) config, in ``repeats``
interleaved rounds (config 1..n, then again), so a slow spell on a shared machine hits
every config alike. Each (config, round) is a cell cached as JSON under ``cache`` (keyed by
the settings, the prompts, the pair and the code), so an interrupted run resumes. A row
keeps its first round's decoding statistics (every round reseeds, so the tokens are the
same on CPU) and its median round's tokens/s. With ``reseed``, round r decodes with seed
``seed + r`` instead (every config of a round shares it), so the rounds are different
samples and a row's decoding statistics are pooled over all its rounds: more tokens
behind AL, α and KL for the same time.

**Batch sizes.** With ``batch_sizes`` (1, 2, 4, 8, ...) every config runs at every batch
size, each size with its own baseline, all interleaved in the same rounds; a row's speed-up
is over the baseline at its own batch size, and ``speedup_over_reference`` over the
baseline at the first size (batch 1): where plain batching overtakes speculation.

**Speed-up and its interval.** Round r gives the paired ratio s_r = tokens/s(config, r) /
tokens/s(baseline, r) (the baseline ran minutes before, in the same round). The speed-up
is the median of s_1..s_R and its interval the distribution-free order-statistic interval
for a median: [s_(j), s_(R+1−j)] with the largest j such that P(Binomial(R, ½) < j) ≤
0.025, which covers the median with probability ≥ 95% (R ≥ 6). With fewer than
``MIN_ROUNDS`` = 6 rounds no such interval exists, so no speed-up is given at all (None in
the JSON, "-" in the table, and ``speedup_note`` says why): a degenerate interval is never
printed.

Per row, with the baseline's median seconds per autoregressive step T (``decode.runs.
step_seconds``: outside the prefill, one token per row) at the row's batch size:

- AL (accepted drafts per verify step, bonus excluded), tokens per call, tokens/s and the
  speed-up over the baseline with its interval (above);
- ``steps`` (verify steps over rows; at batch 1 the verifier calls), and per draft position
  j = 1..k the steps that reached it (``reached_by_position``) and the share that accepted
  it (``alpha_by_position``, None where none reached it);
- KL per token and per sequence from the divergence meter (exact KL(emitted law ‖ q) per
  token, summed), and the verifier NLL of the generated text (nats/token, T = 1);
- α̂ = accepted drafts / drafted positions reached (the per-position acceptance pooled over
  positions), c = (draft seconds per draft token) / T, the cost ratio of Leviathan et al.,
  and v = (verify seconds per verifier call) / T, the verify call's cost in steps
  (``decode.runs.StepCosts``);
- Leviathan's predicted speed-up (1 − α̂^{k+1}) / ((1 − α̂)(k c + 1)), which assumes
  v = 1, and measured/predicted;
- the sampler's share of decode time (the verify step's rule work) and the meter's cost
  relative to the verify step (the verifier forward and its processors).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from cactus_theory import rules
from cactus_theory.core.processors import PAPER_SETTING, SamplingSettings
from cactus_theory.decode.tree_shape import check_children, parse_tree
from cactus_theory.util import provenance
from cactus_theory.util.files import atomic_write_json

#: The paper's table (Hao & Mou): the baseline, the lossless rule, TAS and Cactus.
PAPER_RULES = (
    "sps",
    "tas",
    "cactus:delta=0.5",
    "cactus:delta=1.0",
    "cactus-exact:delta=1.0",
    "frontier:delta=1.0",
)
PAPER_KS = (3, 5)
#: The fewest interleaved rounds whose median speed-up has a 95% interval.
MIN_ROUNDS = 6
#: The code a cell's numbers depend on.
CODE = provenance.source_fingerprint(
    "cactus_theory/core",
    "cactus_theory/sampler",
    "cactus_theory/decode",
    "cactus_theory/real/decode_table.py",
)


@dataclass(frozen=True)
class TableSettings:
    """Everything that determines the table (and so the cache key)."""

    rules: tuple[str, ...] = PAPER_RULES
    ks: tuple[int, ...] = PAPER_KS
    num_prompts: int = 24
    max_new_tokens: int = 64
    sampling: SamplingSettings = PAPER_SETTING
    batch_size: int = 1
    seed: int = 0
    repeats: int = 3
    #: Several batch sizes, each with its own baseline (the first is the reference);
    #: empty: ``batch_size`` alone.
    batch_sizes: tuple[int, ...] = ()
    #: Round r uses seed + r and statistics are pooled over rounds (module docstring).
    reseed: bool = False
    #: Measure the verifier's NLL of every decoded batch (an untimed verifier forward).
    nll: bool = True
    #: Tree shapes (``decode.tree_shape``), each a row per rule beside the chains of ``ks``;
    #: ``children``: how their children are drafted (``SPEC@SCHEME`` sets it for one tree).
    trees: tuple[str, ...] = ()
    children: str = "deterministic"
    #: ``auto`` trees as chosen per rule: ((rule spec, tree spec, chosen spec), ...).
    chosen: tuple[tuple[str, str, str], ...] = ()

    def __post_init__(self) -> None:
        for spec in self.rules:
            rule_of(spec, self.trees[0] if self.trees and not self.ks else None)  # a bad spec
            # is a ValueError now, not after an hour
        for name in ("num_prompts", "max_new_tokens", "batch_size", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if (not self.ks and not self.trees) or any(k < 1 for k in self.ks):
            raise ValueError(f"k: every draft length must be >= 1, got {self.ks}")
        for tree in self.trees:
            shape, scheme = split_tree(tree, self.children)
            check_children(scheme, parse_tree(shape))
        if any(size < 1 for size in self.batch_sizes):
            raise ValueError(f"batch_sizes: every batch size must be >= 1, got {self.batch_sizes}")
        if len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise ValueError(f"batch_sizes: given twice in {self.batch_sizes}")

    @property
    def sizes(self) -> tuple[int, ...]:
        """The batch sizes the table runs, the reference first."""
        return self.batch_sizes or (self.batch_size,)

    def configs(self) -> list[tuple[str | None, int | None, int, str | None]]:
        """(rule spec, k, batch size, tree) per row: per batch size the baseline (None,
        None, b, None) first, then every rule at every k, then every rule with every tree
        (an ``auto`` tree as chosen for that rule)."""
        chosen = {(spec, tree): used for spec, tree, used in self.chosen}
        return [
            config
            for size in self.sizes
            for config in [(None, None, size, None)]
            + [(spec, k, size, None) for k in self.ks for spec in self.rules]
            + [
                (spec, None, size, chosen.get((spec, tree), tree))
                for tree in self.trees
                for spec in self.rules
            ]
        ]


@dataclass
class Cell:
    """The decoding statistics of one (config, round)."""

    tokens: int
    seconds: float
    verifier_calls: int
    accepted: int
    steps: int
    scanned: int
    drafted: int
    kl_sum: float | None
    sequences: int
    nll: float | None  # None: not measured (``TableSettings.nll``)
    reached: list[int]
    taken: list[int]
    timing: dict = field(default_factory=dict)
    tree_ended: list[list[int]] = field(default_factory=list)
    tree_reached: list[list[int]] = field(default_factory=list)
    nodes: int = 0

    @classmethod
    def of(cls, totals) -> Cell:
        metered = totals.metered
        return cls(
            tokens=totals.tokens,
            seconds=totals.seconds,
            verifier_calls=totals.verifier_calls,
            accepted=sum(totals.accepted),
            steps=len(totals.accepted),
            scanned=totals.scanned,
            drafted=totals.drafted,
            kl_sum=sum(totals.sequence_kl) if metered else None,
            sequences=len(totals.sequence_kl) if metered else 0,
            nll=totals.nll,
            reached=list(totals.reached_by_position),
            taken=list(totals.accepted_by_position),
            timing=dict(totals.timing),
            tree_ended=totals.tree_ended,
            tree_reached=totals.tree_reached,
            nodes=totals.nodes,
        )

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(self.seconds, 1e-12)

    @classmethod
    def pooled(cls, cells: list[Cell]) -> Cell:
        """One cell of several (rounds of one config): counts, times and per-position
        counts summed, the NLL averaged over tokens."""
        tokens = sum(cell.tokens for cell in cells)
        metered = all(cell.kl_sum is not None for cell in cells)
        width = max(len(cell.reached) for cell in cells)
        timing: dict = {}
        for cell in cells:
            for key, value in cell.timing.items():
                timing[key] = timing.get(key, 0) + value
        return cls(
            tokens=tokens,
            seconds=sum(cell.seconds for cell in cells),
            verifier_calls=sum(cell.verifier_calls for cell in cells),
            accepted=sum(cell.accepted for cell in cells),
            steps=sum(cell.steps for cell in cells),
            scanned=sum(cell.scanned for cell in cells),
            drafted=sum(cell.drafted for cell in cells),
            kl_sum=sum(cell.kl_sum for cell in cells) if metered else None,
            sequences=sum(cell.sequences for cell in cells) if metered else 0,
            nll=(
                None
                if any(cell.nll is None for cell in cells)
                else sum(cell.nll * cell.tokens for cell in cells) / max(tokens, 1)
            ),
            reached=[sum(c.reached[j] for c in cells if j < len(c.reached)) for j in range(width)],
            taken=[sum(c.taken[j] for c in cells if j < len(c.taken)) for j in range(width)],
            timing=timing,
        )


def pair_identity(setup) -> dict:
    """What identifies the pair for the cache: names, and sizes/mtimes of local files."""
    identity = {"verifier": setup.pair.verifier, "draft": setup.pair.draft}
    for role in ("verifier", "draft"):
        path = Path(getattr(setup.pair, role)).expanduser()
        files = sorted(path.rglob("*")) if path.is_dir() else [path] if path.exists() else []
        identity[role + "_files"] = [
            (file.name, file.stat().st_size, int(file.stat().st_mtime)) for file in files
            if file.is_file()
        ]  # fmt: skip
    return identity


def cache_key(settings: TableSettings, setup, device: str, dtype: str, threads: int) -> str:
    return provenance.fingerprint(
        dataclasses.asdict(settings),
        pair_identity(setup),
        setup.prompts[: settings.num_prompts],
        device,
        dtype,
        threads,
        CODE,
    )


def run(
    setup,
    settings: TableSettings,
    cache: Path | None,
    *,
    device: str,
    dtype: str,
    threads: int,
    progress: bool = True,
    on_cell=None,
) -> dict:
    """The table (module docstring) as a JSON-able dict ``{"settings", "rows", ...}``.
    ``on_cell(done, total)`` is called after each (config, round), decoded or read back."""
    from cactus_theory.decode.runs import RunSettings, run_prompts, warm_up

    configs = settings.configs()
    folder = None
    if cache is not None:
        folder = Path(cache) / f"table-{cache_key(settings, setup, device, dtype, threads)}"
    cells: dict[tuple[int, int], Cell] = {}
    warmed = False
    for round_index in range(settings.repeats):
        for index, (spec, k, size, tree) in enumerate(configs):
            path = None if folder is None else folder / f"row{index}-round{round_index}.json"
            loaded = _load(path)
            if loaded is None:
                shape, scheme = (None, settings.children)
                if tree is not None:
                    shape, scheme = split_tree(tree, settings.children)
                run_settings = RunSettings(
                    max_new_tokens=settings.max_new_tokens,
                    sampling=settings.sampling,
                    batch_size=size,
                    seed=settings.seed + (round_index if settings.reseed else 0),
                    divergence=spec is None or meter_exact(rule_of(spec, shape), shape, scheme),
                    tree=shape,
                    children=scheme,
                    nll=settings.nll,
                )
                if not warmed:
                    first = (settings.ks or (1,))[0]
                    warm_up(setup, run_settings, rule_of(settings.rules[0], shape), first)
                    warmed = True
                rule = None if spec is None else rule_of(spec, shape)
                totals = run_prompts(
                    setup, run_settings, rule, k, baseline=spec is None, progress=progress
                )
                loaded = Cell.of(totals)
                if path is not None:
                    atomic_write_json(path, dataclasses.asdict(loaded))
            cells[index, round_index] = loaded
            if on_cell is not None:
                on_cell(len(cells), settings.repeats * len(configs))
    return summarise(settings, configs, cells, setup)


def _load(path: Path | None) -> Cell | None:
    """A cached cell, or None when missing or damaged (then it is recomputed)."""
    if path is None or not path.exists():
        return None
    try:
        return Cell(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


#: z of a two-sided 95% normal interval.
Z95 = 1.959963984540054


def al_half_width(row: dict) -> float | None:
    """A 95% half-width for a row's AL from its own counts: accepted drafts per step lie
    in [0, k], so their variance is at most AL (k − AL) (Bhatia–Davis), and over n verify
    steps (tokens / tokens per call; steps treated as independent) the half-width is at
    most z·√(AL (k − AL)/n). None without the counts."""
    import math

    tokens, per_call, k = row.get("tokens"), row.get("tokens_per_call"), row.get("k")
    if not tokens or not per_call or not k:
        return None
    al = row["acceptance_length"]
    return Z95 * math.sqrt(max(al * (k - al), 0.0) / (tokens / per_call))


def expected_tokens(alpha: float, k: int) -> float:
    """E[tokens per verifier call] for a constant per-position acceptance α, k drafts."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def median_interval(values: list[float]) -> tuple[float, float, float, float]:
    """(median, low, high, coverage): the order-statistic interval of the module docstring."""
    import statistics
    from math import comb

    ordered = sorted(values)
    count = len(ordered)
    median = statistics.median(ordered)
    below = 0.0  # P(Binomial(count, 1/2) < j) for the current j
    j = 0
    while True:
        nxt = below + comb(count, j) / 2**count
        if nxt > 0.025 or j + 1 > count - j:
            break
        below, j = nxt, j + 1
    if j == 0:  # too few rounds for 95%: the range and its coverage
        return median, ordered[0], ordered[-1], 1.0 - 2.0 ** (1 - count) if count > 1 else 0.0
    return median, ordered[j - 1], ordered[count - j], 1.0 - 2 * below


def summarise(settings: TableSettings, configs, cells: dict, setup) -> dict:
    """Rows from the cells: first round's statistics (every round's, pooled, with
    ``reseed``), median round's tokens/s, paired per-round speed-ups with their interval
    (None with fewer than ``MIN_ROUNDS`` rounds), and per round its tokens/s and, for a
    rule, its costs c, v and o (``per_round``)."""
    import statistics

    from cactus_theory.decode.runs import step_costs, step_seconds

    rounds = settings.repeats
    baselines = {size: index for index, (spec, _, size, _) in enumerate(configs) if spec is None}
    reference = baselines[settings.sizes[0]]
    reference_speeds = [cells[reference, r].tokens_per_second for r in range(rounds)]
    rows = []
    for index, (spec, k, size, tree) in enumerate(configs):
        first = cells[index, 0]
        if settings.reseed:
            first = Cell.pooled([cells[index, r] for r in range(rounds)])
        base = baselines[size]
        base_speeds = [cells[base, r].tokens_per_second for r in range(rounds)]
        steps_by_round = [step_seconds(cells[base, r].timing) for r in range(rounds)]
        step = statistics.median(steps_by_round)
        speeds = [cells[index, r].tokens_per_second for r in range(rounds)]
        agree = all(cells[index, r].accepted == first.accepted for r in range(rounds))
        al = first.accepted / first.steps if first.steps else 0.0
        row = {
            "rule": "autoregressive" if spec is None else spec,
            "label": "autoregressive" if spec is None else rule_of(spec, tree).label,
            "k": k or 0,
            "tree": None if tree is None else split_tree(tree, settings.children)[0],
            "children": None if tree is None else split_tree(tree, settings.children)[1],
            "batch_size": size,
            "acceptance_length": al,
            "tokens_per_call": first.tokens / max(first.verifier_calls, 1),
            "tokens_per_second": statistics.median(speeds),
            **_speedup(speeds, base_speeds, "", same=index == base),
            "kl_per_token": None if first.kl_sum is None else first.kl_sum / first.tokens,
            "kl_per_sequence": None if first.kl_sum is None else first.kl_sum / first.sequences,
            "verifier_nll": first.nll,
            "tokens": first.tokens,
            "steps": first.steps,
            "verifier_calls": first.verifier_calls,
            "reached_by_position": first.reached,
            "alpha_by_position": [
                taken / reached if reached else None
                for taken, reached in zip(first.taken, first.reached, strict=True)
            ],
            "rounds_agree": agree,
            "per_round": [
                _round_entry(cells[index, r], spec, k, tree, steps_by_round[r])
                for r in range(rounds)
            ],
        }
        if len(settings.sizes) > 1:
            row.update(
                _speedup(speeds, reference_speeds, "_over_reference", same=index == reference)
            )
        if spec is not None and tree is not None:
            row.update(tree_columns(first, al, step, row["speedup"]))
        elif spec is not None:
            alpha = first.accepted / first.scanned if first.scanned else 0.0
            costs = step_costs(first.timing, first.drafted, k, al, step)
            predicted = expected_tokens(alpha, k) / (k * costs.draft_cost + 1.0)
            total = max(first.timing.get("total", first.seconds), 1e-12)
            verify = max(first.timing.get("verify", 0.0), 1e-12)
            speedup = row["speedup"]
            row.update(
                alpha=alpha,
                cost_ratio=costs.draft_cost,
                verify_cost=costs.verify_cost,
                predicted_speedup=predicted,
                measured_over_predicted=None if speedup is None else speedup / predicted,
                sampler_share=first.timing.get("sampler", 0.0) / total,
                meter_over_verify=first.timing.get("meter", 0.0) / verify,
            )
        rows.append(row)
    table = {
        "settings": {
            **dataclasses.asdict(settings),
            "sampling": dataclasses.asdict(settings.sampling),
        },
        "verifier": setup.pair.verifier,
        "draft": setup.pair.draft,
        "pair": setup.pair.name,
        "reference_batch_size": settings.sizes[0],
        "baseline_tokens_per_second": statistics.median(reference_speeds),
        "baseline_tokens": cells[reference, 0].tokens,
        "rows": rows,
    }
    if rounds < MIN_ROUNDS:
        table["speedup_note"] = (
            f"no speed-up given: {rounds} interleaved round{'s' * (rounds != 1)}, and a 95% "
            f"interval for the median speed-up needs at least {MIN_ROUNDS} (--repeats "
            f"{MIN_ROUNDS})"
        )
    return table


def _round_entry(
    cell: Cell, spec: str | None, k: int | None, tree: str | None, step: float
) -> dict:
    """One round of a row: its tokens/s, the baseline's seconds per step T that round and,
    for a rule, that round's costs c, v and o in steps (``decode.runs.step_costs``; a tree
    row's c is per draft forward, ``decode.tree_stats.tree_costs``)."""
    from cactus_theory.decode.runs import step_costs
    from cactus_theory.decode.tree_stats import tree_costs

    total = cell.timing.get("total") or 0.0
    entry = {
        "tokens_per_second": cell.tokens_per_second,
        "step_seconds": step,
        "prefill_share": cell.timing.get("prefill", 0.0) / total if total else None,
    }
    if spec is not None:
        al = cell.accepted / cell.steps if cell.steps else 0.0
        if tree is not None:
            costs = tree_costs(cell.timing, al, step)
        else:
            costs = dataclasses.asdict(step_costs(cell.timing, cell.drafted, k, al, step))
        entry.update({name: costs[name] for name in ("draft_cost", "verify_cost", "other_cost")})
        entry["acceptance_length"] = al
    return entry


def _speedup(speeds: list[float], base_speeds: list[float], suffix: str, same: bool) -> dict:
    """``speedup{suffix}`` (the median of the paired per-round ratios) with ``_low``,
    ``_high`` and ``_coverage`` (its order-statistic interval); None and no interval
    with fewer than ``MIN_ROUNDS`` rounds; 1 and no interval for the baseline itself
    (``same``: a ratio to itself is 1 by definition, not a measurement)."""
    if len(speeds) < MIN_ROUNDS:
        return {f"speedup{suffix}": None}
    if same:
        return {f"speedup{suffix}": 1.0}
    ratios = [speed / base for speed, base in zip(speeds, base_speeds, strict=True)]
    median, low, high, coverage = median_interval(ratios)
    return {
        f"speedup{suffix}": median,
        f"speedup{suffix}_low": low,
        f"speedup{suffix}_high": high,
        f"speedup{suffix}_coverage": coverage,
    }


def meter_exact(rule, tree: str | None, scheme: str) -> bool:
    """Whether the meter's KL is exact for a row (always for chains; for trees see
    ``sampler.tree_meter``): a row where it is not has no KL (None, "-"), never a guess."""
    if tree is None:
        return True
    from cactus_theory.core import trees
    from cactus_theory.sampler.tree_meter import metered_exactly

    return metered_exactly(rule if isinstance(rule, trees.TreeRule) else trees.lift(rule), scheme)


def split_tree(tree: str, children: str) -> tuple[str, str]:
    """(shape, scheme) of a table's tree ``SPEC`` or ``SPEC@SCHEME`` (``children`` when no
    scheme is given)."""
    shape, _, scheme = tree.partition("@")
    return shape, scheme or children


def rule_of(spec: str, tree: str | None):
    """The rule a row decodes with: a chain rule, or with a tree a tree rule or a chain
    rule (the decoder lifts it); a tree rule's name without a tree is a ValueError."""
    from cactus_theory.core import trees

    if spec.partition(":")[0].strip() in trees.names():
        if tree is None:
            raise ValueError(f"rule: {spec!r} is a tree rule; it needs a tree (--tree)")
        return trees.parse(spec)
    return rules.parse(spec)


def tree_columns(cell: Cell, acceptance_length: float, step: float, speedup) -> dict:
    """A tree row's extra columns: nodes verified per step, α by depth and rank
    (``decode.tree_stats``), the costs in autoregressive steps (c per draft forward, v per
    verify call, L draft forwards per step) and the predicted (AL + 1)/(L c + v)."""
    from cactus_theory.decode.tree_stats import by_rank, ratios, tree_costs

    costs = tree_costs(cell.timing, acceptance_length, step)
    total = max(cell.timing.get("total", cell.seconds), 1e-12)
    verify = max(cell.timing.get("verify", 0.0), 1e-12)
    return {
        "alpha": cell.accepted / max(sum(cell.reached), 1),
        "nodes_per_step": cell.nodes / max(cell.steps, 1),
        "alpha_by_rank": by_rank(cell.tree_ended, cell.tree_reached),
        "alpha_by_depth_rank": ratios(cell.tree_ended, cell.tree_reached),
        "cost_ratio": costs["draft_cost"],
        "verify_cost": costs["verify_cost"],
        "draft_forwards": costs["draft_forwards"],
        "predicted_speedup": costs["predicted_speedup"],
        "measured_over_predicted": (
            None if speedup is None else speedup / costs["predicted_speedup"]
        ),
        "sampler_share": cell.timing.get("sampler", 0.0) / total,
        "meter_over_verify": cell.timing.get("meter", 0.0) / verify,
    }
