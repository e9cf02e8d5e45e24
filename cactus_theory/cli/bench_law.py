"""``cactus bench law``: how many (target, draft) instances per second the exact laws handle.

For each rule it times ``law.output_law`` plus ``law.acceptance`` on one batch of
Dirichlet pairs, and, in the same run on a small slice, the O(V²) enumeration reference
(``law.output_law_enumerated``), so the speed-up of the closed forms is a ratio measured
side by side. It also reports the largest disagreement between the two. Timings take the
best of ``--repeats`` runs (this machine is shared and noisy).
"""

from __future__ import annotations

import argparse

import numpy as np

from cactus_theory.core import law, rules
from cactus_theory.util.files import atomic_write_json, check_writable
from cactus_theory.util.timing import best_seconds

DEFAULT_RULES = (
    "sps",
    "cactus:delta=0.5",
    "cactus-exact:delta=0.5",
    "cactus-exact:delta=0.01",
    "frontier:delta=0.1",
    "interp:alpha=0.3",
    "tas",
    "topk:k=5",
    "greedy",
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=10_000, help="instances per timed batch")
    parser.add_argument(
        "--vocab", type=int, nargs="+", default=[16, 64], help="vocabulary sizes V to time"
    )
    parser.add_argument(
        "--rule", action="append", help="rule spec name[:k=v,...]; repeatable (default: all)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="best-of repeats per timing")
    parser.add_argument(
        "--reference-batch", type=int, default=50, help="instances timed with the enumeration"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")


def measure(
    rule: rules.Rule, batch: int, vocab: int, reference_batch: int, repeats: int, seed: int
) -> dict:
    rng = np.random.default_rng(seed)
    target = rng.dirichlet(np.full(vocab, 0.3), size=batch)
    draft = rng.dirichlet(np.full(vocab, 0.3), size=batch)

    def fast() -> None:
        law.output_law(rule, target, draft)
        law.acceptance(rule, target, draft)

    def enumerated() -> None:
        for row in range(reference_batch):
            law.output_law_enumerated(rule, target[row], draft[row])

    fast_seconds = best_seconds(fast, repeats)
    reference_seconds = best_seconds(enumerated, 1)
    fast_law = law.output_law(rule, target[:reference_batch], draft[:reference_batch])
    disagreement = max(
        float(
            np.abs(fast_law[row] - law.output_law_enumerated(rule, target[row], draft[row])).max()
        )
        for row in range(reference_batch)
    )
    fast_rate = batch / fast_seconds
    reference_rate = reference_batch / reference_seconds
    return {
        "rule": rule.label,
        "vocab": vocab,
        "batch": batch,
        "instances_per_s": fast_rate,
        "enumeration_per_s": reference_rate,
        "speedup": fast_rate / reference_rate,
        "max_abs_disagreement": disagreement,
    }


def run(args: argparse.Namespace) -> int:
    if args.json:
        check_writable("json", args.json)
    if args.batch < 1 or args.reference_batch < 1 or args.repeats < 1:
        raise ValueError("batch: --batch, --reference-batch and --repeats must be >= 1")
    if any(v < 2 for v in args.vocab):
        raise ValueError("vocab: every V must be >= 2")
    chosen = [rules.parse(spec) for spec in (args.rule or DEFAULT_RULES)]
    rows = []
    header = f"{'rule':<28} {'V':>5} {'inst/s':>12} {'enum/s':>10} {'ratio':>8} {'max |Δ|':>9}"
    print(header)
    print("-" * len(header))
    for vocab in args.vocab:
        for rule in chosen:
            row = measure(rule, args.batch, vocab, args.reference_batch, args.repeats, args.seed)
            rows.append(row)
            print(
                f"{row['rule']:<28} {vocab:>5} {row['instances_per_s']:>12,.0f} "
                f"{row['enumeration_per_s']:>10,.0f} {row['speedup']:>7.0f}x "
                f"{row['max_abs_disagreement']:>9.1e}",
                flush=True,
            )
    slowest = min(rows, key=lambda row: row["instances_per_s"])
    print(
        f"\nslowest: {slowest['rule']} at V={slowest['vocab']}: "
        f"{slowest['instances_per_s']:,.0f} instances/s (target >= 10,000)"
    )
    if args.json:
        atomic_write_json(args.json, {"rows": rows}, indent=2)
    return 0
