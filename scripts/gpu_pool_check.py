"""The real pool on CUDA against the CPU (part of scripts/gpu_check.sh).

The stdlib pair's verifier samples continuations of 8 held-out prompts on the CPU
(float32); those same token sequences are then teacher-forced on DEVICE (default cuda) and
the (q, p) rows compared to the CPU's, widened to the whole vocabulary: the largest absolute
difference must stay below 1e-4 (float32 kernels differ in summation order). A second,
uncached pool is built wholly on DEVICE for its positions/s. Prints one JSON line.

    python scripts/gpu_pool_check.py PAIR_DIR [DEVICE]
"""

import json
import sys
import time

import numpy as np
import torch

from cactus_theory.core.processors import PAPER_SETTING
from cactus_theory.decode.runs import Pair, load_setup
from cactus_theory.real import pools

TOLERANCE = 1e-4


def main(pair_dir: str, device: str = "cuda") -> int:
    pair = Pair(f"{pair_dir}/verifier", f"{pair_dir}/draft", f"{pair_dir}/heldout_prompts.jsonl")
    cpu = load_setup(pair, torch.device("cpu"), "float32", num_prompts=8)
    other = load_setup(pair, torch.device(device), "float32", num_prompts=8)
    settings = pools.PoolSettings(positions=400, num_prompts=8, max_new_tokens=64)
    shard = pools.build_shard(cpu, cpu.prompts, settings, 0)
    vocab = pools._vocab(cpu)
    target, draft, ids = pools.rows_for_sequences(
        other.verifier,
        other.draft,
        torch.from_numpy(shard["sequences"]).to(device),
        torch.from_numpy(shard["prompt_mask"]).to(device),
        torch.from_numpy(shard["num_generated"]).to(device),
        settings.sampling,
        vocab,
    )
    here = pools._widen(
        shard["target"], shard["draft"], None if shard["dense"] else shard["ids"], vocab
    )
    there = pools._widen(target, draft, ids, vocab)
    target_gap = float(np.abs(here[0] - there[0]).max())
    draft_gap = float(np.abs(here[1] - there[1]).max())
    supports = int(((here[0] > 0) != (there[0] > 0)).any(axis=1).sum())
    started = time.perf_counter()
    pool = pools.build_pool(other, settings, None, device=device, dtype="float32", progress=False)
    seconds = time.perf_counter() - started
    report = {
        "device": device,
        "positions_compared": int(here[0].shape[0]),
        "max_abs_target_diff": target_gap,
        "max_abs_draft_diff": draft_gap,
        "rows_with_other_support": supports,
        "pool_positions": len(pool),
        "pool_positions_per_second": len(pool) / seconds,
        "sampling": PAPER_SETTING.label,
    }
    print(json.dumps(report))
    return 0 if max(target_gap, draft_gap) <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
