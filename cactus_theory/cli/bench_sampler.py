"""``cactus bench sampler``: the batched torch sampler against a dense reference and a floor.

Workload (defaults): B = 64 rows, k = 10 drafts, V = 151,936 (a Qwen-size vocabulary),
float32 rows from softmax(logits), the draft a noisy copy of the target, drafts sampled from
the draft rows. For each rule, timed side by side in one run (best of ``--repeats``):

- ``ours``: ``sampler.verify(..., check=False)`` (the fast path) and with ``check=True``;
- ``dense``: ``sampler.verify_dense``, the reference-style path that materialises h, the
  acceptances and the residuals over [B, k, V] (as reference implementations do);
- ``floor``: bytes that must be read divided by the bandwidth of a plain copy measured here
  (bandwidth = 2 × bytes / time of ``dst.copy_(src)``, read + write). Two floors:
  ``needed`` counts the rows the rule's adapter must read (rules deciding from q_n and p_n,
  such as SpS, cactus, cactus-exact: the target and draft rows at one position per batch
  row; decision rules with a torch half: every target row; every other rule that reads rows,
  the frontier and any rule on the generic adapter: every target and draft row), ``all``
  counts every input row once.

Any registered rule can be timed (``--rule``, with ``--rules-module`` for a local module):
a rule without a torch half of its own runs on the generic adapter
(``sampler.rules.general``), so its row here is the price of writing it in numpy alone.

Ratios printed: dense / ours (what not materialising h buys), ours / floor (how far from
reading memory at copy speed) and ours / cactus (each rule against cactus δ = 1 on the same
workload, when cactus is among the rules).

Workloads: ``--workload BxKxV`` (repeatable) instead of ``--batch``/``-k``/``--vocab``;
``--goals`` runs the goal workloads of the verify-step issue (64x10x151936, 1x5x49152,
8x5x49152) with the default rules plus frontier δ = 0.2 (a budget the benchmark's drafts
exceed, so its rows are solved, not only checked), and ends with one summary table.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

from cactus_theory.core import rules
from cactus_theory.util.files import atomic_write_json, check_writable
from cactus_theory.util.timing import best_seconds

DEFAULT_RULES = ("sps", "cactus:delta=1.0", "cactus-exact:delta=0.5", "frontier:delta=1.0")
#: The workloads (B, k, V) and extra rule of ``--goals``.
GOAL_WORKLOADS = ((64, 10, 151_936), (1, 5, 49_152), (8, 5, 49_152))
GOAL_EXTRA_RULES = ("frontier:delta=0.2",)
#: The rule each row is compared with (ours / cactus).
REFERENCE_RULE = "cactus:delta=1.0"


def parse_workload(text: str) -> tuple[int, int, int]:
    """(B, k, V) from ``BxKxV`` (e.g. ``64x10x151936``); ValueError otherwise."""
    parts = text.lower().replace(",", "").replace("_", "").split("x")
    try:
        batch, steps, vocab = (int(part) for part in parts)
    except ValueError:
        raise ValueError(f"workload: expected BxKxV such as 64x10x151936, got {text!r}") from None
    if batch < 1 or steps < 1 or vocab < 2:
        raise ValueError(f"workload: need B >= 1, k >= 1, V >= 2, got {text!r}")
    return batch, steps, vocab


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=64, help="rows B (default 64)")
    parser.add_argument("-k", type=int, default=10, help="drafts per row (default 10)")
    parser.add_argument("--vocab", type=int, default=151_936, help="vocabulary V (default 151,936)")
    parser.add_argument(
        "--rule",
        action="append",
        help="rule spec, repeatable (default: sps, cactus, cactus-exact, frontier)",
    )
    parser.add_argument(
        "--workload",
        action="append",
        metavar="BxKxV",
        help="workload, repeatable (e.g. 64x10x151936); overrides --batch, -k, --vocab",
    )
    parser.add_argument(
        "--goals",
        action="store_true",
        help="the goal workloads 64x10x151936, 1x5x49152, 8x5x49152 (plus frontier δ=0.2)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="best-of repeats (default 3)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, help="CPU threads for torch (default: torch's choice)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")


def _timer(device):
    """best_seconds with CUDA synchronised around each call on a GPU."""
    import torch

    synchronize = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    return lambda function, repeats: best_seconds(function, repeats, synchronize)


def copy_bandwidth(device, repeats: int, size_bytes: int = 1 << 28) -> float:
    """Bytes per second moved by a plain device copy (read + write counted)."""
    import torch

    source = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    target.copy_(source)  # warm-up
    seconds = _timer(device)(lambda: target.copy_(source), max(repeats, 3))
    return 2 * size_bytes / seconds


def make_block(batch: int, steps: int, vocab: int, seed: int, device):
    """Target/draft float32 rows, drafts sampled from the draft rows, and uniforms."""
    import torch

    from cactus_theory import sampler

    generator = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(batch, steps + 1, vocab, generator=generator, device=device) * 3.0
    target = torch.softmax(logits, dim=-1)
    noise = torch.randn(batch, steps, vocab, generator=generator, device=device)
    draft = torch.softmax(logits[:, :steps] + noise, dim=-1)
    del logits, noise
    uniforms = torch.rand(batch * steps, generator=generator, device=device)
    ids = sampler.inverse_cdf(draft.reshape(-1, vocab), uniforms).reshape(batch, steps)
    accept_u = torch.rand(batch, steps, generator=generator, device=device, dtype=torch.float64)
    sample_u = torch.rand(batch, generator=generator, device=device, dtype=torch.float64)
    return target, draft, ids, (accept_u, sample_u)


def needed_bytes(rule: rules.Rule, batch: int, steps: int, vocab: int) -> int:
    """Bytes of the rows the rule must read at least once (float32)."""
    from cactus_theory.sampler.rules import TorchDecisionRule, for_rule

    adapter = for_rule(rule)
    if not adapter.reads_rows:
        rows = 2 * batch
    elif isinstance(adapter, TorchDecisionRule):
        rows = batch * (steps + 1)
    else:
        rows = batch * (2 * steps + 1)
    return 4 * (rows * vocab + 2 * batch * steps)


def run(args: argparse.Namespace) -> int:
    if args.json:
        check_writable("json", args.json)
    from cactus_theory.cli.decode import device_from_args, set_threads

    for name in ("batch", "k", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name}: must be >= 1, got {getattr(args, name)}")
    if args.vocab < 2:
        raise ValueError(f"vocab: must be >= 2, got {args.vocab}")
    if args.goals:
        workloads = list(GOAL_WORKLOADS)
    elif args.workload:
        workloads = [parse_workload(text) for text in args.workload]
    else:
        workloads = [(args.batch, args.k, args.vocab)]
    specs = list(args.rule or DEFAULT_RULES)
    if args.goals and not args.rule:
        specs += GOAL_EXTRA_RULES
    chosen = [rules.parse(spec) for spec in specs]
    set_threads(args.threads)
    device = device_from_args(args.device)
    bandwidth = copy_bandwidth(device, args.repeats)
    results = [
        run_workload(batch, steps, vocab, chosen, bandwidth, device, args)
        for batch, steps, vocab in workloads
    ]
    if len(results) > 1:
        print_summary(results)
    if args.json:
        payload = {
            "bandwidth_bytes_per_s": bandwidth,
            "rows": [row for result in results for row in result["rows"]],
            "workloads": results,
        }
        atomic_write_json(args.json, payload, indent=2)
    return 0


def run_workload(
    batch: int, steps: int, vocab: int, chosen: list, bandwidth: float, device, args
) -> dict:
    """Time every rule on one workload and print its table; returns its rows."""
    timer = _timer(device)
    target, draft, ids, uniforms = make_block(batch, steps, vocab, args.seed, device)
    all_bytes = 4 * target.numel() + 4 * draft.numel()
    print(
        f"B={batch}, k={steps}, V={vocab:,}, float32 on {device}; "
        f"plain-copy bandwidth {bandwidth / 1e9:.1f} GB/s; inputs {all_bytes / 1e6:,.0f} MB"
    )
    header = (
        f"{'rule':<24} {'ours ms':>9} {'checked':>9} {'dense ms':>9} {'floor ms':>9} "
        f"{'dense/ours':>10} {'ours/floor':>10} {'ours/all-rows floor':>19}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for rule in chosen:
        row = _time_rule(rule, (target, draft, ids, uniforms), timer, bandwidth, all_bytes, args)
        rows.append(row)
        _print_row(row)
    reference_label = rules.parse(REFERENCE_RULE).label
    base = next((row["ours_s"] for row in rows if row["rule"] == reference_label), None)
    for row in rows:
        row["ours_over_cactus"] = None if base is None else row["ours_s"] / base
    print(
        "ours = verify(check=False); checked = verify(check=True); dense = h materialised "
        "over [B, k, V]; floor = bytes the rule must read / copy bandwidth\n"
    )
    return {"batch": batch, "k": steps, "vocab": vocab, "rows": rows}


def _time_rule(rule, block: tuple, timer, bandwidth: float, all_bytes: int, args) -> dict:
    """One rule on one workload (``block``: target [B, k+1, V], draft [B, k, V], ids,
    uniforms): ours with and without checks, the dense path (checked to agree), the floors."""
    import torch

    from cactus_theory import sampler

    target, draft, ids, uniforms = block
    batch, steps, vocab = draft.shape
    fast = partial(sampler.verify, target, draft, ids, rule, uniforms=uniforms, check=False)
    checked = partial(sampler.verify, target, draft, ids, rule, uniforms=uniforms)
    started = time.perf_counter()
    expected = fast()  # warm-up, and the tokens the dense path must reproduce
    # A slow rule on a slow device (the frontier on CPU) is timed once.
    repeats = 1 if time.perf_counter() - started > 2.0 else args.repeats
    ours = timer(fast, repeats)
    ours_checked = timer(checked, repeats)
    dense = None
    if rules.exact_family(rule) in ("target", "branch"):  # the dense path verifies against h
        reference = partial(sampler.verify_dense, target, draft, ids, rule, uniforms)
        if not torch.equal(expected[0], reference()[0]):
            raise RuntimeError(f"dense and fast paths disagree for {rule.label}")
        dense = timer(reference, repeats)
    floor = needed_bytes(rule, batch, steps, vocab) / bandwidth
    floor_all = all_bytes / bandwidth
    row = {
        "rule": rule.label,
        "workload": f"{batch}x{steps}x{vocab}",
        "ours_s": ours,
        "ours_checked_s": ours_checked,
        "dense_s": dense,
        "floor_needed_s": floor,
        "floor_all_rows_s": floor_all,
        "dense_over_ours": None if dense is None else dense / ours,
        "ours_over_floor": ours / floor,
        "ours_over_all_rows_floor": ours / floor_all,
    }
    return row


def _print_row(row: dict) -> None:
    """The rule's line of the workload table."""
    ours, dense, floor = row["ours_s"], row["dense_s"], row["floor_needed_s"]
    dense_text = "-" if dense is None else f"{1e3 * dense:9.2f}"
    ratio_text = "-" if dense is None else f"{dense / ours:9.1f}x"
    print(
        f"{row['rule']:<24} {1e3 * ours:9.2f} {1e3 * row['ours_checked_s']:9.2f} {dense_text:>9} "
        f"{1e3 * floor:9.3f} {ratio_text:>10} {ours / floor:9.1f}x "
        f"{row['ours_over_all_rows_floor']:18.2f}x",
        flush=True,
    )


def print_summary(results: list[dict]) -> None:
    """One table: per workload and rule, ours, ours / floor, dense / ours, ours / cactus."""
    header = (
        f"{'workload':<16} {'rule':<24} {'ours ms':>9} {'ours/floor':>10} {'dense/ours':>10} "
        f"{'ours/cactus':>11}"
    )
    print("summary (one run)")
    print(header)
    print("-" * len(header))
    for result in results:
        for row in result["rows"]:
            dense = "-" if row["dense_over_ours"] is None else f"{row['dense_over_ours']:.1f}x"
            versus = "-" if row["ours_over_cactus"] is None else f"{row['ours_over_cactus']:.2f}x"
            print(
                f"{row['workload']:<16} {row['rule']:<24} {1e3 * row['ours_s']:9.2f} "
                f"{row['ours_over_floor']:9.1f}x {dense:>10} {versus:>11}"
            )
