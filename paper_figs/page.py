"""The report's HTML: the summary, real-model, claims and validation tables, and the page
around the figures (``render``). It reads results only (``Results``, the claims result,
the drawn figures); ``report`` runs the steps that produce them.
"""

from __future__ import annotations

import html

from paper_figs import page_conform
from paper_figs.data import Results
from paper_figs.figure_kit import Figure
from paper_figs.page_real import real_model_section

#: The summary table's rows: (rule spec, label), as in the paper's Table 1.
SUMMARY_RULES = (
    ("sps", "SpS"),
    ("tas", "TAS (ε = 0.09)"),
    ("cactus:delta=0.75", "cactus δ = 0.75"),
    ("cactus:delta=1.0", "cactus δ = 1.0"),
    ("cactus-exact:delta=0.75", "cactus-exact δ = 0.75"),
    ("cactus-exact:delta=1.0", "cactus-exact δ = 1.0"),
    ("frontier:delta=0.75", "frontier δ = 0.75"),
    ("frontier:delta=1.0", "frontier δ = 1.0"),
)
SUMMARY_KS = (10, 20)
#: Files the claims check writes beside the report, and the run record.
CLAIMS_FILES = ("claims.json", "claims.md", "run.json")
Z95 = 1.959963984540054
#: The real-model section's heading.
REAL_TITLE = "Real model: the exact trade-off on real contexts"


# -- tables ---------------------------------------------------------------------------------


def summary_rows(results: Results) -> list[dict]:
    """Table-1-like rows: AL (95% CI), Rej% change vs SpS and KL per token, per k."""
    rows = []
    grid = [
        r for r in results.decoding if r["source"] == results.main_source and r["group"] == "grid"
    ]
    for spec, label in SUMMARY_RULES:
        row = {"rule": spec, "label": label}
        present = False
        for k in SUMMARY_KS:
            match = [r for r in grid if r["rule"] == spec and r["k"] == k]
            if match:
                present = True
                cell = match[0]
                row[k] = {
                    "al": cell["al"],
                    "al_half_width": Z95 * cell["al_se"],
                    "rej_change": cell["rej_change_vs_sps_pct"],
                    "rejections": cell["rejections_per_100_tokens"],
                    "kl_per_token": cell["kl_per_token"],
                    "nll_vs_sps": cell["nll_vs_sps"],
                }
        if present:
            rows.append(row)
    return rows


def _number(value: object, digits: int = 3, signed: bool = False) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and value != value:
        return "–"
    if value == float("inf"):
        return "∞"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def summary_table(rows: list[dict]) -> str:
    head = "".join(
        f"<th>AL (k={k})</th><th>Rej% (k={k})</th><th>KL/token (k={k})</th>" for k in SUMMARY_KS
    )
    body = []
    for row in rows:
        cells = [f"<td>{html.escape(row['label'])}</td>"]
        for k in SUMMARY_KS:
            data = row.get(k)
            if data is None:
                cells.append("<td>–</td><td>–</td><td>–</td>")
                continue
            cells.append(
                f"<td>{data['al']:.3f} ± {data['al_half_width']:.3f}</td>"
                f"<td>{_number(data['rej_change'], 1, signed=True)}</td>"
                f"<td>{_number(data['kl_per_token'], 4)}</td>"
            )
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr><th>rule</th>{head}</tr>{''.join(body)}</table>"


def real_model_table(
    real_model: dict | None, figure: Figure | None = None, tree_figure: Figure | None = None
) -> str:
    """The real-model section (``paper_figs.page_real``): the exact trade-off on real
    contexts, the theory against the decoder and the speed check, or why it is missing."""
    return real_model_section(real_model, figure, tree_figure)


def claims_table(claims: dict) -> str:
    """One readable row per claim: id, statement, owner, verdict, instances and the decisive
    figure with its name; the full worst case and any counterexample in an expandable
    ``<details>`` (everything is also in claims.json)."""
    from proofs_check import report as claims_report

    rows = []
    for claim in claims.get("claims", []):
        verdict = str(claim.get("verdict", ""))
        css = "holds" if verdict == "holds" else "fails"
        details = "".join(
            f"<li>{html.escape(key)}: {html.escape(value)}</li>"
            for key, value in claims_report.entries(claim.get("worst_case"))
        )
        counter = claims_report.entries(claim.get("counterexample"))
        if counter:
            details += "<li>counterexample:<ul>" + "".join(
                f"<li>{html.escape(key)}: {html.escape(value)}</li>" for key, value in counter
            )
            details += "</ul></li>"
        more = f"<details><summary>details</summary><ul>{details}</ul></details>" if details else ""
        claim_id = html.escape(str(claim.get("id", "")))
        rows.append(
            f"<tr id='claim-{claim_id}'><td><code>{claim_id}</code></td>"
            f"<td>{html.escape(str(claim.get('statement', '')))}</td>"
            f"<td>{html.escape(str(claim.get('owner', '')))}</td>"
            f"<td class='{css}'>{html.escape(verdict)}</td>"
            f"<td>{html.escape(str(claim.get('instances', '')))}</td>"
            f"<td class='figure'>{html.escape(claims_report.decisive(claim))}{more}</td>"
            "</tr>"
        )
    return (
        "<table class='claims'><tr><th>id</th><th>claim</th><th>owner</th><th>verdict</th>"
        f"<th>instances</th><th>decisive figure</th></tr>{''.join(rows)}</table>"
    )


