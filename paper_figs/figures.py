"""The report's figures 2 to 8, drawn from the sweep's CSVs and the claims check's curves,
and the order of all of them (figure 1, the trade-off, is in ``figures_tradeoff``; what
every figure shares is in ``figure_kit``).

Each ``figure_*`` function reads ``Results`` (and, for figure 2, the claims result), writes
``<name>.png`` and ``<name>.svg`` into the figures folder and returns a ``Figure`` with its
caption and the numbers it plotted (``series``), so tests can assert what a reader sees.
Nothing here computes a result: every number comes from ``sims`` or ``proofs_check``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from paper_figs import figures_real
from paper_figs.data import Results
from paper_figs.figure_kit import COLORS, Figure, finite, plt, rows_where, save
from paper_figs.figures_tradeoff import figure_tradeoff

# -- figure 2 -------------------------------------------------------------------------------


def figure_overshoot(claims: dict, results: Results, folder: Path) -> Figure:
    """Γ(δ)/δ per rule and the closed form's per-branch overshoot (from proofs_check)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 4.6))
    series = {
        "gamma_over_delta": _emitted_overshoot_panel(left, claims["curves"]["gamma"], results),
        "branch_overshoot": _branch_overshoot_panel(right, claims["curves"]["branch_overshoot"]),
    }
    fig.tight_layout()
    png, svg = save(fig, folder, "fig2_overshoot")
    caption = _overshoot_caption(claims["curves"]["gamma"])
    return Figure("fig2_overshoot", "Overshoot Γ(δ)/δ", caption, png, svg, series)


def _emitted_overshoot_panel(left, gamma: dict, results: Results) -> dict:
    """Γ(δ)/δ of each rule's emitted law: proofs_check's sup (solid) and the report's
    real-text contexts (dashed); returns the solid curves by rule."""
    deltas = gamma["delta"]
    series: dict = {}
    for name, values in gamma["rules"].items():
        ratio = [(d, v / d) for d, v in zip(deltas, values, strict=True) if d > 0 and finite(v)]
        if ratio:
            left.plot(
                *zip(*ratio, strict=True),
                marker="o",
                ms=3,
                color=COLORS.get(name),
                label=f"{name}: sup over instances, V ≤ {max(gamma.get('vocab_sizes', [0]))} "
                "(proofs_check)",
            )
        series[name] = ratio
    for name in ("cactus", "cactus-exact", "frontier"):
        rows = sorted(
            (
                r
                for r in rows_where(results.tradeoff, source=results.main_source, name=name)
                if r["param"] and r["param"] > 0 and finite(r["emitted_kl_max"])
            ),
            key=lambda r: r["param"],
        )
        if rows:
            left.plot(
                [r["param"] for r in rows],
                [r["emitted_kl_max"] / r["param"] for r in rows],
                ls="--",
                lw=1.1,
                color=COLORS[name],
                label=f"{name}: max over {results.main_source} contexts (sims)",
            )
    left.axhline(1.0, color="black", lw=0.8, ls=":")
    left.annotate(
        "budget: KL = δ",
        (deltas[0] if deltas else 1e-3, 1.0),
        xytext=(2, 4),
        textcoords="offset points",
        fontsize=8,
    )
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("budget δ  [nats, log scale]")
    left.set_ylabel("Γ(δ)/δ = sup KL(emitted ‖ q) / δ  [log scale]")
    left.set_title("Emitted-law overshoot Γ(δ)/δ", fontsize=10)
    left.grid(alpha=0.3, which="both")
    left.legend(fontsize=7.5)
    return series


def _branch_overshoot_panel(right, branch: dict) -> dict:
    """The closed form's per-branch overshoot: measured sup over q_n and the analytic
    curve; returns the plotted values."""
    right.plot(
        branch["delta"],
        branch["measured"],
        "o",
        ms=4,
        color=COLORS["cactus"],
        label="measured sup over q_n (proofs_check)",
    )
    dense = branch.get("analytic_curve", {"delta": branch["delta"], "value": branch["analytic"]})
    right.plot(
        dense["delta"], dense["value"], "-", color="black", lw=1.2, label="analytic: log(1+2δ)/δ"
    )
    right.axhline(1.0, color="black", lw=0.8, ls=":")
    right.set_xscale("log")
    right.set_xlabel("budget δ  [nats, log scale]")
    right.set_ylabel("sup over q_n of KL(h^n ‖ q) / δ")
    right.set_title("Paper's closed form: per-branch overshoot", fontsize=10)
    right.grid(alpha=0.3, which="both")
    right.legend(fontsize=8)
    return {
        "delta": list(branch["delta"]),
        "measured": list(branch["measured"]),
        "analytic": list(branch["analytic"]),
    }


