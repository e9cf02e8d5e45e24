"""``cactus report [--quick] [--out DIR] [--seed N]``: the main job (see paper_figs.report)."""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller sweeps and the claims check's quick mode (about a minute on 2 cores)",
    )
    parser.add_argument(
        "--out",
        default="cactus-report",
        metavar="DIR",
        help="output folder for report.html, the CSVs, figures and the cell cache "
        "(default: %(default)s); rerunning into the same folder resumes from its cache",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of every random draw")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def run(args: argparse.Namespace) -> int:
    from paper_figs import report

    result = report.build(args.out, quick=args.quick, seed=args.seed, progress=not args.no_progress)
    print(f"wrote {result.html} ({result.timings['total']:.1f} s)")
    return 0


def interrupted_message(args: argparse.Namespace) -> str:
    return (
        f"interrupted; finished sweep cells and claims checks are cached in {args.out}, "
        "and a rerun into the same folder resumes"
    )
