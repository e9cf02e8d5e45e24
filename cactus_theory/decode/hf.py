"""``model.generate()`` with a rule: ``cactus_generate``, a decoding method for
transformers' ``custom_generate``.

    from cactus_theory.decode.hf import cactus_generate

    out = model.generate(**inputs, custom_generate=cactus_generate, draft_model=draft,
                         rule="cactus:delta=1.0", k=4, do_sample=True, temperature=0.6,
                         top_k=20, top_p=0.95, max_new_tokens=64)

``generate()`` (transformers 5.17 to 5.x) prepares the inputs, the generation config, the
logits processors and the stopping criteria, then calls ``cactus_generate(model,
input_ids, logits_processor=..., stopping_criteria=..., generation_config=..., **own
keywords, **model_kwargs)``; the keywords the callable declares and ``_sample`` does not
(``draft_model``, ``rule``, ``k``, ``generator``, ``divergence``, ``max_kl``, ``tree``,
``children``) pass through. The loop is ``speculative_generate``'s; this module only translates:

- the processors generate() built become the sampling settings both models see:
  ``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper`` (in that order,
  each at most once; ``do_sample=False`` is greedy, temperature 0); any other processor
  (repetition penalty, min-p, min_new_tokens, bad words, a user's ``logits_processor``,
  ...) is a ValueError naming it: only the verifier would see it, and the rule compares
  the draft's law with the verifier's after the same processors;
- the stopping criteria: ``MaxLengthCriteria`` gives max_new_tokens (max_length − P),
  ``EosTokenCriteria`` the EOS ids (the decoder's own checks); every other criterion
  (``stop_strings``, ``max_time``, the user's ``stopping_criteria``) is called after every
  committed token of a row on that row's sequence so far [1, P + t] (with its left
  padding, as generate() passes it; ``scores`` None, as generate() passes it without
  ``output_scores``), so a row stops at the token where generate() would stop it. One
  difference: without an EOS id generate() does not pad a row that such a criterion
  stopped but goes on decoding it until every row has stopped (``_sample`` pads only
  when an EOS criterion exists); ``cactus_generate`` pads it from the stop on, which is
  what generate() does whenever the model has an EOS id;
- ``pad_token_id`` fills finished rows, as in generate(); ``num_return_sequences`` > 1
  works with sampling (generate() already repeated the rows; each decodes on its own);
- randomness: ``generator=`` (a ``torch.Generator``) or, without it, torch's global
  generator, so ``torch.manual_seed(s)`` makes a call reproducible; the same seed gives
  the same tokens as ``speculative_generate`` with the same settings.

The output is generate()'s: the sequences [B, P + T] (finished rows padded), or with
``return_dict_in_generate=True`` a ``CactusGenerateOutput`` (a ``ModelOutput``) with the
sequences and the decoder's statistics: AL per row, the accepted drafts and drafts per
step, and the divergence meter's exact KL(emitted law ‖ q) per token and per row.

Refused, each a ValueError naming the option: beam search and every mode but greedy and
sampling (``num_beams``, ``penalty_alpha``, ``dola_layers``, ``prompt_lookup_num_tokens``,
``assistant_early_exit``), ``assistant_model`` (the draft is ``draft_model``),
``output_scores``, ``output_logits``, ``output_attentions``, ``output_hidden_states``,
``synced_gpus``, inputs other than ``input_ids`` and ``attention_mask`` (inputs_embeds,
custom position ids, a filled cache), encoder-decoder models. ``use_cache`` and
``cache_implementation`` are not needed: the decoder keeps its own caches (the tokens do
not depend on them).

**Two things generate() does not pass to a callable** (transformers 5.17 to 5.25,
``GenerationMixin._extract_generation_mode_kwargs`` replaces the mode keywords by the
callable's own): the ``streamer`` and the ``tokenizer``. generate() has already put the
prompt into the streamer; ``cactus_generate`` takes the streamer from generate()'s own
frame (``GenerationMixin.generate``, found by its code object) and feeds it the generated
columns and ``end()``, as ``_sample`` would. Without the tokenizer generate() itself
rejects ``stop_strings`` before calling the callable; pass
``stopping_criteria=[StopStringCriteria(tokenizer, strings)]`` instead, or use
``generate`` below (the hub entry point, ``custom_generate=PATH``), which receives the
tokenizer and turns ``stop_strings`` into that criterion.
"""

