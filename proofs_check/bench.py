"""``cactus bench solvers``: the fast solvers against cvxpy on the same instances.

For every cactus-exact divergence and for frontier it draws Dirichlet(1) (target, draft)
pairs at one vocabulary size and measures, side by side in one run:

- fast: ``law.acceptance`` of the rule over the whole batch (closed forms, feasible-side
  roots, the frontier solver), best of ``--repeats``, divided by the batch size;
- cvxpy, warm: the same acceptance from cvxpy solutions (one per-branch problem per drafted
  token, or one output-law problem per pair) on the first ``--cvxpy-instances`` pairs,
  with each problem compiled once (DPP) so only the solves are timed: cvxpy at its fastest;
- cvxpy, cold: the same on ``--cold-instances`` pairs with the problems built and compiled
  again for every pair, as a script that calls cvxpy per instance would.

It reports microseconds per instance, both speed ratios, and the largest |acceptance
difference| on the pairs cvxpy solved (against cvxpy's own optimal values).
"""

from __future__ import annotations

import argparse

import numpy as np

from cactus_theory import law, rules
from cactus_theory.util.files import atomic_write_json, check_writable
from cactus_theory.util.timing import best_seconds, timed
from proofs_check import formulations, instances


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--instances", type=int, default=10_000, help="pairs timed (fast)")
    parser.add_argument("--cvxpy-instances", type=int, default=40, help="pairs solved by cvxpy")
    parser.add_argument(
        "--cold-instances", type=int, default=5, help="pairs solved by freshly built problems"
    )
    parser.add_argument("--vocab", type=int, default=6, help="vocabulary size V")
    parser.add_argument("--delta", type=float, default=0.1, help="budget δ")
    parser.add_argument("--repeats", type=int, default=3, help="best-of repeats (fast side)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")


def _cvxpy_acceptance(rule: rules.Rule, target: np.ndarray, draft: np.ndarray) -> float:
    delta = rule.params()["delta"]
    if rule.name == "frontier":
        return formulations.solve_output_law(target, draft, delta).value
    divergence = getattr(rule, "divergence", "kl")
    total = 0.0
    for token in np.flatnonzero(draft > 0):
        raised = formulations.solve_branch(target, int(token), delta, divergence).value
        total += min(draft[token], raised)
    return total


def _cold(rule: rules.Rule, target: np.ndarray, draft: np.ndarray) -> float:
    formulations.clear_compiled()
    return _cvxpy_acceptance(rule, target, draft)


def measure(
    rule: rules.Rule, target: np.ndarray, draft: np.ndarray, solved: int, cold: int, repeats: int
) -> dict:
    """One benchmark row: fast and cvxpy time per instance, ratios, max |Δacceptance|."""
    fast = law.acceptance(rule, target, draft)
    fast_time = best_seconds(lambda: law.acceptance(rule, target, draft), repeats)
    _, cold_time = timed(lambda: [_cold(rule, target[i], draft[i]) for i in range(cold)])
    _cvxpy_acceptance(rule, target[0], draft[0])  # compiled outside the warm timing
    reference, warm_time = timed(
        lambda: [_cvxpy_acceptance(rule, target[i], draft[i]) for i in range(solved)]
    )
    fast_per = fast_time / target.shape[0]
    warm_per = warm_time / solved
    cold_per = cold_time / max(cold, 1)
    return {
        "rule": rules.spec_of(rule),
        "fast_us_per_instance": fast_per * 1e6,
        "cvxpy_warm_us_per_instance": warm_per * 1e6,
        "cvxpy_cold_us_per_instance": cold_per * 1e6,
        "speed_ratio_warm": warm_per / fast_per,
        "speed_ratio_cold": cold_per / fast_per,
        "max_abs_delta_acceptance": float(np.max(np.abs(np.asarray(fast[:solved]) - reference))),
        "instances": int(target.shape[0]),
        "cvxpy_instances": int(solved),
    }


def run(args: argparse.Namespace) -> int:
    if args.json:
        check_writable("json", args.json)
    for name in ("instances", "cvxpy_instances", "cold_instances", "vocab", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    if max(args.cvxpy_instances, args.cold_instances) > args.instances:
        raise ValueError(
            "cvxpy-instances: --cvxpy-instances and --cold-instances must not exceed --instances"
        )
    if not args.delta > 0:
        raise ValueError(f"delta: must be > 0, got {args.delta}")
    rng = np.random.default_rng(args.seed)
    batch = instances.sample("dirichlet-1", rng, args.instances, args.vocab)
    specs = [
        f"cactus-exact:delta={args.delta},divergence={name}"
        for name in formulations.BRANCH_DIVERGENCES
    ] + [f"frontier:delta={args.delta}"]
    rows = []
    print(
        f"V = {args.vocab}, δ = {args.delta}, Dirichlet(1) pairs: {args.instances} fast, "
        f"{args.cvxpy_instances} cvxpy warm (compiled once), {args.cold_instances} cvxpy cold"
    )
    print(
        f"{'rule':<44} {'fast µs':>9} {'warm µs':>10} {'cold µs':>10} "
        f"{'ratio warm':>11} {'ratio cold':>11} {'max |Δacc|':>11}"
    )
    for spec in specs:
        rule = rules.parse(spec)
        found = measure(
            rule,
            batch.target,
            batch.draft,
            args.cvxpy_instances,
            args.cold_instances,
            args.repeats,
        )
        rows.append(found)
        print(
            f"{spec:<44} {found['fast_us_per_instance']:>9.3f} "
            f"{found['cvxpy_warm_us_per_instance']:>10.0f} "
            f"{found['cvxpy_cold_us_per_instance']:>10.0f} {found['speed_ratio_warm']:>11.0f} "
            f"{found['speed_ratio_cold']:>11.0f} {found['max_abs_delta_acceptance']:>11.2e}"
        )
    warm = min(row["speed_ratio_warm"] for row in rows)
    cold = min(row["speed_ratio_cold"] for row in rows)
    worst = max(row["max_abs_delta_acceptance"] for row in rows)
    print(
        f"smallest speed ratio: {warm:.0f}x against warm cvxpy, {cold:.0f}x against cold cvxpy "
        f"(target >= 1e4); largest |Δacceptance| {worst:.2e} (target <= 1e-6)"
    )
    if args.json:
        atomic_write_json(args.json, rows, indent=2)
    return 0
