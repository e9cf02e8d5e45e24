"""What every figure of the report shares: the colours and names of the rules, the
``Figure`` record, saving, and small row filters. matplotlib draws off-screen (Agg).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {
    "sps": "#444444",
    "cactus": "#2ca02c",
    "cactus-exact": "#1f77b4",
    "frontier": "#d62728",
    "pareto": "#000000",
    "interp": "#9467bd",
    "tas": "#ff7f0e",
    "topk": "#8c564b",
    "relaxed": "#e377c2",
    "relaxed-ratio": "#bcbd22",
    "sglang": "#17becf",
}
NAMES = {
    "cactus": "cactus (paper closed form), over δ",
    "cactus-exact": "cactus-exact (exact KL root), over δ",
    "frontier": "frontier: per-context emitted KL ≤ δ",
    "pareto": "Pareto frontier of the source (constant cap ratio κ)",
    "interp": "interp α p + (1−α) q, over α",
}


@dataclass
class Figure:
    """One written figure: files, caption, and the data series it shows."""

    name: str
    title: str
    caption: str
    png: Path
    svg: Path
    series: dict = field(default_factory=dict)


def save(fig, folder: Path, name: str) -> tuple[Path, Path]:
    """Write ``fig`` as ``name``.png and .svg into ``folder`` and close it."""
    folder.mkdir(parents=True, exist_ok=True)
    png, svg = folder / f"{name}.png", folder / f"{name}.svg"
    fig.savefig(png, dpi=130, bbox_inches="tight")
    fig.savefig(svg, bbox_inches="tight")
    plt.close(fig)
    return png, svg


def legend_below(fig, axes, columns: int) -> None:
    """One legend under the panels: each label once, in the order the panels drew them."""
    legend: dict = {}
    for axis in axes.flat:
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend.keys()), loc="lower center",
               ncol=min(len(legend), columns), fontsize=8, frameon=False)  # fmt: skip


def rows_where(rows: list[dict], **match: object) -> list[dict]:
    """The rows whose columns equal ``match``."""
    return [row for row in rows if all(row.get(key) == value for key, value in match.items())]


def finite(value: object) -> bool:
    """Whether ``value`` is a finite number."""
    return isinstance(value, (int, float)) and math.isfinite(value)
