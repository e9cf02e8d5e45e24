"""The paper's decoding table on a real pair: every rule against autoregressive decoding.

``run(setup, settings, cache)`` decodes the same prompts with the same sampling settings
and seed for the autoregressive baseline and every (rule, k) config, in ``repeats``
interleaved rounds (config 1..n, then again), so a slow spell on a shared machine hits
every config alike. Each (config, round) is a cell cached as JSON under ``cache`` (keyed by
the settings, the prompts, the pair and the code), so an interrupted run resumes. A row
keeps its first round's decoding statistics (every round reseeds, so the tokens are the
same on CPU) and its median round's tokens/s.

**Speed-up and its interval.** Round r gives the paired ratio s_r = tokens/s(config, r) /
tokens/s(baseline, r) (the baseline ran minutes before, in the same round). The speed-up
is the median of s_1..s_R and its interval the distribution-free order-statistic interval
for a median: [s_(j), s_(R+1−j)] with the largest j such that P(Binomial(R, ½) < j) ≤
0.025, which covers the median with probability ≥ 95% (R ≥ 6); for R < 6 it is the range
[min, max], whose coverage 1 − 2^(1−R) the row states.

Per row, with the baseline's median time per generated token T and tokens per verifier
call E[tok] = AL + 1:

- AL (accepted drafts per verify step, bonus excluded), tokens per call, tokens/s and the
  speed-up over the baseline with its interval (above);
- KL per token and per sequence from the divergence meter (exact KL(emitted law ‖ q) per
  token, summed), and the verifier NLL of the generated text (nats/token, T = 1);
- α̂ = accepted drafts / drafted positions reached (the per-position acceptance) and
  c = (draft time per draft token) / T, the cost ratio of Leviathan et al.;
- Leviathan's predicted speed-up (1 − α̂^{k+1}) / ((1 − α̂)(k c + 1)) and measured/predicted;
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

    def __post_init__(self) -> None:
        for spec in self.rules:
            rules.parse(spec)  # a bad spec is a ValueError now, not after an hour
        for name in ("num_prompts", "max_new_tokens", "batch_size", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if not self.ks or any(k < 1 for k in self.ks):
            raise ValueError(f"k: every draft length must be >= 1, got {self.ks}")

    def configs(self) -> list[tuple[str | None, int | None]]:
        """(rule spec, k) per row, the baseline (None, None) first."""
        return [(None, None)] + [(spec, k) for k in self.ks for spec in self.rules]


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
    nll: float
    timing: dict = field(default_factory=dict)

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
            timing=dict(totals.timing),
        )

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(self.seconds, 1e-12)


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
) -> dict:
    """The table (module docstring) as a JSON-able dict ``{"settings", "rows", ...}``."""
    from cactus_theory.decode.runs import RunSettings, run_prompts, warm_up

    run_settings = RunSettings(
        max_new_tokens=settings.max_new_tokens,
        sampling=settings.sampling,
        batch_size=settings.batch_size,
        seed=settings.seed,
    )
    configs = settings.configs()
    folder = None
    if cache is not None:
        folder = Path(cache) / f"table-{cache_key(settings, setup, device, dtype, threads)}"
    cells: dict[tuple[int, int], Cell] = {}
    warmed = False
    for round_index in range(settings.repeats):
        for index, (spec, k) in enumerate(configs):
            path = None if folder is None else folder / f"row{index}-round{round_index}.json"
            loaded = _load(path)
            if loaded is None:
                if not warmed:
                    warm_up(setup, run_settings, rules.parse(settings.rules[0]), settings.ks[0])
                    warmed = True
                rule = None if spec is None else rules.parse(spec)
                totals = run_prompts(
                    setup, run_settings, rule, k, baseline=spec is None, progress=progress
                )
                loaded = Cell.of(totals)
                if path is not None:
                    atomic_write_json(path, dataclasses.asdict(loaded))
            cells[index, round_index] = loaded
    return summarise(settings, configs, cells, setup)


def _load(path: Path | None) -> Cell | None:
    """A cached cell, or None when missing or damaged (then it is recomputed)."""
    if path is None or not path.exists():
        return None
    try:
        return Cell(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


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
    """Rows from the cells: first round's statistics, median round's tokens/s, paired
    per-round speed-ups with their interval."""
    import statistics

    rounds = settings.repeats
    baseline = cells[0, 0]
    baseline_speeds = [cells[0, r].tokens_per_second for r in range(rounds)]
    baseline_speed = statistics.median(baseline_speeds)
    token_seconds = 1.0 / baseline_speed  # T: the baseline's time per generated token
    rows = []
    for index, (spec, k) in enumerate(configs):
        first = cells[index, 0]
        speeds = [cells[index, r].tokens_per_second for r in range(rounds)]
        speed = statistics.median(speeds)
        ratios = [speeds[r] / baseline_speeds[r] for r in range(rounds)]
        speedup, low, high, coverage = median_interval(ratios)
        agree = all(cells[index, r].accepted == first.accepted for r in range(rounds))
        row = {
            "rule": "autoregressive" if spec is None else spec,
            "label": "autoregressive" if spec is None else rules.parse(spec).label,
            "k": k or 0,
            "acceptance_length": first.accepted / first.steps if first.steps else 0.0,
            "tokens_per_call": first.tokens / max(first.verifier_calls, 1),
            "tokens_per_second": speed,
            "speedup": speedup,
            "speedup_low": low,
            "speedup_high": high,
            "speedup_coverage": coverage,
            "kl_per_token": None if first.kl_sum is None else first.kl_sum / first.tokens,
            "kl_per_sequence": None if first.kl_sum is None else first.kl_sum / first.sequences,
            "verifier_nll": first.nll,
            "tokens": first.tokens,
            "rounds_agree": agree,
        }
        if spec is not None:
            alpha = first.accepted / first.scanned if first.scanned else 0.0
            draft_seconds = first.timing.get("draft", 0.0) / max(first.drafted, 1)
            cost_ratio = draft_seconds / token_seconds
            predicted = expected_tokens(alpha, k) / (k * cost_ratio + 1.0)
            total = max(first.timing.get("total", first.seconds), 1e-12)
            verify = max(first.timing.get("verify", 0.0), 1e-12)
            row.update(
                alpha=alpha,
                cost_ratio=cost_ratio,
                predicted_speedup=predicted,
                measured_over_predicted=speedup / predicted,
                sampler_share=first.timing.get("sampler", 0.0) / total,
                meter_over_verify=first.timing.get("meter", 0.0) / verify,
            )
        rows.append(row)
    return {
        "settings": {
            **dataclasses.asdict(settings),
            "sampling": dataclasses.asdict(settings.sampling),
        },
        "verifier": setup.pair.verifier,
        "draft": setup.pair.draft,
        "pair": setup.pair.name,
        "baseline_tokens_per_second": baseline_speed,
        "baseline_tokens": baseline.tokens,
        "rows": rows,
    }
