"""Reading the sweep's outputs (CSV and JSON under the report folder) back for plotting.

paper_figs never computes results; it reads what ``sims.sweep`` and ``proofs_check`` wrote.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

NUMERIC_TEXT = {"source", "group", "rule", "name", "label", "param_name", "source_settings"}


def _value(key: str, text: str) -> object:
    if key in NUMERIC_TEXT:
        return text
    if text == "":
        return None
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if key in {"k", "length", "position", "seed"} else number


def read_csv(path: Path) -> list[dict]:
    """Rows of a CSV with numbers parsed (``inf`` and ``nan`` included)."""
    with open(path, newline="") as handle:
        return [
            {key: _value(key, text) for key, text in row.items()} for row in csv.DictReader(handle)
        ]


@dataclass(frozen=True)
class Results:
    """Everything the figures and the report read."""

    tradeoff: list[dict]
    decoding: list[dict]
    positions: list[dict]
    sequence_kl: list[dict]
    speedup: list[dict]
    engines: list[dict]
    gamma: list[dict]
    drafted: list[dict]
    example: dict | None
    calibration: dict | None
    main_source: str
    #: cactus_theory.real.real_model's tables (or why they are unavailable)
    real_model: dict | None = None
    #: the conformance section's results (``conformance.json``), if it ran
    conformance: dict | None = None

    @classmethod
    def load(cls, folder: Path, main_source: str = "text") -> Results:
        folder = Path(folder)

        def table(name: str) -> list[dict]:
            path = folder / f"{name}.csv"
            return read_csv(path) if path.exists() else []

        def document(name: str) -> dict | None:
            path = folder / f"{name}.json"
            return json.loads(path.read_text()) if path.exists() else None

        return cls(
            tradeoff=table("tradeoff"),
            decoding=table("decoding"),
            positions=table("positions"),
            sequence_kl=table("sequence_kl"),
            speedup=table("speedup"),
            engines=table("engines"),
            gamma=table("gamma"),
            drafted=table("drafted"),
            example=document("example"),
            calibration=document("calibration"),
            main_source=main_source,
            real_model=document("real_model"),
            conformance=document("conformance"),
        )

    def sources(self) -> list[str]:
        """Sources in the order they appear, the main (real-text) source first."""
        seen = list(dict.fromkeys(row["source"] for row in self.tradeoff))
        return sorted(seen, key=lambda name: (name != self.main_source, seen.index(name)))
