"""``cactus bench hf``'s tables: per (pair, setting) one row per config with tokens/s,
AL and the speed-up over plain generate() with its interval, and the paired comparisons
(ours/theirs, generate()/direct). Ratios are medians of per-round paired ratios with the
order-statistic interval of ``cactus_theory.real.decode_table.median_interval``.
"""

from __future__ import annotations

import dataclasses
import statistics

from cactus_theory.cli.bench_hf_cells import CACTUS, SETTINGS, Group


def summarise(groups: list[Group], cells: dict, args) -> list[dict]:
    """One table per (pair, setting): rows with tokens/s, AL and speed-up [interval], and
    the paired comparisons (ours/theirs, generate()/direct, best each)."""
    from cactus_theory.real.decode_table import median_interval

    tables = []
    rounds = range(args.repeats)
    for group in groups:
        for setting in args.settings:

            def speeds(config, setting=setting, group=group):
                return [cells[group.name, setting, config, r].tokens_per_second for r in rounds]

            def ratio(top, bottom, speeds=speeds):
                values = [a / b for a, b in zip(speeds(top), speeds(bottom), strict=True)]
                median, low, high, coverage = median_interval(values)
                return {"median": median, "low": low, "high": high, "coverage": coverage}

            plain = group.configs[0]
            rows = []
            for config in group.configs:
                first = cells[group.name, setting, config, 0]
                rows.append(
                    {
                        "config": config.label,
                        "draft": config.draft,
                        "tokens_per_second": statistics.median(speeds(config)),
                        "acceptance_length": first.acceptance_length,
                        "tokens": first.tokens,
                        "speedup": ratio(config, plain),
                        "rounds_agree": all(
                            cells[group.name, setting, config, r].texts == first.texts
                            for r in rounds
                        ),
                    }
                )
            comparisons = {}
            by = {(c.kind, c.draft, c.rule, c.batch): c for c in group.configs}
            theirs = by.get(("theirs", "standalone", None, 1))
            for draft in group.drafts:
                direct = by[("direct", draft, "sps", 1)]
                via_hf = by[("hf", draft, "sps", 1)]
                comparisons[f"{draft}: sps hf / sps (generate() / direct)"] = ratio(via_hf, direct)
                if theirs is not None:
                    comparisons[f"{draft}: sps / theirs"] = ratio(direct, theirs)
                    comparisons[f"{draft}: sps hf / theirs"] = ratio(via_hf, theirs)
                    comparisons[f"{draft}: cactus δ=1 hf / theirs"] = ratio(
                        by[("hf", draft, CACTUS, 1)], theirs
                    )
            reference = cells[group.name, setting, plain, 0].texts
            greedy_same = None
            if SETTINGS[setting].temperature == 0:
                greedy_same = [
                    row["config"]
                    for row, config in zip(rows, group.configs, strict=True)
                    if cells[group.name, setting, config, 0].texts != reference
                ]
            tables.append(
                {
                    "pair": group.name,
                    "setting": setting,
                    "sampling": dataclasses.asdict(SETTINGS[setting]),
                    "drafts": {kind: group.draft_description(kind) for kind in group.drafts},
                    "rows": rows,
                    "comparisons": comparisons,
                    "greedy_differs": greedy_same,
                }
            )
    return tables


def interval_text(value: dict) -> str:
    """ "1.23x [1.10, 1.31]"; without the interval when there is none (one round, or a
    row against itself)."""
    if value["coverage"] <= 0.0 or value["low"] == value["high"]:
        return f"{value['median']:.2f}x"
    return f"{value['median']:.2f}x [{value['low']:.2f}, {value['high']:.2f}]"


def table_lines(table: dict) -> list[str]:
    sampling = table["sampling"]
    name = "greedy"
    if sampling["temperature"] > 0:
        name = f"T={sampling['temperature']:g}, top-k {sampling['top_k']}, "
        name += f"top-p {sampling['top_p']:g}"
    lines = [f"\n{table['pair']}, {name}"]
    lines += [f"  {text}" for text in table["drafts"].values()]
    header = f"  {'config':<18} {'draft':<11} {'tokens/s':>9} {'AL':>5} {'speed-up [interval]':>22}"
    lines += [header, "  " + "-" * (len(header) - 2)]
    for row in table["rows"]:
        lines.append(
            f"  {row['config']:<18} {row['draft'] or '-':<11} {row['tokens_per_second']:>9.1f} "
            f"{row['acceptance_length']:>5.2f} {interval_text(row['speedup']):>22}"
        )
    for label, value in table["comparisons"].items():
        lines.append(f"  {label}: {interval_text(value)}")
    if table["greedy_differs"] is not None:
        differing = table["greedy_differs"]
        lines.append(
            "  greedy: every config emitted the plain generate() tokens"
            if not differing
            else "  greedy: tokens differ from plain generate() for " + ", ".join(differing)
        )
    return lines