def _overshoot_caption(gamma: dict) -> str:
    """Figure 2's caption, with the unbounded family's largest member when there is one."""
    caption = (
        "Read: above the dotted line at 1 a rule's output (left) or a single branch (right) "
        "leaves its δ-ball. Left: how far the emitted law can move from q, as a multiple of "
        "the budget. Solid: "
        "the largest KL(emitted‖q) the claims check found over its instance families, divided "
        "by δ; dashed: the largest over the real-text contexts of this report. Above the "
        "dotted line at 1 the emitted law leaves the δ-ball even when every branch stays "
        "inside it (cactus-exact); frontier stays at or below 1 by construction. Right: the "
        "paper's closed form γ = q_n + √(2δ q_n(1−q_n)) is a second-order root, so a single "
        "branch can exceed its KL budget; the points are the measured worst ratio and the "
        "line is the analytic expression from the claims check."
    )
    family = gamma.get("unbounded_family")
    if family and family.get("members"):
        largest = max(family["members"], key=lambda member: member["V"])
        caption += (
            f" The solid curves are a supremum over small vocabularies only: Γ(δ) is not "
            f"bounded in V. The claims check builds instances whose emitted KL grows with V "
            f"while every branch stays within δ (at δ = {family['delta']:g}, V = "
            f"{largest['V']}: KL(emitted‖q) = {largest['kl_emitted']:.3g}, "
            f"{largest['ratio']:.3g}·δ)."
        )
    return caption


# -- figure 3 -------------------------------------------------------------------------------


def figure_al_vs_delta(results: Results, folder: Path) -> Figure:
    """AL against δ for each k on the real-text source, with SpS and TAS levels."""
    source = results.main_source
    rows = rows_where(results.decoding, source=source, group="grid")
    ks = sorted({r["k"] for r in rows})
    fig, axes = plt.subplots(1, len(ks), figsize=(4.6 * len(ks), 4.2), sharey=True, squeeze=False)
    series: dict = {}
    for axis, k in zip(axes[0], ks, strict=True):
        at_k = rows_where(rows, k=k)
        series[k] = {}
        for name in ("cactus", "cactus-exact", "frontier"):
            points = sorted((r for r in rows_where(at_k, name=name)), key=lambda r: r["param"])
            if not points:
                continue
            x = [r["param"] for r in points]
            y = [r["al"] for r in points]
            err = [1.959963984540054 * r["al_se"] for r in points]
            axis.errorbar(
                x, y, yerr=err, marker="o", ms=4, capsize=3, color=COLORS[name], label=name
            )
            series[k][name] = list(zip(x, y, strict=True))
        for name, style in (("sps", ":"), ("tas", "--")):
            for r in rows_where(at_k, name=name):
                axis.axhline(
                    r["al"],
                    color=COLORS[name],
                    ls=style,
                    lw=1.4,
                    label=f"{'SpS' if name == 'sps' else 'TAS'} (AL {r['al']:.2f})",
                )
                axis.axhspan(
                    r["al"] - 1.96 * r["al_se"],
                    r["al"] + 1.96 * r["al_se"],
                    color=COLORS[name],
                    alpha=0.08,
                )
                series[k][name] = r["al"]
        axis.set_xscale("log")
        budgets = sorted({r["param"] for r in at_k if r["name"] in ("cactus", "frontier")})
        axis.set_xticks(budgets, [f"{b:g}" for b in budgets])
        axis.minorticks_off()
        axis.set_xlabel("budget δ  [nats, log scale]")
        axis.set_title(f"k = {k} drafted tokens per step", fontsize=10)
        axis.grid(alpha=0.3, which="both")
        axis.legend(fontsize=7.5, loc="upper left")
    axes[0][0].set_ylabel("AL: accepted drafts per verify step (bonus excluded)")
    fig.suptitle(f"Accepted length vs budget, autoregressive decoding on {source}", y=1.02)
    fig.tight_layout()
    png, svg = save(fig, folder, "fig3_al_vs_delta")
    caption = (
        "Read: how much longer the accepted prefix gets as δ grows, against SpS (dotted) and "
        "TAS (dashed) at the same k. Monte Carlo AL (mean accepted drafts per verification "
        "step, bonus token excluded, as in the paper) against δ, with 95% confidence "
        "intervals, for k = 5, 10 and 20; shaded bands are the intervals of the levels. "
        "When per-position acceptance α is well below 1, AL saturates near α/(1−α) and "
        "hardly grows with k: the extra drafts of a larger k are mostly thrown away. "
        "Differences smaller than the intervals are noise (--quick decodes far fewer "
        "tokens per cell than the full run)."
    )
    return Figure("fig3_al_vs_delta", "AL vs δ", caption, png, svg, series)


