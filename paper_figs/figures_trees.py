"""Figures of multi-draft (tree) verification, drawn from results only:

- ``figure_tree_tradeoff``: the tree trade-off on a real pool (``real.tree_tradeoff``'s
  JSON): one panel per drafting scheme, acceptance of the first node against KL per token
  (log-x), a colour per K, a marker per rule family, the tree frontier per K as the
  envelope; lossless rules (KL 0) are drawn on the left edge;
- ``figure_khisti``: Khisti et al.'s Figure 2 setting (proofs_check's curve
  ``khisti_figure2``): acceptance of two drafts against x for both readings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from paper_figs.figure_kit import Figure, legend_below, plt, save

#: The left edge where KL = 0 is drawn on a log axis.
KL_FLOOR = 1e-4
WIDTH_COLORS = {1: "#444444", 2: "#1f77b4", 3: "#9467bd", 4: "#d62728", 8: "#2ca02c"}
FAMILY_MARKERS = {
    "walk": "s",
    "rrs": "s",
    "k-seq": "D",
    "optimal": "*",
    "spechub": "P",
    "cactus-tree": "o",
    "cactus-rrs": "o",
    "sglang-tree": "^",
    "medusa-typical": "v",
    "lift": "x",
}
CAPTION = (
    "One node of K children at every position of the pool: the exact acceptance of the node "
    "against the KL of what it emits, per drafting scheme; each colour is a K, the line is "
    "the tree frontier for that K (the most any scheme accepts at that KL per token), and a "
    "point at the left edge is lossless (KL 0)."
)


def _family(spec: str) -> str:
    return spec.split(":", 1)[0]


def draw_scheme(axis, configs: list[Mapping]) -> dict:
    """One scheme's panel; returns the drawn series {K: {"rules": ..., "frontier": ...}}."""
    series = {}
    for config in sorted(configs, key=lambda c: c["width"]):
        color = WIDTH_COLORS.get(config["width"], None)
        curve = [p for p in config["frontier"] if math.isfinite(p["kl"]) and p["kl"] > 0]
        if curve:
            axis.plot(
                [max(p["kl"], KL_FLOOR) for p in curve],
                [p["acceptance"] for p in curve],
                color=color,
                lw=1.2,
                alpha=0.8,
                label=f"frontier, K = {config['width']}",
            )
        drawn = []
        for row in config["rows"]:
            if row["acceptance"] is None or row["kl_per_token"] is None:
                continue
            kl = max(row["kl_per_token"], KL_FLOOR)
            marker = FAMILY_MARKERS.get(_family(row["rule"]), "o")
            axis.scatter(
                kl, row["acceptance"], color=color, marker=marker, s=22,
                label=_family(row["rule"]), zorder=3,
            )  # fmt: skip
            drawn.append(
                {"rule": row["rule"], "kl": row["kl_per_token"], "acceptance": row["acceptance"]}
            )
        series[config["width"]] = {"rules": drawn, "frontier": curve}
    axis.set_xscale("log")
    axis.set_xlabel("KL per token (nats); left edge: lossless")
    axis.set_ylabel("acceptance of the node")
    axis.grid(True, which="both", alpha=0.25)
    return series


def figure_tree_tradeoff(data: Mapping, folder: Path, name: str = "tree_tradeoff") -> Path:
    """The tree trade-off (``real.tree_tradeoff.to_json``) as ``name``.png/.svg; returns
    the png's path."""
    return tree_tradeoff_figure(data, folder, name).png


def tree_tradeoff_figure(data: Mapping, folder: Path, name: str = "tree_tradeoff") -> Figure:
    """``figure_tree_tradeoff`` as a ``Figure`` record (files, caption, series)."""
    schemes: dict[str, list[Mapping]] = {}
    for config in data["configurations"]:
        schemes.setdefault(config["scheme"], []).append(config)
    if not schemes:
        raise ValueError("data: no tree configuration to draw")
    fig, axes = plt.subplots(1, len(schemes), figsize=(5.4 * len(schemes), 4.4), squeeze=False)
    series = {}
    for axis, (scheme, configs) in zip(axes.flat, schemes.items(), strict=True):
        series[scheme] = draw_scheme(axis, configs)
        axis.set_title(f"{scheme} children", fontsize=10)
    legend_below(fig, axes, 6)
    where = data.get("dataset", "a real pool")
    fig.suptitle(f"Tree verification on {where}: acceptance against emitted KL", y=1.0)
    fig.tight_layout(rect=(0, 0.14, 1, 0.97))
    png, svg = save(fig, folder, name)
    return Figure(name, "Tree rules on a real pair", CAPTION, png, svg, series)


def figure_khisti(curves: Mapping, folder: Path, name: str = "khisti_figure2") -> Figure:
    """Two panels, one per reading of Khisti et al.'s Figure 2 (``khisti_figure2``)."""
    readings = [key for key in curves if key != "x"]
    fig, axes = plt.subplots(1, len(readings), figsize=(5.2 * len(readings), 4.0), squeeze=False)
    xs = np.asarray(curves["x"])
    labels = {
        "optimal": "optimal α*",
        "k-seq": "SpecTr K-SEQ",
        "rrs": "SpecInfer (RRS)",
        "rrs-wor": "RRS without replacement",
        "k=1": "one draft (1 − TV)",
    }
    for axis, reading in zip(axes.flat, readings, strict=True):
        for key, label in labels.items():
            axis.plot(xs, np.asarray(curves[reading][key], dtype=float), label=label)
        axis.set_title(f"{reading}; the other law (x, (1−x)/2, (1−x)/2)", fontsize=9)
        axis.set_xlabel("x")
        axis.set_ylabel("acceptance, K = 2")
        axis.grid(True, alpha=0.25)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    png, svg = save(fig, folder, name)
    caption = (
        "V = 3, two i.i.d. drafts; one law is uniform, the other moves along "
        "(x, (1 − x)/2, (1 − x)/2). Left: the uniform law is the draft; right: the target."
    )
    return Figure(name, "Khisti et al.'s Figure 2 setting", caption, png, svg, dict(curves))
