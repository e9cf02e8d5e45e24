"""``cactus check``: an exact verdict for every claim (also ``python -m proofs_check``).

Prints the claims table (id, statement, verdict, instances, worst case, counterexample),
optionally writes JSON and markdown, and can regenerate the generated block of
``docs/claims.md`` ("What we verified"). The exit code is 1 only when one of our own
guarantees (owner "ours") fails; a paper claim that fails is a finding, reported in the
table. Usage errors exit 2.
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


def run(args: argparse.Namespace) -> int:
    from cactus_theory.util.files import atomic_write_text, check_writable
    from proofs_check import claims, report, runner

    if args.list:
        for name, _ in claims.checks():
            print(name)
        return 0
    if args.seed < 0:
        raise ValueError(f"seed: must be >= 0, got {args.seed}")
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