# -- figure 4 -------------------------------------------------------------------------------


def figure_speedup(results: Results, folder: Path) -> Figure:
    """Leviathan et al.'s predicted speed-up against k, at each rule's measured acceptance."""
    rows = results.speedup
    costs = sorted({r["cost_ratio"] for r in rows})
    wanted = ["sps", "tas", "cactus:delta=1.0", "cactus-exact:delta=1.0", "frontier:delta=1.0"]
    rules = [rule for rule in wanted if rows_where(rows, rule=rule)]
    columns = 2 if len(costs) > 1 else 1
    lines = math.ceil(len(costs) / columns)
    fig, axes = plt.subplots(
        lines, columns, figsize=(6.2 * columns, 4.0 * lines), sharey=True, squeeze=False
    )
    series: dict = {}
    for axis, cost in zip(axes.ravel(), costs, strict=False):
        series[cost] = {}
        for rule in rules:
            points = sorted(rows_where(rows, rule=rule, cost_ratio=cost), key=lambda r: r["k"])
            name = rule.split(":")[0]
            ks = [r["k"] for r in points]
            speed = [r["speedup"] for r in points]
            best = max(range(len(speed)), key=speed.__getitem__)
            axis.plot(
                ks,
                speed,
                color=COLORS[name],
                label=f"{'TAS (ε=0.09)' if name == 'tas' else points[0]['label']}: "
                f"acceptance {points[0]['alpha']:.2f}",
            )
            axis.scatter([ks[best]], [speed[best]], color=COLORS[name], s=25, zorder=4)
            series[cost][rule] = list(zip(ks, speed, strict=True))
        axis.axhline(1.0, color="black", lw=0.8, ls=":")
        axis.set_title(f"draft/verifier cost c = {cost:g}", fontsize=10)
        axis.set_xlabel("k (drafted tokens per step)")
        axis.set_ylabel("predicted speed-up over autoregressive")
        axis.grid(alpha=0.3)
    for axis in axes.ravel()[len(costs) :]:
        axis.set_visible(False)
    axes[0][-1].legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    png, svg = save(fig, folder, "fig4_speedup")
    caption = (
        "Read: which k to deploy and what a higher acceptance is worth at your draft's cost. "
        "Predicted wall-time speed-up (1 − α^{k+1}) / ((1 − α)(k c + 1)) of Leviathan et al. "
        "against k, for several draft-to-verifier cost ratios c, at each rule's per-position "
        "acceptance α measured in the k = 10 real-text simulation. Dots mark the best k. "
        "The gain from a relaxed rule shrinks as c grows, and with a cheap draft the best k "
        "stays small when α is small. The formula assumes i.i.d. positions; real text is "
        "only close to it."
    )
    return Figure("fig4_speedup", "Predicted speed-up", caption, png, svg, series)


# -- figure 5 -------------------------------------------------------------------------------


