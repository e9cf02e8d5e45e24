"""Tiny random causal LMs built from configs (no downloads) for the decoder tests.

``CACTUS_TEST_DEVICE`` (default cpu) selects the device, so scripts/gpu_check.sh runs the
same tests on CUDA.
"""

import copy
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

DEVICE = torch.device(os.environ.get("CACTUS_TEST_DEVICE", "cpu"))


def llama(seed=0, vocab=97, layers=2, hidden=32, dtype=torch.float64, init=0.02):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=512,
        initializer_range=init,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(config).to(DEVICE, dtype).eval()


def gpt2(seed=0, vocab=97, layers=2, hidden=32, dtype=torch.float64):
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab,
        n_embd=hidden,
        n_layer=layers,
        n_head=4,
        n_positions=512,
        bos_token_id=None,
        eos_token_id=None,
    )
    return GPT2LMHeadModel(config).to(DEVICE, dtype).eval()


def perturbed(model, scale=0.1, seed=1):
    """A copy of ``model`` with relative Gaussian noise on every weight: a draft that agrees
    with the verifier often but not always."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in draft.parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
            parameter.add_(noise.to(parameter.device) * scale * parameter.std().clamp(min=1e-3))
    return draft


def left_padded_prompts(batch=5, length=7, vocab=97, seed=5, pads=(0, 3, 1, 0, 6)):
    """Random prompts, row b left-padded with pads[b] zeros (mask 0)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, length), generator=generator)
    mask = torch.ones_like(ids)
    for row, count in enumerate(pads[:batch]):
        mask[row, :count] = 0
    ids[mask == 0] = 0
    return ids.to(DEVICE), mask.to(DEVICE)


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chatml_tokenizer():
    """A character-level tokenizer (99 tokens: <pad>, <|im_start|>, <|im_end|>, then
    printable ASCII and newline) with a ChatML chat template; EOS is <|im_end|>."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    specials = ["<pad>", "<|im_start|>", "<|im_end|>"]
    vocab = {token: index for index, token in enumerate(specials + chars)}
    model = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    model.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    model.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=model, eos_token="<|im_end|>", pad_token="<pad>"
    )
    fast.chat_template = CHATML
    return fast
