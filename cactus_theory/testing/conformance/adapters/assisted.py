"""transformers' assisted generation end to end, with mock models of fixed laws.

Both models are a tiny Llama (built from a config, no download) whose next-token logits
are replaced by a fixed vector: L_target for the verifier, L_draft for the assistant,
whatever the context. ``model.generate(assistant_model=assistant, do_sample=True,
temperature=T)`` then has, at every position, the verifier law q_T = softmax(L_target / T),
and the assistant must draft from p_T = softmax(L_draft / T), the law transformers' own
acceptance ratio divides by (its candidate logits). Two properties:

- ``assisted-draft-law``: the drafted tokens (read from ``AssistedCandidateGenerator``)
  against p_T. The detail also gives the p-value against p_{T²}, softmax(L_draft / T²):
  transformers 5.17-5.25 hand the verifier's processors (temperature included) to the
  assistant's ``generate()``, which adds its own from the same generation config, so the
  assistant drafts at T². The acceptance ratio uses the same twice-processed logits, so
  the output law stays q_T; only acceptance suffers.
- ``assisted-output-law``: the emitted tokens against q_T. With fixed logits a lossless
  decoder emits i.i.d. q_T tokens, so Pearson's test applies to the whole sequence.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from cactus_theory.testing.conformance import stats
from cactus_theory.testing.conformance.adapter import ExtraCheck
from cactus_theory.testing.conformance.report import PropertyResult
from cactus_theory.testing.search import FAILED, PASSED

#: The declared temperature, the drafts per step, the vocabulary, the tokens per generate().
TEMPERATURE = 0.7
STEPS = 6
VOCAB = 8
TOKENS_PER_CALL = 300
#: Emitted tokens the properties aim at (the run stops once both counts reach it).
DRAWS = 5_000
TARGET_LOGITS = np.array([1.2, 0.3, -0.4, 0.9, -1.1, 0.0, 0.6, -0.2])
DRAFT_LOGITS = np.array([1.0, 0.4, -0.6, 1.0, -0.9, 0.1, 0.4, -0.3])


def softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    scaled = logits / temperature
    weights = np.exp(scaled - scaled.max())
    return weights / weights.sum()


def fixed_logits_model(logits: np.ndarray, seed: int):
    """A tiny Llama whose next-token logits are always ``logits`` (cache and generate()
    work as for any causal LM)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    class FixedLogitsLM(LlamaForCausalLM):
        def forward(self, *args: Any, **kwargs: Any):
            output = super().forward(*args, **kwargs)
            fixed = self.fixed_logits.to(output.logits.dtype)
            output.logits = fixed.expand(output.logits.shape).clone()
            return output

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=16,
        max_position_embeddings=TOKENS_PER_CALL + 16,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    model = FixedLogitsLM(config).eval()
    model.register_buffer("fixed_logits", torch.as_tensor(logits, dtype=torch.float32))
    model.generation_config.num_assistant_tokens = STEPS
    model.generation_config.num_assistant_tokens_schedule = "constant"
    model.generation_config.assistant_confidence_threshold = None
    return model


