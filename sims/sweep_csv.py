"""The sweep's outputs: the tidy CSVs (and JSON) written from the finished cells
(``write_csvs``; ``sims.sweep`` computes the cells and its docstring lists the files).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from cactus_theory import rules
from cactus_theory.core import block
from cactus_theory.util.files import atomic_write_bytes

if TYPE_CHECKING:
    from sims.sweep import Cell, Sources, SweepConfig

#: The files ``write_csvs`` writes into the output folder (the last four when their figure
#: data was computed).
OUTPUT_FILES = (
    "tradeoff.csv",
    "decoding.csv",
    "positions.csv",
    "sequence_kl.csv",
    "speedup.csv",
    "engines.csv",
    "gamma.csv",
    "drafted.csv",
    "example.json",
    "calibration.json",
)


def _rule_fields(spec: str) -> dict:
    rule = rules.parse(spec)
    params = rule.params()
    name, value = next(iter(params.items())) if params else ("", "")
    return {
        "rule": spec,
        "name": rule.name,
        "label": rule.label,
        "param_name": name,
        "param": value,
    }


def _write(path: Path, rows: list[dict]) -> Path:
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({key: _format(value) for key, value in row.items()})
    atomic_write_bytes(path, buffer.getvalue().encode())
    return path


def _format(value: object) -> object:
    if isinstance(value, float):
        return repr(value)
    return value


DECODING_COLUMNS = (
    "al al_se al_predicted tokens_per_call steps emitted rejected_steps acceptance_mc "
    "acceptance_exact kl_per_context tv_per_context kl_per_token tv_per_token nll_per_token"
).split()


def write_csvs(
    config: SweepConfig, done: list[tuple[Cell, dict]], out: Path, sources: Sources
) -> dict[str, Path]:
    """The tidy CSVs (``sims.sweep``'s docstring lists them); rows follow the plan's order."""
    tradeoff_rows, decode_rows, position_rows, sequence_rows, engine_rows = [], [], [], [], []
    extras: dict[str, object] = {}
    sps = {
        (cell.source, cell.k): value
        for cell, value in done
        if cell.kind == "decode" and cell.rule == "sps" and cell.group == "grid"
    }
    for cell, value in done:
        settings = json.dumps(sources.describe(cell.source), sort_keys=True)
        if cell.kind == "tradeoff":
            tradeoff_rows.append(
                {
                    "source": cell.source,
                    **_rule_fields(cell.rule),
                    **value,
                    "seed": config.seed,
                    "source_settings": settings,
                }
            )
        elif cell.kind == "engines":
            engine_rows.append(_engine_row(cell, value))
        elif cell.kind == "decode":
            decode_rows.append(
                _decode_row(cell, value, sps.get((cell.source, cell.k)), config, sources, settings)
            )
            position_rows.extend(_position_rows(cell, value))
            sequence_rows.extend(_sequence_rows(cell, value))
        else:
            extras[cell.kind] = value
    _add_pareto_gap(tradeoff_rows)
    paths = {
        "tradeoff": _write(out / "tradeoff.csv", tradeoff_rows),
        "decoding": _write(out / "decoding.csv", decode_rows),
        "positions": _write(out / "positions.csv", position_rows),
        "sequence_kl": _write(out / "sequence_kl.csv", sequence_rows),
        "speedup": _write(out / "speedup.csv", _speedup_rows(config, decode_rows)),
        "engines": _write(out / "engines.csv", engine_rows),
    }
    if "gamma" in extras:
        paths["gamma"] = _write(out / "gamma.csv", extras["gamma"]["rows"])
    if "drafted" in extras:
        paths["drafted"] = _write(out / "drafted.csv", extras["drafted"]["rows"])
    for kind in ("example", "calibration"):
        if kind in extras:
            paths[kind] = out / f"{kind}.json"
            atomic_write_bytes(paths[kind], json.dumps(extras[kind], indent=1).encode())
    return paths


def _engine_row(cell: Cell, value: dict) -> dict:
    """engines.csv: an engine's rule (acceptance, KL, TV, worst row KL, SpS's acceptance
    on the same pool) and, per matched rule, its spec, KL and TV at the same acceptance
    (empty when the engine accepts less than SpS or the rule cannot reach it)."""
    engine = value["engine"]
    row = {
        "source": cell.source,
        **_rule_fields(cell.rule),
        "acceptance": engine["acceptance"],
        "emitted_kl": engine["emitted_kl"],
        "emitted_tv": engine["emitted_tv"],
        "emitted_kl_max": engine["emitted_kl_max"],
        "sps_acceptance": value["sps_acceptance"],
    }
    for name, matched in value["matched"].items():
        prefix = name.replace("-", "_")
        row[f"{prefix}_rule"] = matched.get("rule", "")
        row[f"{prefix}_kl"] = matched.get("emitted_kl", float("nan"))
        row[f"{prefix}_tv"] = matched.get("emitted_tv", float("nan"))
    return row


def _cell_columns(cell: Cell) -> dict:
    """The columns that name a decode cell in positions.csv and sequence_kl.csv."""
    return {"source": cell.source, "group": cell.group, "rule": cell.rule, "k": cell.k}


def _position_rows(cell: Cell, value: dict) -> list[dict]:
    """positions.csv: a decode cell's acceptance at each draft position (1-based)."""
    pairs = zip(value["position_reached"], value["position_accepted"], strict=True)
    return [
        {
            **_cell_columns(cell),
            "position": position,
            "reached": reached,
            "accepted": accepted,
            "acceptance": accepted / reached if reached else float("nan"),
        }
        for position, (reached, accepted) in enumerate(pairs, start=1)
    ]


