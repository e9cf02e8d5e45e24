"""Input checks of the decoder: each failure is a ValueError naming the argument."""

from __future__ import annotations

import torch

from cactus_theory.core import rules as rules_module
from cactus_theory.core.processors import SamplingSettings
from cactus_theory.core.rules.base import Rule

Tensor = torch.Tensor


#: Config attributes that bound a model's positions, by family (the first one present).
CONTEXT_ATTRIBUTES = ("max_position_embeddings", "n_positions", "max_sequence_length", "n_ctx")


def context_length(model) -> int | None:
    """The number of positions ``model`` supports (its text config), or None if unstated."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    for name in CONTEXT_ATTRIBUTES:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_context(name: str, model, mask: Tensor, max_new_tokens: int) -> None:
    """ValueError naming max_new_tokens when a prompt plus max_new_tokens exceeds the
    context of ``model`` (learned positions have no embedding there, rotary ones would
    extrapolate silently)."""
    limit = context_length(model)
    if limit is None:
        return
    longest = int(mask.sum(dim=1).max())
    if longest + max_new_tokens > limit:
        raise ValueError(
            f"max_new_tokens: a prompt of {longest} tokens plus max_new_tokens={max_new_tokens} "
            f"exceeds the {name}'s context of {limit} positions; shorten one of them"
        )


def model_device(model, name: str) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        raise ValueError(f"{name}: expected a transformers causal LM (a torch module)") from None


def vocab_size(model) -> int:
    """The size of the model's output layer (a feature draft's is its verifier's head)."""
    if not hasattr(model, "get_output_embeddings"):
        return int(model.vocab_size)
    embeddings = model.get_output_embeddings()
    if embeddings is not None and hasattr(embeddings, "weight"):
        return int(embeddings.weight.shape[0])
    return int(model.config.vocab_size)


def check_inputs(input_ids, attention_mask, max_new_tokens, vocab, device):
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2:
        raise ValueError("input_ids: expected an integer tensor [B, P]")
    if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids: expected integer token ids, got dtype {input_ids.dtype}")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids: empty batch or prompt, shape {tuple(input_ids.shape)}")
    if bool(((input_ids < 0) | (input_ids >= vocab)).any()):
        raise ValueError(f"input_ids: ids must lie in [0, {vocab})")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        raise ValueError("attention_mask: expected a 0/1 tensor shaped like input_ids")
    mask = attention_mask.to(torch.int64)
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError("attention_mask: values must be 0 or 1")
    # Left padding only: once a row's mask is 1 it stays 1, and the last column is real.
    if bool((mask[:, 1:] < mask[:, :-1]).any()) or not bool(mask[:, -1].all()):
        raise ValueError(
            "attention_mask: prompts must be left-padded (zeros first, then ones to the end)"
        )
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise ValueError(f"max_new_tokens: must be an integer >= 0, got {max_new_tokens!r}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: must be >= 0, got {max_new_tokens}")
    return input_ids.to(device, torch.int64), mask.to(device)


def sampling_settings(temperature, top_k, top_p) -> SamplingSettings:
    return SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p)


def eos_ids(eos_token_id, vocab: int) -> list[int]:
    if eos_token_id is None:
        return []
    values = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab:
            raise ValueError(f"eos_token_id: must be ids in [0, {vocab}), got {eos_token_id!r}")
    return values


def resolve_pad_id(pad_token_id, eos: list[int], vocab: int) -> int:
    if pad_token_id is None:
        return eos[0] if eos else 0
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int):
        raise ValueError(f"pad_token_id: must be an integer id, got {pad_token_id!r}")
    return pad_token_id


def check_generator(generator):
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator: expected a torch.Generator, got {type(generator).__name__}")


def check_hooks(stopping, streamer) -> None:
    """``stopping`` must be callable; ``streamer`` must have ``put`` and ``end``."""
    if stopping is not None and not callable(stopping):
        raise ValueError(f"stopping: expected a callable, got {type(stopping).__name__}")
    if streamer is not None and not all(
        callable(getattr(streamer, name, None)) for name in ("put", "end")
    ):
        raise ValueError(
            f"streamer: expected an object with put() and end() (transformers' BaseStreamer), "
            f"got {type(streamer).__name__}"
        )


def parse_rule(rule: Rule | str) -> Rule:
    """A rule object, or one parsed from a spec such as ``"cactus:delta=1.0"``."""
    if isinstance(rule, Rule):
        return rule
    if not isinstance(rule, str):
        raise ValueError(f"rule: expected a rule or a spec string, got {type(rule).__name__}")
    try:
        return rules_module.parse(rule)
    except ValueError as error:
        message = str(error)
        if message.startswith(("name:", "spec:")):  # about the spec itself, not a parameter
            raise ValueError(f"rule: {message.split(': ', 1)[1]}") from None
        raise
