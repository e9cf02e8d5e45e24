"""Shared pieces of the vLLM tests: the skip reason, tiny random pairs.

Every module here starts with ``pytest.importorskip("vllm.v1.sample.rejection_sampler")``,
so the main suite (no vLLM) skips them with a reason; scripts/test.sh runs them in
.venv-vllm. (A submodule, not plain "vllm": pytest puts tests/ on sys.path, where this
folder is a namespace package named ``vllm`` that a bare ``import vllm`` would find.)
"""

import os

import pytest

# In-process engine, one thread, a small KV cache: what these tests run under.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """(verifier_dir, draft_dir) of a tiny random pair, vocabulary 128."""
    from cactus_theory.vllm.tiny_pair import save_tiny_pair

    return save_tiny_pair(tmp_path_factory.mktemp("pair"))