def figure_gamma(results: Results, folder: Path) -> Figure:
    """γ*(q_n, δ): closed form vs exact root, and what frontier gives the drafted token."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    series = {
        "gamma": _gamma_panel(left, results),
        "drafted": _drafted_panel(fig, right, results),
    }
    fig.tight_layout()
    png, svg = save(fig, folder, "fig5_gamma")
    caption = (
        "Read: where the dashed curve lies above the solid one the paper's closed form "
        "overshoots its KL budget, where below it gives acceptance away. "
        "Left: how much mass a Cactus branch gives the drafted token. Dashed: the paper's closed "
        "form q_n + √(2δ q_n(1−q_n)); solid: the exact largest γ with binary KL ≤ δ. The closed "
        "form lies below the exact root for small q_n (it gives away acceptance there) and "
        "above it for larger q_n until both reach 1 (there it overshoots the budget; figure "
        "2). Right: frontier does not raise by q_n alone. Each dot is a token drafted in a "
        "real context: frontier gives it h_n = clip(p_n, c_lo q_n, c_hi q_n), so tokens the "
        "draft over-weights are capped and the rest keep p_n (accepted surely). Every dot lies "
        "under the cactus-exact curve: γ* is the most any h within KL δ of q can give n, and "
        "frontier spends its budget on all tokens at once."
    )
    return Figure("fig5_gamma", "γ*: closed form vs exact", caption, png, svg, series)


def _gamma_panel(left, results: Results) -> dict:
    """γ* by closed form (dashed) and exact root (solid) over q_n, one colour per δ;
    returns {δ: [(q_n, closed form, exact)]}."""
    deltas = sorted({r["delta"] for r in results.gamma})
    palette = plt.cm.viridis([i / max(1, len(deltas) - 1) * 0.85 for i in range(len(deltas))])
    series: dict = {}
    for color, delta in zip(palette, deltas, strict=True):
        rows = sorted(rows_where(results.gamma, delta=delta), key=lambda r: r["target_mass"])
        x = [r["target_mass"] for r in rows]
        left.plot(x, [r["exact"] for r in rows], color=color, lw=1.8, label=f"exact, δ={delta:g}")
        left.plot(
            x,
            [r["closed_form"] for r in rows],
            color=color,
            lw=1.2,
            ls="--",
            label=f"closed form, δ={delta:g}",
        )
        series[delta] = [(r["target_mass"], r["closed_form"], r["exact"]) for r in rows]
    left.plot([0, 1], [0, 1], color="black", lw=0.8, ls=":", label="SpS: γ = q_n")
    left.set_xlabel("verifier mass of the drafted token, q_n")
    left.set_ylabel("γ* = mass h gives the drafted token")
    left.set_title("Cactus per-branch raise: closed form (dashed) vs exact KL root", fontsize=10)
    left.grid(alpha=0.3)
    left.legend(fontsize=7, ncol=2)
    return series


def _drafted_panel(fig, right, results: Results) -> dict:
    """frontier's h_n of tokens drafted in real contexts against cactus-exact's γ*, at the
    δ nearest 1; returns that δ and the points ({} without drafted data)."""
    drafted = results.drafted
    if not drafted:
        return {}
    chosen = sorted({r["delta"] for r in drafted}, key=lambda d: abs(math.log(d)))[0]
    rows = rows_where(drafted, delta=chosen)
    scatter = right.scatter(
        [r["target_mass"] for r in rows],
        [r["frontier_mass"] for r in rows],
        c=[r["draft_mass"] for r in rows],
        cmap="plasma",
        s=9,
        alpha=0.7,
        vmin=0,
        vmax=1,
    )
    fig.colorbar(scatter, ax=right, label="draft mass p_n of the drafted token")
    curve = sorted(rows_where(results.gamma, delta=chosen), key=lambda r: r["target_mass"])
    right.plot(
        [r["target_mass"] for r in curve],
        [r["exact"] for r in curve],
        color=COLORS["cactus-exact"],
        lw=1.8,
        label=f"cactus-exact γ*(q_n, {chosen:g})",
    )
    right.plot([0, 1], [0, 1], color="black", lw=0.8, ls=":", label="h_n = q_n (SpS)")
    right.set_title(f"frontier(δ={chosen:g}) on real contexts: h_n for drafted n", fontsize=10)
    right.set_xlabel("verifier mass of the drafted token, q_n")
    right.set_ylabel("h_n (mass frontier's h gives n)")
    right.grid(alpha=0.3)
    right.legend(fontsize=7.5, loc="lower right")
    return {
        "delta": chosen,
        "points": [(r["target_mass"], r["draft_mass"], r["frontier_mass"]) for r in rows],
    }


# -- figure 6 -------------------------------------------------------------------------------


def _visible(text: str) -> str:
    """Token text with spaces and control characters made visible (␣, \\n, \\t)."""
    return repr(text)[1:-1].replace(" ", "␣")


def figure_example(results: Results, folder: Path) -> Figure:
    """q, p and the h each rule targets, for one real held-out context."""
    example = results.example
    bars = example["bars"]
    tokens = [_visible(t) for t in example["tokens"]]
    order = example.get("order") or list(bars)
    rules = [label for label in order if label not in ("target q", "draft p")]
    fig, axes = plt.subplots(
        1 + math.ceil(len(rules) / 3),
        3,
        figsize=(13, 2.6 * (1 + math.ceil(len(rules) / 3))),
        squeeze=False,
    )
    top = plt.subplot2grid((axes.shape[0], 3), (0, 0), colspan=3, fig=fig)
    for axis in axes[0]:
        axis.remove()
    positions = list(range(len(tokens)))
    _example_top(top, example, tokens, positions)
    _example_rules(axes[1:].ravel(), example, rules, tokens, positions)
    axes[1][0].legend(fontsize=7)
    fig.tight_layout()
    png, svg = save(fig, folder, "fig6_example")
    caption = (
        "Read: how each rule reshapes the verifier's q for one drafted token, and what that "
        "does to its acceptance (titles). One real held-out context. Top: the verifier's q "
        "and the draft's p after the paper's "
        "sampling processors (T = 0.6, top-k 20, top-p 0.95). Below, for the draft's most "
        "likely token n (red), the distribution h each rule verifies against, over q "
        "(outline), at the budget δ = 0.25 (at δ = 1 every rule accepts every token q "
        "allows in this context). SpS uses q itself; cactus and cactus-exact raise n and "
        "shrink the rest of q in proportion; frontier keeps p where the clip allows and "
        "caps it elsewhere; interp mixes p into q (and so can emit tokens q excludes); for "
        "TAS the bars are the law of the emitted token given n. Titles give P(accept n) and "
        "the overall acceptance Σ p a."
    )
    series = {"bars": bars, "acceptance": example["acceptance"], "tokens": example["tokens"]}
    return Figure("fig6_example", "Worked example", caption, png, svg, series)


def _example_top(top, example: dict, tokens: list[str], positions: list[int]) -> None:
    """The worked example's top panel: q and p side by side, the drafted token in red."""
    bars, drafted = example["bars"], example["drafted_index"]
    width = 0.4
    top.bar(
        [x - width / 2 for x in positions],
        bars["target q"],
        width,
        color="#444444",
        label="verifier q",
    )
    top.bar(
        [x + width / 2 for x in positions], bars["draft p"], width, color="#17becf", label="draft p"
    )
    top.set_xticks(positions, tokens, fontsize=8)
    top.get_xticklabels()[drafted].set_color("#d62728")
    top.set_ylabel("probability")
    context = _visible(example["context_text"][-60:])
    top.set_title(
        f"context: …{context}   →   the draft's favourite n = {tokens[drafted]} (red)",
        fontsize=9,
    )
    top.legend(fontsize=8)


