"""The report's real-model section: the paper's decoding table on the default real pair.

``run(out, quick)`` builds the default pair (``sims.smollm``: SmolLM2-135M-Instruct and its
feature draft) if needed, decodes the held-out prompts with ``sims.decode_table`` (cached
per row and round under ``out/real-model/``, so a rerun resumes) and writes
``out/real_model.json``. The report's default run uses fewer prompts and tokens than
``cactus bench decode``; ``--quick`` fewer still. When the pair cannot be had (no torch,
no package index), the JSON says why and the report shows that instead of the table.
"""

from __future__ import annotations

from pathlib import Path

from cactus_theory.util.files import atomic_write_json
from sims.decode_table import PAPER_KS, PAPER_RULES, TableSettings

OUTPUT = "real_model.json"
#: The full report's table: every rule and k of the paper, on fewer prompts and tokens than
#: the bench (about 4 minutes on 2 cores, so the main job stays within 20 minutes).
FULL = TableSettings(rules=PAPER_RULES, ks=PAPER_KS, num_prompts=4, max_new_tokens=32, repeats=1)
QUICK = TableSettings(
    rules=("sps", "cactus:delta=1.0", "frontier:delta=1.0"),
    ks=(5,),
    num_prompts=2,
    max_new_tokens=24,
    repeats=1,
)
#: Weights dtype and CPU threads of the report's run (bfloat16 verifies k+1 tokens for
#: about the cost of one on CPUs with bf16 matrix units; one thread is robust on a
#: shared machine).
DTYPE = "bfloat16"
THREADS = 1


def run(out: Path, *, quick: bool, progress: bool = True, pair=None, say=print) -> dict:
    """The table as a dict (also written to ``out/real_model.json``); ``{"unavailable":
    reason}`` when the pair or torch is missing."""
    out = Path(out)
    settings = QUICK if quick else FULL
    try:
        import torch

        from cactus_theory.decode.runs import load_setup
        from sims import decode_table, smollm

        previous = torch.get_num_threads()
        torch.set_num_threads(THREADS)
        try:
            chosen = pair or smollm.ensure_pair(say)
            setup = load_setup(chosen, torch.device("cpu"), DTYPE)
            setup.prompts = setup.prompts[: settings.num_prompts]
            table = decode_table.run(
                setup,
                settings,
                out / "real-model",
                device="cpu",
                dtype=DTYPE,
                threads=THREADS,
                progress=progress,
            )
        finally:
            torch.set_num_threads(previous)
        table["dtype"], table["threads"] = DTYPE, THREADS
    except (ImportError, ValueError, OSError) as error:
        table = {"unavailable": f"{type(error).__name__}: {error}"}
        say(f"real-model table unavailable: {table['unavailable']}")
    atomic_write_json(out / OUTPUT, table, indent=1)
    return table