def claims_summary(claims: dict) -> str:
    """One sentence: how many claims hold, which paper claims fail, whether ours hold."""
    items = claims.get("claims", [])
    held = sum(item.get("verdict") == "holds" for item in items)
    failing = [item for item in items if item.get("verdict") != "holds"]
    paper = [str(item.get("id")) for item in failing if item.get("owner") == "paper"]
    ours = [str(item.get("id")) for item in failing if item.get("owner") == "ours"]
    text = f"{held} of {len(items)} claims hold."
    if paper:
        text += " Paper claims that fail (findings): " + ", ".join(paper) + "."
    if ours:
        text += " Our own guarantees that FAIL: " + ", ".join(ours) + "."
    else:
        text += " All of our own guarantees hold."
    return text


def engines_table(results: Results) -> str:
    """The engines' relaxed rules (``engines.csv``) beside cactus, cactus-exact and the
    frontier tuned to the same exact acceptance: what each pays in emitted KL (and TV)."""
    if not results.engines:
        return "<p>The engines' rules were not run in this report.</p>"

    def cell(row: dict, prefix: str) -> str:
        kl, tv = row.get(f"{prefix}_kl"), row.get(f"{prefix}_tv")
        if row["acceptance"] < row["sps_acceptance"]:
            return "<td>SpS accepts more at KL 0</td>"
        if not isinstance(kl, float) or kl != kl:
            return "<td>out of reach</td>"
        return f"<td>{_number(kl, 4)} / {_number(tv, 3)}</td>"

    body = [
        f"<tr><td>{html.escape(row['source'])}</td><td>{html.escape(row['label'])}</td>"
        f"<td>{_number(row['acceptance'], 3)} (SpS {_number(row['sps_acceptance'], 3)})</td>"
        f"<td>{_number(row['emitted_kl'], 4)} / {_number(row['emitted_tv'], 3)}</td>"
        f"<td>{_number(row['emitted_kl_max'], 3)}</td>"
        + "".join(cell(row, prefix) for prefix in ("cactus", "cactus_exact", "frontier"))
        + "</tr>"
        for row in results.engines
    ]
    return (
        "<p>Each engine ships a lossy acceptance rule with no divergence guarantee: "
        "TensorRT-LLM's relaxed top-K for MTP (its published DeepSeek-R1 setting K = 10, "
        "δ = 0.6; AMD ATOM's K = 8, δ = 0.5), SGLang's acceptance thresholds, and the "
        "top-K-with-ratio rule proposed for vLLM. Here each runs on sampled drafts, its "
        "emitted law computed exactly on the same pools as figure 1, and cactus, "
        "cactus-exact and the frontier are tuned to its exact mean acceptance: the columns "
        "give mean KL / TV of the emitted law per position (nats / total variation), so a "
        "smaller number buys the same acceptance for less divergence. The engines built "
        "these rules for greedy (one-hot) drafts; with drafts sampled from p they can accept "
        "less than lossless SpS, which the table says. Rows come from "
        "<code>engines.csv</code>; the rules are defined in docs/rules.md.</p>"
        "<table><tr><th>source</th><th>engine rule</th><th>acceptance</th>"
        "<th>KL / TV</th><th>worst row KL</th><th>cactus at equal acceptance</th>"
        "<th>cactus-exact</th><th>frontier</th></tr>"
        f"{''.join(body)}</table>"
    )


