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


@pytest.fixture(scope="session")
def small_stdlib_pair(tmp_path_factory):
    """(verifier_dir, draft_dir, prompts_file) of a small pair trained by
    ``cactus_theory.real.train_pair`` (what ``cactus train-pair`` runs) on the standard library's
    ``email`` package: the same kind of checkpoint as the stdlib pair (Llama + its BPE tokenizer, so
    a server can take text), small enough to train in well under a minute (vocabulary 512, head_dim
    32)."""
    import sysconfig
    from pathlib import Path

    from cactus_theory.real import train_pair
    from cactus_theory.real.train_pair import ModelSpec, PairSettings

    root = Path(sysconfig.get_paths()["stdlib"]) / "email"
    settings = PairSettings(
        vocab_size=512,
        context=64,
        batch_size=8,
        verifier=ModelSpec(64, 2, 2, 128),
        draft=ModelSpec(64, 1, 2, 64),
        verifier_steps=40,
        draft_steps=20,
        eval_windows=4,
        num_prompts=16,
        prompt_chars=120,
        checkpoint_every=1000,
        corpus_root=str(root),
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CACTUS_CACHE", str(tmp_path_factory.mktemp("cache")))
        manifest = train_pair.train(settings, progress=False)
    return manifest["verifier"], manifest["draft"], manifest["prompts"]
