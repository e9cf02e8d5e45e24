"""Figure 1 of the report: acceptance against the emitted law's mean KL, every rule on
every source, with the gap to the Pareto frontier (drawn from the sweep's CSVs).
"""

from __future__ import annotations

import math
from pathlib import Path

from paper_figs.data import Results
from paper_figs.figure_kit import COLORS, NAMES, Figure, finite, plt, rows_where, save

# -- figure 1 -------------------------------------------------------------------------------


def figure_tradeoff(results: Results, folder: Path) -> Figure:
    """Acceptance against the emitted law's mean KL: the real-text source large, with its gap
    to the Pareto frontier beside it, then one panel per synthetic source."""
    sources = results.sources()
    main, others = sources[0], sources[1:]
    extra_rows = math.ceil(len(others) / 3)
    fig = plt.figure(figsize=(16, 5.2 * (1 + extra_rows)))
    grid = fig.add_gridspec(1 + extra_rows, 3)
    series: dict = {}
    axes = [fig.add_subplot(grid[0, :2])]
    series[main] = _tradeoff_panel(axes[0], rows_where(results.tradeoff, source=main), main)
    gap_axis = fig.add_subplot(grid[0, 2])
    series["gap"] = _gap_panel(gap_axis, rows_where(results.tradeoff, source=main), main)
    for index, source in enumerate(others):
        axis = fig.add_subplot(grid[1 + index // 3, index % 3])
        series[source] = _tradeoff_panel(axis, rows_where(results.tradeoff, source=source), source)
        axes.append(axis)
    legend: dict = {}
    for axis in axes:
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    fig.legend(
        list(legend.values()),
        list(legend.keys()),
        loc="lower center",
        ncol=4,
        fontsize=9,
        frameon=False,
    )
    fig.suptitle("Acceptance vs divergence of the emitted law from the verifier", y=1.0)
    fig.tight_layout(rect=(0, 0.06, 1, 0.98))
    png, svg = save(fig, folder, "fig1_tradeoff")
    caption = (
        "Read: the higher a rule sits for a given emitted KL, the more drafts it accepts per "
        "nat it moves the output away from the verifier; no rule can rise above the black "
        "curve. Each point is one rule with one parameter, evaluated exactly (no sampling) "
        "on every context of a source: y = mean acceptance of the drafted token; x = mean KL(μ‖q) "
        "between the law μ of the token the rule actually emits and the verifier's q (log "
        "scale). SpS emits q (KL = 0): the dotted level. The black curve is the Pareto "
        "frontier of the source: the best mean acceptance for a mean emitted KL, so no rule "
        "can lie above it. The panel beside the real-text source shows how far each rule sits "
        "below that curve, in percentage points of acceptance (a lower bound: the curve is "
        "interpolated between computed points). cactus's δ is a per-branch budget, so its "
        "emitted KL is far below δ (δ = 1 is starred). frontier(δ) is optimal context by "
        "context but spends the same δ in every context, so on averages it is not the "
        "source's frontier. The dashed grey level is the draft mass on tokens the verifier "
        "allows: no rule with finite KL accepts more. Markers at the right edge (KL = ∞) can "
        "emit tokens the truncated verifier gives probability 0 (interp, top-k, TAS at times)."
    )
    return Figure("fig1_tradeoff", "Acceptance vs emitted-law KL", caption, png, svg, series)


#: Rules drawn as points (one per setting): the decision rules and the engines' rules.
DECISION_MARKERS = (
    ("tas", "D"),
    ("topk", "s"),
    ("relaxed", "^"),
    ("relaxed-ratio", "v"),
    ("sglang", "P"),
)
#: Legend entries of the point rules.
POINT_LEGEND = {
    "tas": "TAS (ε=0.09)",
    "topk": "top-k accept (k as labelled)",
    "relaxed": "relaxed: TensorRT-LLM MTP (K, δ as labelled)",
    "relaxed-ratio": "relaxed-ratio: vLLM proposal (K, r as labelled)",
    "sglang": "sglang thresholds (t_s, t_a as labelled)",
}


def _point_label(name: str, row: dict) -> str:
    """A point rule's label: TAS, top-k with its k, an engine's rule with its parameters."""
    if name == "tas":
        return "TAS"
    if name == "topk":
        return f"top-k accept k={int(row['param'])}"
    return row["label"]


def _gap_panel(axis, rows: list[dict], source: str) -> dict:
    series: dict = {}
    for name in ("frontier", "cactus-exact", "cactus", "interp"):
        points = sorted(
            (r["emitted_kl"], 100.0 * r["pareto_gap"])
            for r in rows_where(rows, name=name)
            if finite(r.get("pareto_gap")) and r["emitted_kl"] > 0
        )
        if points:
            axis.plot(*zip(*points, strict=True), marker=".", color=COLORS[name], lw=1.5)
            series[name] = points
    axis.axhline(0.0, color=COLORS["pareto"], lw=2.6)
    top = max((y for points in series.values() for _, y in points), default=1.0)
    notes = []
    for name, marker in DECISION_MARKERS:
        for row in rows_where(rows, name=name):
            gap = row.get("pareto_gap")
            if not finite(gap):
                continue
            series.setdefault(name, []).append((row["emitted_kl"], 100 * gap))
            label = _point_label(name, row)
            if 100 * gap <= 1.5 * top:
                axis.scatter(
                    [row["emitted_kl"]],
                    [100 * gap],
                    marker=marker,
                    s=42,
                    color=COLORS[name],
                    edgecolor="black",
                    linewidth=0.5,
                )
            else:
                notes.append(f"{label}: {100 * gap:.1f} points below (KL {row['emitted_kl']:.2f})")
    if notes:
        axis.text(
            0.02,
            0.97,
            "off scale:\n" + "\n".join(notes),
            transform=axis.transAxes,
            va="top",
            fontsize=7.5,
        )
    axis.set_xscale("log")
    axis.set_xlabel("mean KL(emitted law ‖ q)  [nats, log scale]")
    axis.set_ylabel("acceptance below the Pareto frontier  [percentage points]")
    axis.set_title(f"{source}: acceptance left on the table", fontsize=10)
    axis.grid(alpha=0.3, which="both")
    return series


def _tradeoff_panel(axis, rows: list[dict], source: str) -> dict:
    """One source's panel: the reference lines, one curve per tunable rule, the decision
    rules as points; returns the plotted (KL, acceptance) series by rule."""
    series: dict = {}
    finite_kl = [
        r["emitted_kl"]
        for r in rows
        if r["name"] not in ("sps", "pareto") and finite(r["emitted_kl"]) and r["emitted_kl"] > 0
    ]
    low = min(finite_kl, default=1e-4)
    edge = max(finite_kl, default=1.0) * 2.5  # where infinite KL is drawn
    _reference_lines(axis, rows, series)
    for name in ("pareto", "frontier", "cactus-exact", "cactus", "interp"):
        points = sorted(
            ((r["param"], r["emitted_kl"], r["acceptance"]) for r in rows_where(rows, name=name)),
            key=lambda item: item[0],
        )
        if points:
            series[name] = [(kl, acc) for _, kl, acc in points]
            _rule_curve(axis, name, points, edge)
    for name, marker in DECISION_MARKERS:
        for row in rows_where(rows, name=name):
            _decision_point(axis, name, marker, row, edge)
            series.setdefault(name, []).append((row["emitted_kl"], row["acceptance"]))
    axis.set_xscale("log")
    axis.set_xlim(low / 1.5, edge * 1.8)
    axis.set_xlabel("mean KL(emitted law ‖ verifier q)  [nats, log scale]")
    axis.set_ylabel("mean acceptance of the drafted token")
    axis.set_title(_source_title(rows[0]) if rows else source, fontsize=10)
    axis.grid(alpha=0.3, which="both")
    return series


def _reference_lines(axis, rows: list[dict], series: dict) -> None:
    """The acceptance ceiling (draft mass where q > 0) and SpS (KL = 0) as lines."""
    ceiling = [r["draft_in_support"] for r in rows if finite(r.get("draft_in_support"))]
    if ceiling and ceiling[0] < 0.999:
        axis.axhline(
            ceiling[0],
            color="#999999",
            ls="--",
            lw=1.0,
            label="ceiling: draft mass on tokens q allows",
        )
    sps = rows_where(rows, name="sps")
    if sps:
        axis.axhline(
            sps[0]["acceptance"],
            color=COLORS["sps"],
            ls=":",
            lw=1.2,
            label="SpS (KL = 0): lossless",
        )
        series["sps"] = [(0.0, sps[0]["acceptance"])]


def _rule_curve(axis, name: str, points: list[tuple], edge: float) -> None:
    """A tunable rule's curve over its parameter (``points``: (param, KL, acceptance)),
    infinite KL drawn at ``edge``; cactus at δ = 1 starred."""
    shown = [(kl, acc) for _, kl, acc in points if finite(kl) and kl > 0]
    infinite = [acc for _, kl, acc in points if not finite(kl)]
    label = NAMES[name]
    style = {"color": COLORS[name], "lw": 2.6 if name == "pareto" else 1.6}
    if shown:
        axis.plot(
            *zip(*shown, strict=True),
            marker="." if name != "pareto" else None,
            label=label,
            **style,
        )
    elif infinite:
        axis.plot([], [], label=label, **style)
    if infinite:
        axis.scatter([edge] * len(infinite), infinite, color=COLORS[name], marker=">", s=18)
        axis.annotate(
            "KL = ∞",
            (edge, max(infinite)),
            textcoords="offset points",
            xytext=(-14, 6),
            fontsize=7.5,
            color=COLORS[name],
        )
    if name == "cactus":
        star = [(kl, acc) for value, kl, acc in points if value == 1.0 and finite(kl)]
        for kl, acc in star:
            axis.scatter(
                [kl],
                [acc],
                marker="*",
                s=140,
                color=COLORS[name],
                zorder=5,
                edgecolor="black",
                linewidth=0.5,
            )


def _decision_point(axis, name: str, marker: str, row: dict, edge: float) -> None:
    """A point rule (tas, topk, an engine's rule) as one labelled point; infinite KL drawn
    at ``edge``."""
    kl = row["emitted_kl"]
    x = kl if finite(kl) else edge
    axis.scatter(
        [x],
        [row["acceptance"]],
        marker=marker,
        s=42,
        color=COLORS[name],
        edgecolor="black",
        linewidth=0.5,
        zorder=4,
        label=POINT_LEGEND[name],
    )
    if not finite(kl):
        axis.annotate(
            "∞", (x, row["acceptance"]), textcoords="offset points", xytext=(6, -3), fontsize=9
        )
    elif name != "tas":
        label = _point_label(name, row)
        short = label.split("(", 1)[1].rstrip(")") if "(" in label else label
        axis.annotate(
            short,
            (x, row["acceptance"]),
            textcoords="offset points",
            xytext=(5, -9),
            fontsize=7,
        )


def _source_title(row: dict) -> str:
    """A readable description of a source from its settings column."""
    import json

    settings = json.loads(row.get("source_settings") or "{}")
    if "text" in settings:
        text = settings["text"]
        sampling = text["sampling"]
        processors = f"T={sampling['temperature']:g}"
        if sampling.get("top_k"):
            processors += f", top-k {sampling['top_k']}"
        if sampling.get("top_p", 1) < 1:
            processors += f", top-p {sampling['top_p']:g}"
        return (
            f"{row['source']}: stdlib held-out contexts, KN {text['verifier_order']}-gram "
            f"verifier / {text['draft_order']}-gram draft, {processors}"
        )
    if "synthetic" in settings:
        spec = settings["synthetic"]
        kinds = {
            "dirichlet": "q ~ Dir({value:g}), p a Dirichlet-noised copy",
            "zipf": "Zipf q, tempered+noised p with mean TV {value:g}",
            "peaked": "one-hot-ish q (top mass {value:g})",
        }
        return (
            f"{row['source']}: " + kinds[spec["kind"]].format(**spec) + f", V={spec['vocab_size']}"
        )
    return row["source"]
