"""Tiny random causal LMs of many ``transformers`` families, built from configs (no
downloads), each with and without a sliding window where its config has one."""

import torch
import transformers
from torch_tiny_models import DEVICE

COMMON = dict(
    vocab_size=97,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=256,
)
#: A window shorter than the prompts plus the generation, so it really cuts.
WINDOW = 4


def config(name: str, window: int | None):
    """The config of family ``name``; ``window`` sets its sliding window (None: none)."""
    kv = dict(num_key_value_heads=2, **COMMON)
    slide = dict(use_sliding_window=window is not None, sliding_window=window or 4096)
    if name == "llama":
        return transformers.LlamaConfig(**kv)
    if name == "qwen2":
        return transformers.Qwen2Config(max_window_layers=0, **slide, **kv)
    if name == "qwen3":
        return transformers.Qwen3Config(head_dim=8, max_window_layers=0, **slide, **kv)
    if name == "mistral":
        return transformers.MistralConfig(sliding_window=window, **kv)
    if name == "gemma2":  # alternating sliding and global layers
        return transformers.Gemma2Config(head_dim=8, sliding_window=window or 4096, **kv)
    if name == "gemma3":
        return transformers.Gemma3TextConfig(head_dim=8, sliding_window=window or 4096, **kv)
    if name == "phi3":
        return transformers.Phi3Config(sliding_window=window, pad_token_id=0, **kv)
    if name == "gpt2":
        return transformers.GPT2Config(
            vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=256
        )
    if name == "gpt_neox":
        return transformers.GPTNeoXConfig(**COMMON)
    if name == "opt":
        return transformers.OPTConfig(
            vocab_size=97,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            ffn_dim=64,
            max_position_embeddings=256,
            word_embed_proj_dim=32,
            pad_token_id=1,
        )
    if name == "falcon":
        return transformers.FalconConfig(
            vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4
        )
    if name == "olmo2":
        return transformers.Olmo2Config(**kv)
    if name == "stablelm":
        return transformers.StableLmConfig(**kv)
    if name == "mixtral":  # mixture of experts (eager experts: float64 has no grouped matmul)
        return transformers.MixtralConfig(
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=window,
            experts_implementation="eager",
            **kv,
        )
    raise KeyError(name)


#: (family, window) cases: every family without a window, and with one where it has one.
CASES = [
    ("llama", None),
    ("qwen2", None),
    ("qwen2", WINDOW),
    ("qwen3", None),
    ("qwen3", WINDOW),
    ("mistral", None),
    ("mistral", WINDOW),
    ("gemma2", None),
    ("gemma2", WINDOW),
    ("gemma3", None),
    ("gemma3", WINDOW),
    ("phi3", None),
    ("phi3", WINDOW),
    ("gpt2", None),
    ("gpt_neox", None),
    ("opt", None),
    ("falcon", None),
    ("olmo2", None),
    ("stablelm", None),
    ("mixtral", None),
    ("mixtral", WINDOW),
]
#: Gemma 2 gives NaN for padded rows in float64 (its softcapped eager attention), so it
#: runs in float32; every other family in float64 (batched and alone then agree to ~1e-15).
FLOAT32 = {"gemma2"}


def build(name: str, window: int | None, seed: int = 0):
    """A random model of family ``name`` with no BOS/EOS ids (greedy runs to the end)."""
    torch.manual_seed(seed)
    cfg = config(name, window)
    cfg.bos_token_id = cfg.eos_token_id = None
    dtype = torch.float32 if name in FLOAT32 else torch.float64
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(DEVICE, dtype).eval()
    model.generation_config.bos_token_id = model.generation_config.eos_token_id = None
    return model