def validation_table(results: Results) -> str:
    """MC AL vs the block-statistics prediction on the i.i.d. (synthetic) sources."""
    rows = []
    for row in results.decoding:
        if row["source"] == results.main_source or row["group"] != "grid":
            continue
        if row["source"].startswith("text"):
            continue
        gap = row["al"] - row["al_predicted"]
        if row["al_se"]:
            z = gap / row["al_se"]
        else:  # every step accepted all k drafts (or none): the prediction must be exact
            z = 0.0 if abs(gap) <= 1e-9 else float("inf")
        flag = "yes" if abs(z) <= 2.576 else "no"
        rows.append(
            f"<tr><td>{html.escape(row['source'])}</td><td>{html.escape(row['label'])}</td>"
            f"<td>{row['k']}</td><td>{row['al']:.3f} ± {Z95 * row['al_se']:.3f}</td>"
            f"<td>{row['al_predicted']:.3f}</td><td>{z:+.2f}</td><td>{flag}</td></tr>"
        )
    if not rows:
        return "<p>No i.i.d. source was decoded in this run.</p>"
    return (
        "<table><tr><th>source</th><th>rule</th><th>k</th><th>MC AL (95% CI)</th>"
        "<th>predicted E[L]</th><th>z</th><th>|z| ≤ 2.58 (99%)</th></tr>"
        f"{''.join(rows)}</table>"
    )


# -- page -----------------------------------------------------------------------------------

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222;
       line-height: 1.45; padding: 0 1em; }