from __future__ import annotations

import copy
import inspect
import sys
from dataclasses import dataclass

import torch
from transformers.generation import (
    EosTokenCriteria,
    GenerationMixin,
    MaxLengthCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.utils import ModelOutput

from cactus_theory.core.rules.base import Rule
from cactus_theory.decode.generate import DecodeResult, speculative_generate

Tensor = torch.Tensor

__all__ = ["CactusGenerateOutput", "cactus_generate", "generate"]

#: The processors both models can see, in the order generate() applies them.
SAMPLING_PROCESSORS = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
#: The generate() option behind each processor generate() may build (for the error message).
PROCESSOR_OPTIONS = {
    "RepetitionPenaltyLogitsProcessor": "repetition_penalty",
    "EncoderRepetitionPenaltyLogitsProcessor": "encoder_repetition_penalty",
    "NoRepeatNGramLogitsProcessor": "no_repeat_ngram_size",
    "NoBadWordsLogitsProcessor": "bad_words_ids",
    "SequenceBiasLogitsProcessor": "sequence_bias",
    "MinLengthLogitsProcessor": "min_length / min_new_tokens",
    "MinNewTokensLengthLogitsProcessor": "min_new_tokens",
    "PrefixConstrainedLogitsProcessor": "prefix_allowed_tokens_fn",
    "ForcedBOSTokenLogitsProcessor": "forced_bos_token_id",
    "ForcedEOSTokenLogitsProcessor": "forced_eos_token_id",
    "InfNanRemoveLogitsProcessor": "remove_invalid_values",
    "ExponentialDecayLengthPenalty": "exponential_decay_length_penalty",
    "SuppressTokensLogitsProcessor": "suppress_tokens",
    "SuppressTokensAtBeginLogitsProcessor": "begin_suppress_tokens",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
    "ClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
    "TopHLogitsWarper": "top_h",
    "MinPLogitsWarper": "min_p",
    "TypicalLogitsWarper": "typical_p",
    "EpsilonLogitsWarper": "epsilon_cutoff",
    "EtaLogitsWarper": "eta_cutoff",
    "WatermarkLogitsProcessor": "watermarking_config",
    "SynthIDTextWatermarkLogitsProcessor": "watermarking_config",
}
#: Generation-config options that select another decoding mode: (name, is it set?).
MODE_OPTIONS = (
    ("num_beams", lambda value: value is not None and value > 1),
    ("num_beam_groups", lambda value: value is not None and value > 1),
    ("penalty_alpha", lambda value: value is not None and value > 0),
    ("dola_layers", lambda value: value is not None),
    ("prompt_lookup_num_tokens", lambda value: value is not None),
    ("assistant_early_exit", lambda value: value is not None),
)
#: Outputs generate() can add that this decoder does not produce.
REFUSED_OUTPUTS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")
#: Model keywords generate() prepares itself; any other is refused.
PREPARED_KEYWORDS = {
    "attention_mask",
    "position_ids",
    "logits_to_keep",
    "use_cache",
    "cache",
    "past_key_values",
    "cache_position",
}


@dataclass
class CactusGenerateOutput(ModelOutput):
    """What ``cactus_generate`` returns with ``return_dict_in_generate=True``.

    sequences: [B, P + T] prompts and generated tokens (finished rows padded), as generate().
    num_generated: [B] tokens generated per row (EOS included).
    acceptance_length: [B] AL per row: mean accepted drafts per verify step (bonus
        excluded, as in the paper).
    accepted_lengths, draft_counts: [steps, B] accepted drafts and drafts k_b per verify
        step (−1 where the row had finished).
    sequence_kl, token_kl: [B] and [B, T] the divergence meter's exact KL(emitted law ‖ q)
        per row (summed) and per token, float64 (None with ``divergence=False``);
    sequence_tv, token_tv: the same for total variation.
    timing: seconds per phase and call counts (``DecodeResult.timing``).
    tree_outcomes, tree_children: [steps, B, D] a tree run's walk per depth
        (``DecodeResult``); None for a chain.
    """

    sequences: torch.LongTensor | None = None
    num_generated: torch.LongTensor | None = None
    acceptance_length: torch.FloatTensor | None = None
    accepted_lengths: torch.LongTensor | None = None
    draft_counts: torch.LongTensor | None = None
    sequence_kl: torch.DoubleTensor | None = None
    token_kl: torch.DoubleTensor | None = None
    sequence_tv: torch.DoubleTensor | None = None
    token_tv: torch.DoubleTensor | None = None
    timing: dict | None = None
    tree_outcomes: torch.LongTensor | None = None
    tree_children: torch.LongTensor | None = None

    @classmethod
    def of(cls, result: DecodeResult, device: torch.device) -> CactusGenerateOutput:
        accepted = result.accepted_lengths  # [steps, B]
        active = accepted >= 0
        steps = active.sum(dim=0).clamp(min=1)  # [B]
        per_row = torch.where(active, accepted, 0).sum(dim=0) / steps  # [B]
        return cls(
            sequences=result.sequences.to(device),
            num_generated=result.num_generated,
            acceptance_length=per_row.float(),
            accepted_lengths=accepted,
            draft_counts=result.draft_counts,
            sequence_kl=result.sequence_kl,
            token_kl=result.token_kl,
            sequence_tv=result.sequence_tv,
            token_tv=result.token_tv,
            timing=dict(result.timing),
            tree_outcomes=result.tree_outcomes,
            tree_children=result.tree_children,
        )


def cactus_generate(
    model,
    input_ids: Tensor,  # [B, P]
    logits_processor=None,
    stopping_criteria=None,
    generation_config=None,
    synced_gpus: bool = False,
    streamer=None,
    *,
    draft_model=None,
    rule: Rule | str = "sps",
    k: int = 5,
    generator: torch.Generator | None = None,
    divergence: bool = True,
    max_kl: float | None = None,
    tree: str | None = None,
    children: str = "deterministic",
    **model_kwargs,
):
    """Speculative decoding with ``rule`` as generate()'s decoding loop (module docstring).

    Pass it as ``model.generate(..., custom_generate=cactus_generate, draft_model=draft,
    rule=..., k=...)``; ``model`` is the verifier. Its own keywords:

    draft_model : a causal LM with the verifier's vocabulary, or a ``FeatureDraft``.
    rule : a rule object or a spec string (``"cactus:delta=1.0"``); default sps (lossless).
    k : the most drafts per verify step.
    generator : the source of every random draw (default: torch's global generator).
    divergence : run the divergence meter (KL in the returned statistics).
    max_kl : cap every row's summed KL(μ ‖ q) at this many nats (``speculative_generate``).
    tree : draft a tree per step instead of a chain: ``"4,2,1"`` (widths per depth),
        ``"dynamic:16"`` (EAGLE-2), ``"auto"`` (``decode.tree_shape``); ``k`` is then unused
        and ``rule`` may be a tree rule (``"walk"``, ``"rrs"``) or a chain rule (lifted).
    children : how a tree's children are drafted (``"deterministic"``: the draft's top-K;
        ``"with-replacement"``, ``"without-replacement"``, ``"hub"``: sampled).

    Returns the sequences [B, P + T], or a ``CactusGenerateOutput`` with
    ``return_dict_in_generate=True``.
    """
    caller = _generate_frame_locals()
    if streamer is None:
        streamer = caller.get("streamer")
    _refuse_unsupported(model, generation_config, model_kwargs, synced_gpus, caller)
    if draft_model is None:
        raise ValueError("draft_model: cactus_generate needs a draft model (draft_model=...)")
    temperature, top_k, top_p = _sampling_settings(generation_config, logits_processor)
    max_length, eos, extra_criteria = _split_criteria(stopping_criteria, generation_config)
    prompt_length = input_ids.shape[1]
    mask = model_kwargs.get("attention_mask")
    if mask is None:
        mask = torch.ones_like(input_ids)
    _check_positions(model_kwargs.get("position_ids"), mask)
    stopping = None if not extra_criteria else _RowCriteria(extra_criteria, input_ids)
    result = speculative_generate(
        model,
        draft_model,
        input_ids,
        rule=rule,
        k=k,
        max_new_tokens=max(max_length - prompt_length, 0),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_id=eos,
        pad_token_id=_pad_id(generation_config),
        generator=generator,
        attention_mask=mask,
        divergence=divergence,
        max_kl=max_kl,
        stopping=stopping,
        streamer=streamer if streamer is None or not caller else _PromptAlreadySent(streamer),
        tree=tree,
        children=children,
    )
    if getattr(generation_config, "return_dict_in_generate", False):
        return CactusGenerateOutput.of(result, input_ids.device)
    return result.sequences.to(input_ids.device)


def generate(model, *args, **arguments):
    """The hub entry point (``custom_generate/generate.py``; transformers calls it as
    ``generate(model=model, **every generate() argument)`` for ``custom_generate=PATH``).

    It also takes ``tokenizer=`` with ``stop_strings`` (from the keywords or a generation
    config), turns them into a ``StopStringCriteria`` and runs
    ``model.generate(..., custom_generate=cactus_generate)`` (the class's generate, so a
    model whose ``generate`` was replaced by this function does not recurse).
    """
    tokenizer = arguments.pop("tokenizer", None)
    strings = arguments.pop("stop_strings", None)
    config = arguments.get("generation_config")
    if strings is None and getattr(config, "stop_strings", None):
        strings = config.stop_strings
        arguments["generation_config"] = config = copy.deepcopy(config)
        config.stop_strings = None
    elif strings is None and config is None and model.generation_config.stop_strings:
        strings = model.generation_config.stop_strings
        arguments["stop_strings"] = None  # overrides the model's default
    if strings:
        if tokenizer is None:
            raise ValueError("tokenizer: stop_strings need the tokenizer (tokenizer=...)")
        strings = [strings] if isinstance(strings, str) else list(strings)
        criteria = StoppingCriteriaList(arguments.get("stopping_criteria") or [])
        criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=strings))
        arguments["stopping_criteria"] = criteria
    return type(model).generate(model, *args, custom_generate=cactus_generate, **arguments)


