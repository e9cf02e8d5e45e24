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

from paper_figs.data import Results
from paper_figs.figure_kit import COLORS, Figure, finite, legend_below, plt, save

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


# -- figure 8: decoded against predicted ------------------------------------------------


def figure_real_model(results: Results, folder: Path) -> Figure:
    """Measured against predicted on the real pair at one k: each speed-check rule's AL
    measured by decoding (with its 95% bound) against the meter's KL per token, beside the
    AL its pool's exact α predicts at the pool's exact KL (``real.speed_check``)."""
    from cactus_theory.real.real_model import speed_result, tradeoff_documents
    from cactus_theory.real.tradeoff import find_row

    speed = speed_result(results.real_model)
    rows = [row for row in speed.get("rows", []) if row["rule"] != "autoregressive"]
    document = tradeoff_documents(results.real_model).get(speed.get("dataset"), {})
    k = rows[0]["k"] if rows else 0
    fig, axis = plt.subplots(figsize=(7.4, 4.6))
    series: dict = {}
    palette = plt.get_cmap("tab10")
    for index, row in enumerate(rows):
        colour = palette(index % 10)
        kl = row["kl_per_token"]
        shown = kl if finite(kl) and kl > 0 else 1e-6  # SpS: KL exactly 0, drawn at 1e-6
        half = row.get("al_half_width") or 0.0
        axis.errorbar(
            [shown], [row["acceptance_length"]], yerr=[[half], [half]], fmt="o",
            color=colour, markersize=6, capsize=3, zorder=3, label=f"{row['label']}: decoded",
        )  # fmt: skip
        series[f"{row['rule']} decoded"] = (kl, row["acceptance_length"])
        exact = find_row(document, row["rule"]) if document else None
        if exact is not None and row.get("predicted_al") is not None:
            pool_kl = exact["kl_per_token"]
            at = pool_kl if finite(pool_kl) and pool_kl > 0 else 1e-6
            axis.scatter(
                [at], [row["predicted_al"]], marker="o", facecolors="none", edgecolors=[colour],
                s=60, zorder=3, label=f"{row['label']}: pool α, predicted",
            )  # fmt: skip
            axis.plot([at, shown], [row["predicted_al"], row["acceptance_length"]],
                      color=colour, alpha=0.4, linestyle=":")  # fmt: skip
            series[f"{row['rule']} predicted"] = (pool_kl, row["predicted_al"])
    axis.set_xscale("log")
    axis.set_xlabel("KL(emitted ‖ verifier) per token (nats; SpS at 1e-6)")
    axis.set_ylabel(f"AL (accepted drafts per verify step, k = {k})")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    pair = (results.real_model or {}).get("pair", {}).get("name", "?")
    fig.suptitle(f"Real pair ({pair}): AL decoded against AL predicted, k = {k}", fontsize=10)
    fig.tight_layout()
    png, svg = save(fig, folder, "fig8_real_model")
    tokens = max((row.get("tokens", 0) for row in rows), default=0)
    caption = (
        "Read: how far the accepted length a pool predicts is from the one decoding "
        "reaches, for each rule of the speed check. Filled points: AL measured by decoding "
        "the first evaluation set's first prompts with SmolLM2-135M-Instruct and its "
        f"feature draft in the paper's sampling setting (about {tokens} generated tokens "
        "per rule over the speed check's rounds; bars: a 95% bound from each row's own "
        "counts) against the divergence meter's KL per generated token. Hollow points: the "
        "AL Σ_j α^j that the pool's exact first-position acceptance α predicts, at the "
        "pool's exact KL per token. The gap is the feature draft's weaker deeper positions "
        "(the real-model section's theory table measures them); SpS emits q, KL 0, drawn "
        "at 1e-6."
    )
    return Figure(
        "fig8_real_model", "Real model: AL decoded vs predicted", caption, png, svg, series
    )
