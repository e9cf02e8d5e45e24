"""The plug-in in a fresh interpreter: the entry point is inert without
``CACTUS_VLLM_RULE``; then a multiprocess engine (vLLM's default: EngineCore and the worker
in their own processes) loads it there, per-request rules travel in
``SamplingParams.extra_args``, and ``metrics.read`` answers through the worker extension.
A user's rule from a module (``rules_modules=``, exported in ``CACTUS_RULES_MODULES``) runs
in the worker processes too."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm.v1.sample.rejection_sampler", reason="vLLM is not installed here")

SCRIPT = """
import json, os, sys
from vllm.plugins import load_general_plugins
from vllm.v1.sample import rejection_sampler

if __name__ == "__main__":
    # Without CACTUS_VLLM_RULE the entry point installs nothing.
    load_general_plugins()
    assert not hasattr(rejection_sampler.rejection_sample, "_cactus_patched"), "active"
    os.environ["CACTUS_VLLM_RULE"] = "sps"  # with it, register() installs the patches
    from cactus_theory.vllm import engine, metrics, plugin
    plugin.register()
    assert rejection_sampler.rejection_sample._cactus_patched
    from vllm.inputs import TokensPrompt

    verifier, draft, user_rules = sys.argv[1], sys.argv[2], sys.argv[3]
    llm = engine.cactus_llm(verifier, draft, rule="sps", k=3, enforce_eager=True,
        dtype="float32", max_model_len=256, skip_tokenizer_init=True, seed=0,
        rules_modules=[user_rules])
    prompts = [TokensPrompt(prompt_token_ids=[5 + i, 17, 33, 40]) for i in range(8)]
    found = {}
    for rule in ("vllm", "cactus:delta=1.0", "test-boost:factor=3.0"):
        params = engine.sampling_params(rule=rule, temperature=1.0, max_tokens=24,
            ignore_eos=True, detokenize=False)
        llm.generate(prompts, params, use_tqdm=False)
        found.update(metrics.read(llm))
        metrics.reset(llm)
    print("RESULT " + json.dumps(found))
"""


def test_inert_entry_point_then_a_multiprocess_engine_with_rules_and_metrics(tiny_pair):
    env = {k: v for k, v in os.environ.items() if k != "CACTUS_VLLM_RULE"}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    user_rules = os.path.join(os.path.dirname(__file__), "user_rules.py")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, *tiny_pair, user_rules],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    found = json.loads(lines[-1][len("RESULT ") :])
    assert set(found) == {"vllm", "cactus:delta=1.0", "test-boost:factor=3.0"}
    boost = found["test-boost:factor=3.0"]
    assert boost["steps"] > 0 and boost["accepted_length"] > found["vllm"]["accepted_length"]
    assert boost["kl_per_token"] > 0
    assert found["cactus:delta=1.0"]["steps"] > 0 and found["vllm"]["steps"] > 0
    assert found["cactus:delta=1.0"]["accepted_length"] > found["vllm"]["accepted_length"]
    assert found["cactus:delta=1.0"]["kl_per_token"] > 0
    from importlib.metadata import entry_points

    names = {point.value for point in entry_points(group="vllm.general_plugins")}
    assert "cactus_theory.vllm.plugin:register" in names