table { border-collapse: collapse; margin: 0.8em 0 1.4em; font-size: 0.88em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.55em; text-align: right; vertical-align: top; }
th { background: #f2f2f2; } td:first-child { text-align: left; white-space: nowrap; }
table.claims td:nth-child(2), table.claims td.figure { text-align: left; }
table.claims td:nth-child(2) { min-width: 22em; }
td.holds { color: #1a7f37; font-weight: 600; } td.fails { color: #b91c1c; font-weight: 600; }
p.fails { color: #b91c1c; } p.quote { border-left: 3px solid #1f77b4; padding-left: 0.7em; }
details summary { cursor: pointer; color: #555; font-size: 0.9em; }
details ul { margin: 0.3em 0; padding-left: 1.2em; }
figure { margin: 1.6em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.92em; color: #333; margin-top: 0.4em; }
nav ol { columns: 2; } code { background: #f5f5f5; padding: 0 0.2em; }
"""


def _parallel_note(timings: dict[str, float]) -> str:
    if "claims_wait" not in timings:
        return ""
    return f" in a parallel process, {timings['claims_wait']:.1f} s of it after the sweeps"


def _real_note(timings: dict[str, float]) -> str:
    if "real_model" not in timings:
        return ""
    parts = [
        f"{label} {timings[key]:.1f} s"
        for key, label in (
            ("real_model_load", "loading and dtypes"),
            ("real_model_pools", "pools"),
            ("real_model_theory", "theory"),
            ("real_model_speed", "speed check"),
        )
        if key in timings
    ]
    inner = f" ({', '.join(parts)})" if parts else ""
    if "real_model_wait" in timings:
        inner += (
            f" in a parallel process started with the sweeps, {timings['real_model_wait']:.1f} s "
            "of it after the sweeps and the claims check"
        )
    return f"real-model section {timings['real_model']:.1f} s{inner}, "


def _figure_number(figure: Figure) -> int:
    return int(figure.name[3])  # fig<N>_...: the numbering is kept when a figure is missing


def contents(drawn: list[Figure], sections: list[tuple[str, str]]) -> str:
    """The table of contents: the sections, with the figures listed under theirs."""
    items = []
    for anchor, title in sections:
        entry = f"<li><a href='#{anchor}'>{html.escape(title)}</a>"
        if anchor == "figures" and drawn:
            entry += "<ol>" + "".join(
                f"<li value='{_figure_number(figure)}'><a href='#{figure.name}'>"
                f"{html.escape(figure.title)}</a></li>"
                for figure in drawn
            )
            entry += "</ol>"
        items.append(entry + "</li>")
    return f"<nav><b>Contents</b><ol>{''.join(items)}</ol></nav>"


def figure_html(figure: Figure) -> str:
    """One figure with its caption; links are relative to the report's folder."""
    return (
        f"<figure id='{figure.name}'><img src='figures/{figure.png.name}' "
        f"alt='{html.escape(figure.title)}'><figcaption><b>Figure {_figure_number(figure)}. "
        f"{html.escape(figure.title)}.</b> {html.escape(figure.caption)} "
        f"(<a href='figures/{figure.svg.name}'>SVG</a>)</figcaption></figure>"
    )


def render(
    results: Results,
    drawn: list[Figure],
    claims: dict,
    summary: list[dict],
    *,
    preset,
    timings: dict[str, float],
    cells: tuple[int, int],
    quick: bool,
    real_figure: Figure | None = None,
    tree_figure: Figure | None = None,
) -> str:
    """The report page: self-contained HTML whose every link (figures, SVGs, CSVs) is a
    relative path inside the output folder, so the folder alone renders it, offline.

    Order: run facts, contents, summary, the real-model section (led by ``real_figure``,
    the exact trade-off on real contexts), figures, the engines' rules, the i.i.d.
    simulation check, the claims table (long), the data files.
    """
    sections = [
        ("summary", "Summary"),
        ("real-model", REAL_TITLE),
        ("figures", "Figures"),
        ("engines", "The engines' relaxed rules at equal acceptance"),
        ("conformance", page_conform.TITLE),
        ("simulation", "Simulation check on i.i.d. sources"),
        ("claims", "Claims"),
        ("data", "Data"),
    ]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>cactus report</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>cactus-theory report</h1>",
        *_run_facts(claims, preset=preset, timings=timings, cells=cells, quick=quick),
        contents(drawn, sections),
        "<h2 id='summary'>Summary (real text, autoregressive Monte Carlo)</h2>",
        summary_table(summary),
        "<p>AL: accepted drafts per verification step, bonus token excluded, with a 95% "
        "confidence interval (steps treated as independent). Rej%: change in rejected drafts "
        "per emitted token relative to SpS at the same k (−30 means 30% fewer rejections). "
        "KL/token: the exact KL(emitted law ‖ q) averaged over every generated token (bonus "
        "tokens add 0), i.e. the slope of figure 7. Columns come from "
        "<code>decoding.csv</code>.</p>",
        f"<h2 id='real-model'>{REAL_TITLE}</h2>",
        real_model_table(results.real_model, real_figure, tree_figure),
        "<h2 id='figures'>Figures</h2>",
        *(figure_html(figure) for figure in drawn),
        "<h2 id='engines'>The engines' relaxed rules at equal acceptance</h2>",
        engines_table(results),
        f"<h2 id='conformance'>{page_conform.TITLE}</h2>",
        page_conform.conformance_section(results.conformance),
        "<h2 id='simulation'>Simulation check on i.i.d. sources</h2>",
        "<p>On a synthetic pool every position draws its (q, p) independently, so the expected "
        "accepted length is exactly Σ_j α^j over j = 1..k with α the pool's mean exact "
        "acceptance (<code>cactus_theory.core.block</code>). z = (MC − predicted) / standard "
        "error; about 1 cell in 100 exceeds 2.58 by chance.</p>",
        validation_table(results),
        "<h2 id='claims'>Claims</h2>",
        f"<p>{html.escape(claims_summary(claims))} Each row gives the figure its verdict "
        "rests on; open <i>details</i> for every measured quantity and any counterexample. "
        "The full result is in <a href='claims.json'>claims.json</a>.</p>",
        claims_table(claims),
        "<h2 id='data'>Data</h2><p>",
        ", ".join(f"<a href='{name}'>{name}</a>" for name in _data_files(results)),
        ". Column meanings are in the project's docs/simulations.md (CSV columns).</p>",
        "</body></html>",
    ]
    return "\n".join(parts)


def _run_facts(
    claims: dict, *, preset, timings: dict[str, float], cells: tuple[int, int], quick: bool
) -> list[str]:
    """The page's opening paragraphs: mode, run times and cells; the real-text source; the
    claims verdict."""
    text_label = ""
    if preset.text:
        from sims.realtext import TextSettings

        text_label = TextSettings(sampling=preset.text[0].sampling).label
    return [
        f"<p>Mode <b>{'quick' if quick else 'full'}</b>, seed {preset.seed}. Run time "
        f"{timings['total']:.1f} s (sweeps {timings['sweep']:.1f} s, claims check "
        f"{timings['claims']:.1f} s{_parallel_note(timings)}, "
        f"{_real_note(timings)}figures {timings['figures']:.1f} s); {cells[0]} sweep "
        f"cells, {cells[1]} computed in this run, the rest read from <code>cells/</code>.</p>",
        f"<p>Real-text source: {html.escape(text_label)}; decoding {preset.text_sequences} "
        f"sequences × {preset.text_length} tokens per cell from held-out prompts (matched "
        f"runs: {preset.matched_sequences} × {preset.matched_length}).</p>",
        f"<p><b>Claims:</b> {html.escape(claims_summary(claims))} "
        "(<a href='#claims'>table</a>)</p>",
    ]


def _data_files(results: Results) -> tuple[str, ...]:
    """The files the page links under Data: the sweep's, the real model's (trade-offs and
    tree trade-off), the conformance section's, the claims'."""
    from sims.sweep_csv import OUTPUT_FILES

    real_files: tuple[str, ...] = ()
    if results.real_model is not None:
        real_files = ("real_model.json",)
        entries = results.real_model.get("tradeoff") or {}
        real_files += tuple(entry["csv"] for entry in entries.values() if entry.get("csv"))
        tree_csv = (results.real_model.get("trees") or {}).get("csv")
        real_files += (tree_csv,) if tree_csv else ()
    if results.conformance is not None:
        real_files += ("conformance.json",)
    return (*OUTPUT_FILES, *real_files, *CLAIMS_FILES)