def _sequence_rows(cell: Cell, value: dict) -> list[dict]:
    """sequence_kl.csv: a decode cell's cumulative KL after each generated length."""
    pairs = zip(value["sequence_kl"], value["sequence_kl_se"], strict=True)
    return [
        {
            **_cell_columns(cell),
            "length": length,
            "kl_cumulative": mean,
            "kl_cumulative_se": se,
        }
        for length, (mean, se) in enumerate(pairs, start=1)
    ]


def _add_pareto_gap(rows: list[dict]) -> None:
    """``pareto_gap``: the Pareto curve's acceptance at the row's KL minus the row's.

    The curve is the chord interpolation between computed pareto points (and SpS at KL 0),
    held flat beyond the last point; the true frontier is concave and non-decreasing, so it
    lies on or above this curve: the gap is a lower bound on how much acceptance the rule
    leaves on the table. NaN for an infinite KL.
    """
    for source in dict.fromkeys(row["source"] for row in rows):
        mine = [row for row in rows if row["source"] == source]
        curve = sorted(
            (row["emitted_kl"], row["acceptance"])
            for row in mine
            if row["name"] in ("pareto", "sps") and math.isfinite(row["emitted_kl"])
        )
        for row in mine:
            kl = row["emitted_kl"]
            inside = bool(curve) and math.isfinite(kl) and curve[0][0] <= kl
            row["pareto_gap"] = (
                float(np.interp(kl, *zip(*curve, strict=True))) - row["acceptance"]
                if inside
                else float("nan")
            )


def _decode_row(
    cell: Cell, value: dict, sps: dict | None, config: SweepConfig, sources: Sources, settings: str
) -> dict:
    rejections = 100.0 * value["rejected_steps"] / value["emitted"]
    if sps is not None and sps["rejected_steps"] > 0:
        sps_rejections = 100.0 * sps["rejected_steps"] / sps["emitted"]
        change = 100.0 * (rejections / sps_rejections - 1.0)
        nll_change = value["nll_per_token"] - sps["nll_per_token"]
    else:
        change = nll_change = float("nan")
    z = 1.959963984540054
    count, length = sources.decode_sizes(cell)
    return {
        "source": cell.source,
        "group": cell.group,
        **_rule_fields(cell.rule),
        "k": cell.k,
        "seed": config.seed,
        "num_sequences": count,
        "length": length,
        **{column: value[column] for column in DECODING_COLUMNS},
        "al_ci_low": value["al"] - z * value["al_se"],
        "al_ci_high": value["al"] + z * value["al_se"],
        "rejections_per_100_tokens": rejections,
        "rej_change_vs_sps_pct": change,
        "nll_vs_sps": nll_change,
        "source_settings": settings,
    }


def _speedup_rows(config: SweepConfig, decode_rows: list[dict]) -> list[dict]:
    """Leviathan et al.'s speed-up (1 − α^{k+1}) / ((1 − α)(k c + 1)) at each measured α."""
    out = []
    for row in decode_rows:
        if row["group"] != "grid" or row["k"] != config.matched_k:
            continue
        if row["source"] not in {s.name for s in config.text[:1]} and config.text:
            continue
        alpha = min(max(float(row["acceptance_mc"]), 0.0), 1.0)
        for cost in config.speedup_costs:
            for k in range(1, 33):
                out.append(
                    {
                        "source": row["source"],
                        "rule": row["rule"],
                        "label": row["label"],
                        "alpha": alpha,
                        "cost_ratio": cost,
                        "k": k,
                        "speedup": block.leviathan_speedup(alpha, k, cost),
                    }
                )
    return out