# --- what generate() hands over --------------------------------------------------------------


def _generate_frame_locals(depth: int = 8) -> dict:
    """The local variables of the ``GenerationMixin.generate`` call that called us (found by
    its code object within ``depth`` frames), or {} when not called from generate()."""
    code = inspect.unwrap(GenerationMixin.generate).__code__
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return {}
        if frame.f_code is code:
            return frame.f_locals
        frame = frame.f_back
    return {}


def _refuse_unsupported(model, config, model_kwargs: dict, synced_gpus, caller: dict) -> None:
    """ValueError naming the first option this decoder cannot honour (module docstring)."""
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError("model: encoder-decoder models are not supported by cactus_generate")
    if caller.get("assistant_model") is not None:
        raise ValueError(
            "assistant_model: cactus_generate drafts with draft_model=...; "
            "assistant_model is transformers' assisted generation"
        )
    if synced_gpus or caller.get("synced_gpus"):
        raise ValueError("synced_gpus: not supported by cactus_generate")
    if config is not None:
        for name, is_set in MODE_OPTIONS:
            if is_set(getattr(config, name, None)):
                raise ValueError(
                    f"{name}: {name}={getattr(config, name)!r} selects another decoding mode; "
                    "cactus_generate does greedy decoding and sampling only"
                )
        for name in REFUSED_OUTPUTS:
            if getattr(config, name, False):
                raise ValueError(f"{name}: not supported by cactus_generate")
    for name, value in model_kwargs.items():
        if name not in PREPARED_KEYWORDS:
            raise ValueError(
                f"{name}: not supported by cactus_generate (it takes input_ids and attention_mask)"
            )
        if name in ("cache", "past_key_values") and value is not None:
            length = value.get_seq_length() if hasattr(value, "get_seq_length") else 0
            if length:
                raise ValueError(f"{name}: continuing from a filled KV cache is not supported")


