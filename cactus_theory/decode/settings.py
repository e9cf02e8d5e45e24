"""The settings both generate functions share, and their validation.

``GenerationSettings`` holds what ``speculative_generate`` and ``autoregressive_generate``
take alike (length, processors, EOS and padding, randomness, the meter, the two hooks);
``prepare`` checks it with the models and the prompts (a ValueError naming the argument)
and resolves the defaults into a ``Prepared``: what the loops read.

The hooks (what ``decode.hf`` maps transformers' stopping criteria and streamer onto):

- ``stopping(row, generated) -> bool``, called after every committed token with the
  original row index and that row's generated tokens so far (a list of ids, the new
  token last); True finishes the row there, the token kept (as EOS does);
- ``streamer``, an object with ``put(ids)`` and ``end()`` (transformers' ``BaseStreamer``):
  it gets the prompts [B, P] first, then each column of generated tokens [B] once every
  row has it (``pad_token_id`` for rows already finished), then ``end()``: the calls
  ``generate()`` makes, in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from cactus_theory.core.processors import SamplingSettings
from cactus_theory.decode.checks import (
    check_context,
    check_generator,
    check_hooks,
    check_inputs,
    eos_ids,
    model_device,
    resolve_pad_id,
    sampling_settings,
    vocab_size,
)

Tensor = torch.Tensor


@dataclass(frozen=True)
class GenerationSettings:
    """The keywords both generate functions take (their docstrings say what each means)."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    generator: torch.Generator | None = None
    stopping: Callable[[int, list[int]], bool] | None = None
    streamer: object | None = None  # put(ids), end(): transformers' BaseStreamer
    meter: bool = True  # the ``divergence`` keyword: run the divergence meter

    @classmethod
    def from_keywords(cls, keywords: dict, meter: bool = True) -> GenerationSettings:
        """The settings of generate keywords (``max_new_tokens=...``); a ValueError names a
        keyword that is not one of them."""
        names = [item.name for item in fields(cls) if item.name != "meter"]
        for name in keywords:
            if name not in names:
                raise ValueError(f"{name}: not a generate keyword (those are {', '.join(names)})")
        return cls(**keywords, meter=meter)


@dataclass
class Prepared:
    """Validated inputs with every default resolved."""

    input_ids: Tensor  # [B, P]
    mask: Tensor  # [B, P] left-padding mask
    processors: SamplingSettings  # temperature, top-k, top-p
    eos: list[int]
    pad_id: int
    device: torch.device
    vocab: int
    max_new_tokens: int
    generator: torch.Generator | None
    meter: bool
    stopping: Callable[[int, list[int]], bool] | None = None
    streamer: object | None = None

    @property
    def batch(self) -> int:
        return self.input_ids.shape[0]


def prepare(verifier, draft, input_ids, attention_mask, settings: GenerationSettings) -> Prepared:
    """Validate every argument (ValueError naming it) and resolve the defaults: EOS and
    padding from the verifier's generation config, the mask (all 1 by default)."""
    processors = sampling_settings(settings.temperature, settings.top_k, settings.top_p)
    check_generator(settings.generator)
    check_hooks(settings.stopping, settings.streamer)
    device = model_device(verifier, "verifier")
    vocab = vocab_size(verifier)
    if draft is not None:
        if model_device(draft, "draft") != device:
            raise ValueError(f"draft: on {model_device(draft, 'draft')}, verifier on {device}")
        if vocab_size(draft) != vocab:
            raise ValueError(
                f"draft: vocabulary size {vocab_size(draft)} differs from the verifier's {vocab}"
            )
    max_new_tokens = settings.max_new_tokens
    ids, mask = check_inputs(input_ids, attention_mask, max_new_tokens, vocab, device)
    for name, model in (("verifier", verifier), ("draft", draft)):
        if model is not None:
            check_context(name, model, mask, max_new_tokens)
    config = getattr(verifier, "generation_config", None)
    eos_token_id, pad_token_id = settings.eos_token_id, settings.pad_token_id
    if eos_token_id is None:
        eos_token_id = getattr(config, "eos_token_id", None)
    eos = eos_ids(eos_token_id, vocab)
    if pad_token_id is None:
        pad_token_id = getattr(config, "pad_token_id", None)
    pad_id = resolve_pad_id(pad_token_id, eos, vocab)
    return Prepared(
        ids, mask, processors, eos, pad_id, device, vocab, max_new_tokens, settings.generator,
        settings.meter, settings.stopping, settings.streamer,
    )  # fmt: skip
