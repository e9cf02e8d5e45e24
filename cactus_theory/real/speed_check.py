"""The predicted speed-up against a measured one, side by side, on a quiet machine.

A pool's exact acceptance α (``real.tradeoff``) predicts a speed-up through Leviathan et
al.'s model: AL_k = α + α² + ... + α^k accepted drafts per verify call, and

    predicted = (AL_k + 1) / (k c + v_k),

with c the draft cost and v_k the verify call's cost, both in autoregressive steps. Both
costs depend on the machine, the dtype and the threads, so they are measured here, with
the decoder itself, in the same runs that measure the speed-up they predict:

``run(setup, documents, settings)`` decodes a few prompts of one set with plain
autoregressive decoding and with each rule of ``settings.rules`` at k (default SpS and
Cactus δ = 1 at k = 3), in ``settings.rounds`` interleaved rounds (``real.decode_table``
with ``reseed``: round r uses seed + r for every config, so each rule's AL, α and KL pool
every round's tokens). Per round r it reads T_r (the baseline's seconds per step), and per
rule c_r, v_r and o_r (the rest of a step: sampler, meter, bookkeeping;
``decode.runs.StepCosts``). Then, per rule:

- **measured**: the median of the paired per-round speed-ups s_r = tokens/s (rule, r) /
  tokens/s (autoregressive, r), with its order-statistic 95% interval (6 rounds or more);
- **predicted (pool)**: (AL_k(α_pool) + 1)/(k c + v_k), per round, median and interval
  over rounds (the costs' noise; the pool's α is exact for the pool);
- **predicted (measured AL)**: the same with the decoder's own AL: what is left of the
  difference is not acceptance;
- **accounted**: (AL + 1)/(k c + v + o), the step's full cost: what is left of the
  difference after that is the prefill and the time between steps.

``explain`` turns these into one sentence per rule: they agree within the intervals, or
which of the three gaps (acceptance at deeper draft positions, the rest of a step, the
prefill) accounts for the difference, with the run's own numbers.

Timings need a quiet machine: the report runs this stage last, once its other processes
have finished (``util.stages.CoreShare.wait_quiet``), on one thread, in the dtype the
decoder would choose there (``real.precision``).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path

from cactus_theory.core import block
from cactus_theory.core.processors import PAPER_SETTING, SamplingSettings
from cactus_theory.real.decode_table import MIN_ROUNDS, TableSettings, median_interval

#: The rules whose predicted and measured speed-ups are compared by default.
SPEED_RULES = ("sps", "cactus:delta=1.0")


@dataclass(frozen=True)
class SpeedSettings:
    """What the check decodes: ``rules`` at ``k``, ``num_prompts`` prompts of
    ``max_new_tokens`` tokens, ``rounds`` interleaved rounds (>= 6 for an interval)."""

    rules: tuple[str, ...] = SPEED_RULES
    k: int = 3
    num_prompts: int = 3
    max_new_tokens: int = 48
    rounds: int = MIN_ROUNDS
    sampling: SamplingSettings = PAPER_SETTING
    seed: int = 0

    def table(self) -> TableSettings:
        """The decode table that runs it (``reseed``: every round a new sample; no
        verifier NLL, which nothing here reads and which would cost a verifier forward
        over every batch)."""
        return TableSettings(
            rules=self.rules,
            ks=(self.k,),
            num_prompts=self.num_prompts,
            max_new_tokens=self.max_new_tokens,
            sampling=self.sampling,
            seed=self.seed,
            repeats=self.rounds,
            reseed=True,
            nll=False,
        )


def interval_of(values: list[float]) -> dict:
    """{"median", "low", "high", "coverage"} of per-round values: the median and its
    order-statistic 95% interval (``median_interval``); with fewer than ``MIN_ROUNDS``
    values, or ends that coincide, there is no such interval and low, high and coverage are
    None (never a degenerate interval)."""
    median, low, high, coverage = median_interval(values)
    if len(values) < MIN_ROUNDS or not low < high:
        return {"median": median, "low": None, "high": None, "coverage": None}
    return {"median": median, "low": low, "high": high, "coverage": coverage}


def run(
    setup,
    pool_alphas: dict[str, float],
    settings: SpeedSettings,
    cache: Path | None,
    *,
    device: str,
    dtype: str,
    threads: int,
    on_cell=None,
) -> dict:
    """The check (module docstring) as JSON-able data: the costs with their intervals and
    one row per rule (and the baseline), each with ``why``. ``pool_alphas`` maps each rule
    spec to its pool's exact acceptance (a rule without one gets no pool prediction).
    ``on_cell(done, total)`` is called after each decoded (config, round)."""
    from cactus_theory.real import decode_table

    table = decode_table.run(
        setup,
        settings.table(),
        cache,
        device=device,
        dtype=dtype,
        threads=threads,
        progress=False,
        on_cell=on_cell,
    )
    return summarise(table, pool_alphas, settings)


def summarise(table: dict, pool_alphas: dict[str, float], settings: SpeedSettings) -> dict:
    """The check from a decode table with per-round rows (``decode_table.summarise``)."""
    from cactus_theory.real.decode_table import al_half_width, expected_tokens
    from cactus_theory.real.tradeoff import find_row

    k = settings.k
    baseline = next(row for row in table["rows"] if row["rule"] == "autoregressive")
    rows = [_baseline_row(baseline)]
    costs = None
    for row in table["rows"]:
        if row["rule"] == "autoregressive":
            continue
        rounds = row["per_round"]
        draft = [entry["draft_cost"] for entry in rounds]
        verify = [entry["verify_cost"] for entry in rounds]
        other = [entry["other_cost"] for entry in rounds]
        if costs is None:  # the first rule's costs stand for the pair's (SpS by default)
            costs = {
                "rule": row["rule"],
                "step_seconds": interval_of([entry["step_seconds"] for entry in rounds]),
                "draft_cost": interval_of(draft),
                "verify_cost": interval_of(verify),
                "other_cost": interval_of(other),
            }
        al = row["acceptance_length"]
        spent = [k * c + v for c, v in zip(draft, verify, strict=True)]
        alpha = _pool_alpha(pool_alphas, row["rule"], find_row)
        entry = {
            "rule": row["rule"],
            "label": row["label"],
            "k": k,
            "acceptance_length": al,
            "al_half_width": al_half_width(row),
            "alpha_by_position": row["alpha_by_position"],
            "kl_per_token": row["kl_per_token"],
            "tokens": row["tokens"],
            "steps": row["steps"],
            "tokens_per_second": row["tokens_per_second"],
            "speedup": row.get("speedup"),
            "speedup_low": row.get("speedup_low"),
            "speedup_high": row.get("speedup_high"),
            "speedup_coverage": row.get("speedup_coverage"),
            "pool_alpha": alpha,
            "predicted_al": None if alpha is None else block.expected_accepted(alpha, k),
            "predicted": None
            if alpha is None
            else interval_of([expected_tokens(alpha, k) / cost for cost in spent]),
            "predicted_measured_al": interval_of([(al + 1.0) / cost for cost in spent]),
            "accounted": interval_of(
                [(al + 1.0) / (cost + rest) for cost, rest in zip(spent, other, strict=True)]
            ),
            "prefill_share": _median([entry["prefill_share"] for entry in rounds]),
        }
        entry["why"] = explain(entry)
        rows.append(entry)
    return {
        "settings": {
            **dataclasses.asdict(settings),
            "sampling": settings.sampling.label,
        },
        "baseline_tokens_per_second": baseline["tokens_per_second"],
        "costs": costs,
        "rows": rows,
        "rounds": settings.rounds,
    }


def _pool_alpha(pool_alphas: dict[str, float], spec: str, find_row) -> float | None:
    """The pool α of ``spec`` (specs compared after parsing), or None."""
    document = {"rows": [{"rule": rule, "acceptance": a} for rule, a in pool_alphas.items()]}
    found = find_row(document, spec)
    return None if found is None else float(found["acceptance"])


def _baseline_row(row: dict) -> dict:
    return {
        "rule": "autoregressive",
        "label": "autoregressive",
        "k": 0,
        "tokens": row["tokens"],
        "tokens_per_second": row["tokens_per_second"],
        "speedup": 1.0,
    }


def _median(values: list) -> float | None:
    """The median of the values that are not None (None when there are none)."""
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def _within(value: float | None, interval: dict | None) -> bool:
    return (
        value is not None and interval is not None and interval["low"] <= value <= interval["high"]
    )


def explain(row: dict) -> str:
    """One sentence: the predicted and measured speed-ups agree, or what separates them
    (module docstring), from the row's own numbers."""
    measured = row.get("speedup")
    if measured is None:
        return (
            f"no measured speed-up: fewer than {MIN_ROUNDS} interleaved rounds give no 95% interval"
        )
    low, high = row["speedup_low"], row["speedup_high"]
    predicted = row.get("predicted")
    measured_text = f"measured {measured:.2f}x [{low:.2f}, {high:.2f}]"
    if predicted is None:
        return f"{measured_text}; no pool α for this rule, so no prediction"
    value = predicted["median"]
    if low <= value <= high:
        return f"predicted {value:.2f}x lies within the {measured_text}: they agree"
    if _within(measured, predicted):
        return (
            f"{measured_text} lies within the prediction's interval "
            f"[{predicted['low']:.2f}, {predicted['high']:.2f}] (median {value:.2f}x, over the "
            "rounds' costs): they agree"
        )
    parts = [f"predicted {value:.2f}x from the pool, {measured_text}"]
    al, predicted_al = row["acceptance_length"], row["predicted_al"]
    alphas = ", ".join("-" if a is None else f"{a:.2f}" for a in row["alpha_by_position"])
    with_al = row["predicted_measured_al"]["median"]
    parts.append(
        f"acceptance: the pool's α {row['pool_alpha']:.2f} at every draft position predicts "
        f"AL {predicted_al:.2f}, the decoder accepted AL {al:.2f} (α by draft position "
        f"[{alphas}]: deeper drafts of this draft are weaker), which alone gives "
        f"{with_al:.2f}x"
    )
    accounted = row["accounted"]["median"]
    parts.append(f"the rest of a step (sampler, meter, bookkeeping) takes it to {accounted:.2f}x")
    if not (low <= accounted <= high):
        share = row.get("prefill_share")
        rest = "" if share is None else f" ({100 * share:.0f}% of the time in prefills)"
        parts.append(f"the prefill and the time between steps account for the rest{rest}")
    return "; ".join(parts)