def _example_rules(axes, example: dict, rules: list[str], tokens, positions) -> None:
    """One panel per rule: its h for the drafted token (red) over q, acceptance in the title."""
    bars, drafted = example["bars"], example["drafted_index"]
    for axis, label in zip(axes, rules, strict=False):
        axis.bar(
            positions, bars["target q"], 0.8, fill=False, edgecolor="#444444", lw=0.8, label="q"
        )
        colors = ["#d62728" if i == drafted else "#7f7f7f" for i in positions]
        axis.bar(positions, bars[label], 0.5, color=colors, label="h (drafted n in red)")
        accept = example["acceptance"][label]
        axis.set_title(
            f"{label}: P(accept n) = {accept['drafted']:.2f}, overall {accept['overall']:.2f}",
            fontsize=8.5,
        )
        axis.set_xticks(positions, tokens, fontsize=6.5, rotation=45)
        axis.set_ylim(0, 1.02)
    for axis in axes[len(rules) :]:
        axis.set_visible(False)


# -- figure 7 -------------------------------------------------------------------------------


def figure_sequence_kl(results: Results, folder: Path) -> Figure:
    """Chain-rule sequence divergence against generated length at matched acceptance."""
    rows = rows_where(results.sequence_kl, source=results.main_source, group="matched")
    decode = {
        r["rule"]: r
        for r in rows_where(results.decoding, source=results.main_source, group="matched")
    }
    fig, axis = plt.subplots(figsize=(7.6, 4.8))
    series: dict = {}
    infinite = []
    for rule in dict.fromkeys(r["rule"] for r in rows):
        points = sorted(rows_where(rows, rule=rule), key=lambda r: r["length"])
        name = rule.split(":")[0]
        info = decode.get(rule, {})
        if not all(finite(r["kl_cumulative"]) for r in points):
            infinite.append(_short_label(info, rule))
            series[rule] = [(r["length"], r["kl_cumulative"]) for r in points]
            continue
        t = [r["length"] for r in points]
        mean = [r["kl_cumulative"] for r in points]
        band = [2 * r["kl_cumulative_se"] for r in points]
        axis.plot(
            t,
            mean,
            color=COLORS.get(name, "gray"),
            label=f"{_short_label(info, rule)}: α̂ = {info.get('acceptance_mc', math.nan):.3f}",
        )
        axis.fill_between(
            t,
            [m - b for m, b in zip(mean, band, strict=True)],
            [m + b for m, b in zip(mean, band, strict=True)],
            color=COLORS.get(name, "gray"),
            alpha=0.12,
        )
        series[rule] = list(zip(t, mean, strict=True))
    goal = (results.calibration or {}).get("goal")
    title = "Sequence-level divergence, relaxed rules at matched acceptance"
    if goal is not None:
        title += f"\n(calibrated to acceptance {goal:.3f} on held-out contexts; α̂ = measured)"
    axis.set_title(title, fontsize=10)
    axis.set_xlabel("generated tokens t")
    axis.set_ylabel("D_t = E[Σ_{s≤t} KL(μ_s ‖ q_s)]  [nats]")
    axis.grid(alpha=0.3)
    if infinite:
        axis.plot([], [], " ", label="∞ (emits tokens q excludes): " + ", ".join(infinite))
    axis.legend(fontsize=7.5, loc="upper left")
    fig.tight_layout()
    png, svg = save(fig, folder, "fig7_sequence_kl")
    caption = (
        "Read: the slope is the nats of drift per generated token each rule pays for its "
        "acceptance; the lowest line buys it most cheaply. "
        "The chain-rule divergence of generated text from the verifier, D_t = E[Σ_{s≤t} "
        "KL(μ_s‖q_s)], along each rule's own trajectories (bands: ±2 standard errors over "
        "sequences; k = 10). It equals the KL between the rule's and the verifier's laws of "
        "(text, block phase) and bounds the KL of the text alone. The relaxed rules are tuned "
        "so that their exact mean acceptance over held-out contexts equals cactus(δ=1)'s; on "
        "the contexts the decoder visits the measured acceptance α̂ differs a little, so "
        "compare lines together with α̂. SpS and TAS are shown at their own acceptance."
    )
    return Figure("fig7_sequence_kl", "Sequence-level divergence", caption, png, svg, series)


def _short_label(info: dict, rule: str) -> str:
    """``name(δ=0.465)``: the rule with its parameter to 3 significant digits."""
    symbols = {"delta": "δ", "alpha": "α", "spread": "κ", "epsilon": "ε", "k": "k"}
    name, value, key = info.get("name"), info.get("param"), info.get("param_name")
    if not name:
        return rule
    if not key or not finite(value):
        return name
    return f"{name}({symbols.get(key, key)}={value:.3g})"


#: Figures that need only the sweep's results, in report order (figure 2 is separate).
SWEEP_FIGURES: tuple[Callable[[Results, Path], Figure], ...] = (
    figure_tradeoff,
    figure_al_vs_delta,
    figure_speedup,
    figure_gamma,
    figure_example,
    figure_sequence_kl,
    figures_real.figure_real_model,
)
