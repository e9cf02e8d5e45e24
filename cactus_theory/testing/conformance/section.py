"""The conformance section of ``cactus report``: a quick run on the engines present.

``run(out)`` runs the suite, in this process on one torch thread, on the main variant of
every engine installed in the report's environment (transformers' speculative sampling
with assisted generation end to end; our torch sampler with SpS; vLLM and the plug-in when
vLLM is importable here, which in the main environment it is not), with ``SECTION``'s
reduced draws, whose power each law test states (about TV 0.05 per test at 20,000 draws,
against 0.004 for ``cactus conform``'s 10^6). It writes ``out/conformance.json``:

    {"cpu": "...", "budget": {"draws", "examples", "seed"}, "seconds": ...,
     "engines": {engine: [report.to_dict(), ...]}, "missing": {engine: reason},
     "matrix": {"properties", "columns", "cells"}, "acceptance": [rows]}

which ``paper_figs.page_conform.conformance_section`` renders. Measured on the 2-core AMD
EPYC this was written on (shared, load about 6): 53 s of CPU in one process (transformers
with assisted generation nearly all of it; our sampler 6 s), 178 s of wall time under that
load. ``python -m
cactus_theory.testing.conformance.section --out DIR`` runs it as a child process.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from cactus_theory.util.files import atomic_write_json

OUTPUT = "conformance.json"
#: (engine, variant key) of the section: each engine's main variant.
SECTION_VARIANTS = (
    ("transformers", "sps"),
    ("cactus-torch", "sps"),
    ("vllm", "stock"),
    ("vllm", "fixed"),
    ("cactus-vllm", "sps"),
)


def run(out: Path | str, *, draws: int = 20_000, examples: int = 15, seed: int = 0) -> dict:
    """Run the section's quick suite and write ``out/conformance.json``; returns its data."""
    import torch

    from cactus_theory.testing.conformance.adapters import Variant, build, missing
    from cactus_theory.testing.conformance.harness import conform
    from cactus_theory.testing.conformance.run import acceptance_rows, cpu_name, property_matrix

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    started = time.perf_counter()
    engines: dict[str, list[dict]] = {}
    absent: dict[str, str] = {}
    reports = []
    try:
        for engine, key in SECTION_VARIANTS:
            reason = absent.get(engine) or missing(engine)
            if reason is not None:
                absent[engine] = reason
                continue
            report = conform(build(Variant(engine, key)), draws=draws, examples=examples, seed=seed)
            reports.append(report)
            engines.setdefault(engine, []).append(report.to_dict())
    finally:
        torch.set_num_threads(previous)
    data = {
        "cpu": cpu_name(),
        "budget": {"draws": draws, "examples": examples, "seed": seed},
        "seconds": round(time.perf_counter() - started, 1),
        "engines": engines,
        "missing": absent,
        "matrix": property_matrix(reports),
        "acceptance": acceptance_rows(reports),
    }
    atomic_write_json(Path(out) / OUTPUT, data)
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The conformance section of cactus report.")
    parser.add_argument("--out", required=True, help="folder for conformance.json")
    parser.add_argument("--draws", type=int, default=20_000)
    parser.add_argument("--examples", type=int, default=15)
    args = parser.parse_args(argv)
    data = run(args.out, draws=args.draws, examples=args.examples)
    print(f"conformance section: {len(data['engines'])} engines in {data['seconds']} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    from cactus_theory.util.process import exit_with_parent

    exit_with_parent()  # a child of `cactus report` must not outlive it
    raise SystemExit(main())
