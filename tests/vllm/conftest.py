"""Shared pieces of the vLLM tests: the skip reason, tiny random pairs.

Every module here starts with ``pytest.importorskip("vllm", reason=NO_VLLM)``, so the main
suite (no vLLM) skips them with that reason; scripts/test.sh runs them in .venv-vllm.
"""

import copy
import os

import pytest

NO_VLLM = "vLLM is not installed here (scripts/test.sh runs tests/vllm in .venv-vllm)"

# In-process engine, one thread, a small KV cache: what these tests run under.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def save_tiny_pair(folder, vocab=128, seed=0, init=0.1, noise=0.3):
    """A random Llama verifier (head_dim 32, which vLLM's CPU attention supports) and a
    perturbed copy as its draft, saved as Hugging Face folders; returns (verifier, draft)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=128,
        max_position_embeddings=512,
        initializer_range=init,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    verifier = LlamaForCausalLM(config).eval()
    draft = copy.deepcopy(verifier)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for parameter in draft.parameters():
            noise_here = torch.randn(parameter.shape, generator=generator)
            parameter.add_(noise_here * noise * parameter.std().clamp(min=1e-3))
    paths = (str(folder / "verifier"), str(folder / "draft"))
    verifier.save_pretrained(paths[0])
    draft.save_pretrained(paths[1])
    return paths


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """(verifier_dir, draft_dir) of a tiny random pair, vocabulary 128."""
    return save_tiny_pair(tmp_path_factory.mktemp("pair"))
