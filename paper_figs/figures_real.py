"""The exact trade-off on a real pair: acceptance against the emitted law's KL per token,
one panel per dataset (``cactus tradeoff``'s figure and the report's real-model figure).

Each panel draws one JSON document of ``cactus_theory.real.tradeoff.to_json``: every rule
as a point (one curve per family over its parameter, e.g. cactus over δ), the pool-level
frontier as the envelope (the most any rule reaches at a mean KL per token), SpS (KL = 0)
as a dotted level, and rules with an infinite KL (they can emit a token the verifier
excludes) at the right edge, marked "∞".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from paper_figs.figure_kit import COLORS, Figure, legend_below, plt, save

#: Below this KL per token (nats) a rule is drawn as lossless (a level line): float
#: rounding of an exact 0 must not stretch the log axis to 1e-30.
KL_FLOOR = 1e-7

CAPTION = (
    "Read: the higher a rule sits for a given emitted KL, the more drafts it accepts per nat "
    "it moves the output away from the verifier. Every number is exact on the pool's real "
    "positions (no sampling): y = mean acceptance of the first drafted token; x = mean "
    "KL(μ‖q) per token between the law μ the rule emits and the verifier's q (log scale). "
    "The black curve is the pool-level frontier, the most any rule reaches at that mean KL, "
    "so no rule can lie above it. SpS emits q (KL = 0): a dotted level, as does any rule "
    "below 1e-7 nats. A point at the right edge marked ∞ emits tokens the verifier excludes "
    "(infinite KL)."
)


def _family_points(rows: list[dict]) -> dict[str, list[dict]]:
    families: dict[str, list[dict]] = {}
    for row in rows:
        families.setdefault(row["rule"].split(":")[0], []).append(row)
    return families


def _drawn_kl(row: Mapping) -> bool:
    """Whether the row is a point on the log-x axis (finite KL above ``KL_FLOOR``)."""
    return row["kl_per_token"] is not None and row["kl_per_token"] > KL_FLOOR


def draw_panel(axis, data: Mapping, title: str) -> dict:
    """One dataset's trade-off on ``axis``; returns the plotted series."""
    rows = list(data["rows"])
    finite_kls = [row["kl_per_token"] for row in rows if _drawn_kl(row)]
    frontier = [
        (point["kl"], point["acceptance"]) for point in data["frontier"] if point["kl"] > KL_FLOOR
    ]
    kls = finite_kls + [kl for kl, _ in frontier]
    low = min(kls, default=1e-4) / 2
    high = max(kls, default=1.0) * 2
    series: dict = {}
    if frontier:
        xs, ys = zip(*sorted(frontier), strict=True)
        axis.plot(xs, ys, color=COLORS["pareto"], linewidth=1.6, label="frontier (pool level)")
        series["frontier (pool level)"] = list(zip(xs, ys, strict=True))
    for family, points in _family_points(rows).items():
        color = COLORS.get(family, "#7f7f7f")
        for row in points:
            if row["kl_per_token"] is not None and not _drawn_kl(row):  # lossless: a level
                level = row["acceptance"]
                label = f"{family} (KL 0)"  # one legend entry over every panel
                axis.axhline(level, color=color, linestyle=":", linewidth=1.2, label=label)
                axis.annotate(
                    f"{family} {level:.3f}",
                    (0.01, level),
                    xycoords=("axes fraction", "data"),
                    textcoords="offset points",
                    xytext=(0, 2),
                    fontsize=7,
                    color=color,
                )
                series[row["label"]] = level
        drawn = sorted((row["kl_per_token"], row["acceptance"]) for row in points if _drawn_kl(row))
        infinite = [row for row in points if row["kl_per_token"] is None]
        if drawn:
            xs, ys = zip(*drawn, strict=True)
            style = "-o" if len(drawn) > 1 else "o"
            axis.plot(xs, ys, style, color=color, markersize=4, linewidth=1.1, label=family)
            series[family] = drawn
        for row in infinite:
            axis.plot([high], [row["acceptance"]], ">", color=color, markersize=7,
                      label=f"{row['label']} (KL ∞)")  # fmt: skip
            axis.annotate("∞", (high, row["acceptance"]), textcoords="offset points",
                          xytext=(-12, 4), fontsize=8, color=color)  # fmt: skip
            series.setdefault(f"{family} (KL inf)", []).append(row["acceptance"])
    axis.set_xscale("log")
    axis.set_xlim(low, high * 1.3)
    axis.set_xlabel("KL(μ‖q) per token (nats, log scale)")
    axis.set_ylabel("acceptance α")
    axis.set_title(f"{title}: {data['positions']:,} positions", fontsize=10)
    axis.grid(True, which="both", alpha=0.25)
    return series


def figure_real_tradeoff(
    documents: Mapping[str, Mapping], folder: Path, name: str = "real_tradeoff"
) -> Figure:
    """One panel per {dataset: ``to_json`` document}, written as ``name``.png/.svg."""
    if not documents:
        raise ValueError("documents: no trade-off to draw")
    count = len(documents)
    columns = min(count, 3)
    lines = math.ceil(count / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(5.6 * columns, 4.4 * lines), squeeze=False)
    series = {}
    for axis, (title, data) in zip(axes.flat, documents.items(), strict=False):
        series[title] = draw_panel(axis, data, title)
    for axis in list(axes.flat)[count:]:
        axis.set_visible(False)
    legend_below(fig, axes, 5)
    fig.suptitle("Exact acceptance against emitted KL on real contexts", y=1.0)
    fig.tight_layout(rect=(0, 0.1, 1, 0.97))
    png, svg = save(fig, folder, name)
    return Figure(name, "The exact trade-off on a real pair", CAPTION, png, svg, series)