def _sampling_settings(config, processors) -> tuple[float, int | None, float]:
    """(temperature, top_k, top_p) of the processors generate() prepared; temperature 0
    when ``do_sample`` is False (greedy). ValueError naming any other processor."""
    temperature, top_k, top_p = 1.0, None, 1.0
    order = 0  # processors must come in SAMPLING_PROCESSORS order, each once
    for processor in processors or []:
        kind = type(processor)
        if kind not in SAMPLING_PROCESSORS or SAMPLING_PROCESSORS.index(kind) < order:
            option = PROCESSOR_OPTIONS.get(kind.__name__, "logits_processor")
            raise ValueError(
                f"{option}: its {kind.__name__} is not supported by cactus_generate; both "
                "models must see the same processors, and only temperature, top_k and top_p "
                "(in that order) are applied to both"
            )
        order = SAMPLING_PROCESSORS.index(kind) + 1
        if getattr(processor, "filter_value", -float("inf")) != -float("inf"):
            raise ValueError(f"logits_processor: {kind.__name__} with a finite filter_value")
        if kind is TemperatureLogitsWarper:
            temperature = float(processor.temperature)
        elif kind is TopKLogitsWarper:
            top_k = int(processor.top_k)
        else:
            if getattr(processor, "min_tokens_to_keep", 1) != 1:
                raise ValueError("top_p: min_tokens_to_keep > 1 is not supported")
            top_p = float(processor.top_p)
    if config is not None and not config.do_sample:
        return 0.0, None, 1.0
    return temperature, top_k, top_p


