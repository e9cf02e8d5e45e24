"""A tiny random verifier/draft pair that vLLM's CPU backend loads (no download, no tokenizer).

The verifier is a random 2-layer Llama (hidden size 64, head_dim 32, a size vLLM's CPU
attention supports); the draft is a copy with relative Gaussian noise on every weight, so
the two agree often but not always. The folders hold weights and configuration only (no
tokenizer: engines load them with ``skip_tokenizer_init=True`` and token-id prompts). Used
by tests/vllm (vocabulary 128) and by ``cactus bench vllm --tiny`` (vocabulary 512, init
0.3, noise 0.1); the bench's default pair is the trained stdlib pair, not this one.
"""

from __future__ import annotations

import copy
from pathlib import Path


def save_tiny_pair(
    folder: str | Path,
    vocab: int = 128,
    seed: int = 0,
    init: float = 0.1,
    noise: float = 0.3,
) -> tuple[str, str]:
    """Write ``folder/verifier`` and ``folder/draft`` (Hugging Face folders, float32).

    Parameters
    ----------
    folder : where to write (created if missing).
    vocab : vocabulary size (>= 8).
    seed : seed of the weights and of the draft's noise.
    init : initializer range of the weights (larger: peakier laws).
    noise : relative noise on the draft's weights (larger: lower acceptance).

    Returns (verifier_dir, draft_dir).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if vocab < 8:
        raise ValueError(f"vocab: expected at least 8 tokens, got {vocab}")
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=128,
        max_position_embeddings=1024,
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
    root = Path(folder)
    paths = (str(root / "verifier"), str(root / "draft"))
    verifier.save_pretrained(paths[0])
    draft.save_pretrained(paths[1])
    return paths
