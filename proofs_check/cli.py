"""``cactus check``: an exact verdict for every claim (also ``python -m proofs_check``).

Prints the claims table (id, statement, verdict, instances, worst case, counterexample),
optionally writes JSON and markdown, and can regenerate the generated block of
``docs/claims.md`` ("What we verified"). The exit code is 1 only when one of our own
guarantees (owner "ours") fails; a paper claim that fails is a finding, reported in the
table. Usage errors exit 2.

``cactus check --rule SPEC`` (repeatable; with ``--rules-module M`` for your own rules)
checks rules instead of claims: ``cactus_theory.testing.check_rule`` on each, a table of
every property with shrunk counterexamples; exit 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CLAIMS_INTRO = """Every claim below is checked by `cactus check` (module `proofs_check/`):
cvxpy solves the constrained problems exactly on small vocabularies (Clarabel for
exponential cones, HiGHS for LPs), independent numpy references enumerate emitted laws, and
scipy searches (differential evolution, Nelder–Mead) look for worst cases. Rows owned by
*ours* are the toolkit's own guarantees: `cactus check` exits non-zero if one fails.
Regenerate this section with `python -m proofs_check {flags}--update-markdown docs/claims.md`."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="small instance counts (under a minute on 2 cores)"
    )
    parser.add_argument("--json", metavar="PATH", help="write the full result as JSON")
    parser.add_argument("--markdown", metavar="PATH", help="write the report as markdown")
    parser.add_argument("--seed", type=int, default=0, help="seed for every instance family")
    parser.add_argument(
        "--update-markdown",
        metavar="PATH",
        help="regenerate the generated claims block (between the proofs_check markers) of "
        "this markdown file from this run, e.g. docs/claims.md",
    )
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="cache finished checks here (default: $CACTUS_CACHE for full runs, none for --quick)",
    )
    parser.add_argument(
        "--only", nargs="+", metavar="CHECK", help="run only these checks (see --list)"
    )
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument(
        "--from-json",
        metavar="PATH",
        help="render a result saved with --json instead of running the checks",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    rule_checks = parser.add_argument_group(
        "rule checks (cactus_theory.testing.check_rule) instead of the claims"
    )
    rule_checks.add_argument(
        "--rule",
        action="append",
        metavar="SPEC",
        help="check this rule's properties (repeatable), e.g. --rule scaled-cactus:delta=1 "
        "with --rules-module my_rules.py; a tree rule (--rule cactus-tree:delta=1) gets the "
        "tree checks",
    )
    rule_checks.add_argument(
        "--examples", type=int, default=60, help="hypothesis draws per property (default 60)"
    )
    rule_checks.add_argument("--max-kl", type=float, help="check KL(emitted law || q) <= this")
    rule_checks.add_argument("--max-tv", type=float, help="check TV(emitted law, q) <= this")
    rule_checks.add_argument(
        "--device", default="cpu", help="device of the torch checks (default cpu)"
    )


def run_rule_checks(args: argparse.Namespace) -> int:
    """``--rule``: check_rule on every spec, printed; 0 when all pass, 1 otherwise."""
    from cactus_theory.testing import CHECKS, TREE_CHECKS, check_rule, parse_any

    chosen = [parse_any(spec) for spec in args.rule]  # bad specs fail before any work
    only = None
    if args.only:
        known = (*CHECKS, *(name for name in TREE_CHECKS if name not in CHECKS))
        unknown = [name for name in args.only if name not in known]
        if unknown:
            raise ValueError(f"only: unknown rule check {unknown[0]!r}; choose from {known}")
        only = args.only
    passed = True
    for rule in chosen:
        kind = TREE_CHECKS if hasattr(rule, "sibling_accepts") else CHECKS
        report = check_rule(
            rule,
            max_kl=args.max_kl,
            max_tv=args.max_tv,
            examples=args.examples,
            seed=args.seed,
            device=args.device,
            only=None if only is None else [name for name in only if name in kind],
        )
        print(report)
        passed &= report.passed
    return 0 if passed else 1


def run(args: argparse.Namespace) -> int:
    if args.seed < 0:
        raise ValueError(f"seed: must be >= 0, got {args.seed}")
    if args.rule:  # rule checks: no claims, no cvxpy
        if args.list:
            from cactus_theory.testing import CHECKS, TREE_CHECKS

            print("\n".join(CHECKS))
            print("tree rules: " + ", ".join(TREE_CHECKS))
            return 0
        return run_rule_checks(args)
    from cactus_theory.util.files import atomic_write_text, check_writable
    from proofs_check import claims, report, runner

    if args.list:
        for name, _ in claims.checks():
            print(name)
        return 0
    # Output paths are checked before the work, so a bad one costs nothing.
    for name in ("json", "markdown"):
        if getattr(args, name):
            check_writable(name, getattr(args, name))
    if args.update_markdown and not Path(args.update_markdown).is_file():
        raise ValueError(f"update_markdown: {args.update_markdown!r} is not a file")
    if args.from_json:
        result = report.read_json(args.from_json)
    else:
        result = runner.run(
            quick=args.quick,
            seed=args.seed,
            progress=not args.no_progress,
            cache_dir=args.cache_dir,
            only=tuple(args.only) if args.only else None,
        )
    print(report.table_text(result))
    if args.json:
        report.write_json(result, args.json)
    if args.markdown:
        atomic_write_text(args.markdown, report.to_markdown(result, heading="##"))
    if args.update_markdown:
        flags = "--quick " if result.get("mode") == "quick" else ""
        intro = CLAIMS_INTRO.format(flags=flags)
        report.update_markdown(
            args.update_markdown, intro + "\n\n" + report.to_markdown(result, heading="###")
        )
    return 0 if result["guarantees_hold"] else 1


def interrupted_message(args: argparse.Namespace) -> str:
    """What an interrupted run kept: true to the caching mode (``--quick`` caches nothing
    unless ``--cache-dir`` is given)."""
    if args.cache_dir is None and args.quick:
        return "interrupted; nothing was cached (--quick without --cache-dir)"
    return "interrupted; finished checks are cached and a rerun resumes"


def main(argv: list[str] | None = None) -> int:
    """``python -m proofs_check``: exit 0 if our guarantees hold, 1 if one fails, 2 for a
    usage error (argparse's own errors exit 2 too), 130 when interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m proofs_check", description="Exact verdict for every claim."
    )
    configure(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ValueError as error:
        print(f"proofs_check: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted_message(args), file=sys.stderr)
        return 130
