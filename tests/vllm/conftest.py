"""Shared pieces of the vLLM tests: the skip reason, tiny random pairs.

Every module here starts with ``pytest.importorskip("vllm", reason=...)``, so the main
suite (no vLLM) skips them with that reason; scripts/test.sh runs them in .venv-vllm.
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