def sample(draws: int, seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(drafted tokens, emitted tokens, generate() calls): assisted generation until both
    counts reach ``draws``."""
    from transformers.generation import candidate_generator

    verifier = fixed_logits_model(TARGET_LOGITS, seed)
    assistant = fixed_logits_model(DRAFT_LOGITS, seed + 1)
    drafted: list[np.ndarray] = []
    original = candidate_generator.AssistedCandidateGenerator._generate_candidates

    def spy(self, arguments):
        candidates, logits = original(self, arguments)
        start = arguments[self.input_ids_key].shape[-1]
        drafted.append(candidates[0, start:].cpu().numpy())
        return candidates, logits

    emitted: list[np.ndarray] = []
    calls = 0
    prompt = torch.tensor([[1, 2]])
    candidate_generator.AssistedCandidateGenerator._generate_candidates = spy
    try:
        while min(sum(map(len, drafted)), sum(map(len, emitted))) < draws:
            torch.manual_seed(seed * 7_919 + calls)
            output = verifier.generate(
                input_ids=prompt,
                attention_mask=torch.ones_like(prompt),
                assistant_model=assistant,
                do_sample=True,
                temperature=TEMPERATURE,
                top_k=VOCAB,
                top_p=1.0,
                max_new_tokens=TOKENS_PER_CALL,
                pad_token_id=0,
            )
            emitted.append(output[0, prompt.shape[1] :].cpu().numpy())
            calls += 1
    finally:
        candidate_generator.AssistedCandidateGenerator._generate_candidates = original
    return np.concatenate(drafted)[:draws], np.concatenate(emitted)[:draws], calls


_CACHE: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, int, float]] = {}


def _sampled(draws: int, seed: int) -> tuple[np.ndarray, np.ndarray, int, float]:
    """``sample`` once per (draws, seed) for both properties, with its seconds."""
    key = (draws, seed)
    if key not in _CACHE:
        started = time.perf_counter()
        drafted, emitted, calls = sample(draws, seed)
        _CACHE.clear()
        _CACHE[key] = (drafted, emitted, calls, time.perf_counter() - started)
    return _CACHE[key]


def _result(name: str, tokens: np.ndarray, law: np.ndarray, level: float, what: str, extra: str):
    test = stats.law_test(np.bincount(tokens, minlength=VOCAB), law, level)
    detail = (
        f"{what}: p = {test['pvalue']:.3g} at level {level:.2g}, {test['draws']:,} tokens, "
        f"observed TV {test['observed_tv']:.4f}, detects TV >= {test['detectable_tv']:.4f} "
        f"with probability {stats.POWER:g}{extra}"
    )
    status = PASSED if test["passed"] else FAILED
    counterexample = None
    if not test["passed"]:
        counterexample = {"counts": test["counts"], "law": test["law"]}
    return PropertyResult(
        name,
        status,
        detail,
        counterexample,
        kind="law",
        pvalue=test["pvalue"],
        level=level,
        draws=test["draws"],
        detectable_tv=test["detectable_tv"],
        tests=[{"case": "assisted", "test": what, **test}],
    )


def draft_law(level: float, draws: int, seed: int) -> PropertyResult:
    drafted, _, calls, seconds = _sampled(min(draws, DRAWS), seed)
    declared = softmax(DRAFT_LOGITS, TEMPERATURE)
    squared = softmax(DRAFT_LOGITS, TEMPERATURE**2)
    twice = stats.law_test(np.bincount(drafted, minlength=VOCAB), squared, level)
    extra = (
        f"; against T² = {TEMPERATURE**2:g} (processors applied twice): p = "
        f"{twice['pvalue']:.3g}, observed TV {twice['observed_tv']:.4f}; TV(p_T, p_T²) = "
        f"{0.5 * np.abs(declared - squared).sum():.4f} ({calls} generate() calls, "
        f"{seconds:.0f} s)"
    )
    what = f"drafted tokens vs p_T, T = {TEMPERATURE:g}"
    return _result("assisted-draft-law", drafted, declared, level, what, extra)


def output_law(level: float, draws: int, seed: int) -> PropertyResult:
    _, emitted, calls, seconds = _sampled(min(draws, DRAWS), seed)
    declared = softmax(TARGET_LOGITS, TEMPERATURE)
    what = f"emitted tokens vs q_T, T = {TEMPERATURE:g}"
    return _result("assisted-output-law", emitted, declared, level, what, f" ({calls} calls)")


def checks() -> list[ExtraCheck]:
    """The two end-to-end properties (one chi-square test each)."""
    return [
        ExtraCheck("assisted-draft-law", 1, draft_law),
        ExtraCheck("assisted-output-law", 1, output_law),
    ]