def _split_criteria(criteria, config) -> tuple[int, list[int], list]:
    """(max_length, EOS ids, the other criteria) of generate()'s stopping criteria."""
    max_length, eos, others = None, [], []
    for criterion in criteria or []:
        if isinstance(criterion, MaxLengthCriteria):
            max_length = criterion.max_length
        elif isinstance(criterion, EosTokenCriteria):
            ids = criterion.eos_token_id
            eos += ids.flatten().tolist() if isinstance(ids, Tensor) else list(ids)
        else:
            others.append(criterion)
    if max_length is None:
        max_length = getattr(config, "max_length", None)
    if max_length is None:
        raise ValueError("max_new_tokens: generate() set no max_length; pass max_new_tokens")
    return int(max_length), sorted(set(eos)), others


def _pad_id(config) -> int | None:
    pad = getattr(config, "_pad_token_tensor", None)
    if pad is None:
        pad = getattr(config, "pad_token_id", None)
    if isinstance(pad, Tensor):
        pad = int(pad.flatten()[0]) if pad.numel() else None
    return pad


def _check_positions(position_ids, mask: Tensor) -> None:
    """generate() makes position ids cumsum(mask) − 1 from the mask; other ones were
    passed by the user, and the decoder computes its own."""
    if position_ids is None:
        return
    expected = mask.long().cumsum(dim=-1) - 1  # [B, P]
    real = mask.bool()
    if position_ids.shape != mask.shape or not torch.equal(
        position_ids.to(expected.device)[real], expected[real]
    ):
        raise ValueError("position_ids: custom position ids are not supported by cactus_generate")


class _RowCriteria:
    """transformers stopping criteria as the decoder's stopping hook: called on one row's
    sequence so far [1, P + t] (its prompt as given, left padding included) and
    ``scores=None``, as generate() calls them without ``output_scores``."""

    def __init__(self, criteria: list, prompts: Tensor) -> None:
        self.criteria = StoppingCriteriaList(criteria)
        self.prompts = prompts  # [B, P]

    def __call__(self, row: int, generated: list[int]) -> bool:
        prompt = self.prompts[row]  # [P]
        new = torch.tensor(generated, dtype=prompt.dtype, device=prompt.device)
        sequence = torch.cat([prompt, new])[None]  # [1, P + t]
        return bool(self.criteria(sequence, None)[0])


class _PromptAlreadySent:
    """A streamer whose prompt generate() has already put (called from generate()): drops
    the decoder's first put."""

    def __init__(self, streamer) -> None:
        self.streamer = streamer
        self.prompt_skipped = False

    def put(self, ids: Tensor) -> None:
        if not self.prompt_skipped:
            self.prompt_skipped = True
            return
        self.streamer.put(ids)

    def end(self) -> None:
        self.streamer.end()
