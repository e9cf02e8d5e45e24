"""The report's real-model section: the paper's decoding table on the default real pair,
one table per evaluation set.

``run(out, quick)`` builds the default pair (``cactus_theory.real.smollm``: SmolLM2-135M-Instruct
and its feature draft) if needed and, for each set of ``DATASETS`` (``cactus_theory.real.datasets``:
MT-Bench's first turns, HumanEval, the held-out prompts), decodes the set's first prompts with
``cactus_theory.real.decode_table`` (cached per row and round under ``out/real-model/``, so a rerun
resumes), then writes ``out/real_model.json`` as ``{"datasets": {name: table}}``. The report's run
uses far fewer prompts and tokens than ``cactus bench decode`` (its speed-ups are single rounds,
without an interval); ``--quick`` fewer still. When the pair or a set cannot be had (no torch, no
package index), the JSON says why and the report shows that.
"""

from __future__ import annotations

from pathlib import Path

from cactus_theory.real.decode_table import PAPER_KS, PAPER_RULES, TableSettings
from cactus_theory.util.files import atomic_write_json

OUTPUT = "real_model.json"
#: The evaluation sets of the full report, in order (the first one is figure 8's).
DATASETS = ("mt-bench", "humaneval", "heldout")
QUICK_DATASETS = ("mt-bench",)
#: The full report's tables: every rule and k of the paper, on fewer prompts and tokens
#: than the bench (a few minutes on 2 cores, so the main job stays within 15 minutes).
FULL = TableSettings(rules=PAPER_RULES, ks=PAPER_KS, num_prompts=2, max_new_tokens=32, repeats=1)
QUICK = TableSettings(
    rules=("sps", "cactus:delta=1.0", "frontier:delta=1.0"),
    ks=(3,),
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
        from cactus_theory.real import datasets, decode_table, smollm

        previous = torch.get_num_threads()
        torch.set_num_threads(THREADS)
        tables = {}
        try:
            chosen = pair or smollm.ensure_pair(say)
            setup = load_setup(chosen, torch.device("cpu"), DTYPE)
            for name in QUICK_DATASETS if quick else DATASETS:
                setup.prompts = datasets.prompts(name)[: settings.num_prompts]
                table = decode_table.run(
                    setup,
                    settings,
                    out / "real-model",
                    device="cpu",
                    dtype=DTYPE,
                    threads=THREADS,
                    progress=progress,
                )
                table["dtype"], table["threads"], table["dataset"] = DTYPE, THREADS, name
                tables[name] = table
        finally:
            torch.set_num_threads(previous)
        result = {"datasets": tables}
    except (ImportError, ValueError, OSError) as error:
        result = {"unavailable": f"{type(error).__name__}: {error}"}
        say(f"real-model table unavailable: {result['unavailable']}")
    atomic_write_json(out / OUTPUT, result, indent=1)
    return result


def dataset_tables(real_model: dict | None) -> dict:
    """{set name: table} of a ``real_model.json`` ({} when missing or unavailable)."""
    if not real_model or "unavailable" in real_model:
        return {}
    return dict(real_model.get("datasets", {}))
