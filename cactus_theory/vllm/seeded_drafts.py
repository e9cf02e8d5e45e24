"""Seeded requests draw their drafts from their own generator.

vLLM 0.32's draft proposer samples probabilistic drafts in
``llm_base_proposer.compute_probs_and_sample_next_token``: p = softmax(logits / T), then
the exponential race argmax_i p_i / E_i with E ~ Exp(1) drawn by ``q.exponential_()``
from the worker's *default* generator (its own comment: "TODO: consider seeds"). A seeded
request's accept step and bonus token use the request's generator, but its drafts depend on
everything else the worker sampled before, and on which requests shared its batches, which
the scheduler decides by timing. So the emitted tokens of a seeded request were not
reproducible even between two runs of the same engine.

``install()`` wraps that function: vLLM's own function runs unchanged (p, the tokens of
unseeded rows, the default generator's draws), then every row whose request has a
generator in ``sampling_metadata.generators`` and a temperature above vLLM's greedy
threshold is drawn again from that generator:

    E_b ~ Exp(1)^V from generators[b]        token_b = argmax_i p_b,i / E_b,i

which is an exact sample of p_b (the same race vLLM runs), so every rule still sees the law
each draft was drawn from. A request's generator then serves, in a fixed order, its bonus
token, its accept step and its drafts, all with per-request draw counts: its tokens depend
on its seed and its own history only (tests/vllm/test_vllm_seeded_drafts.py; the TP = 2
test relies on it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from cactus_theory.vllm.config import MARK

Tensor = torch.Tensor

#: vLLM's threshold below which a temperature means greedy (``sampler._SAMPLING_EPS``).
GREEDY_TEMPERATURE = 1e-5


def seeded_rows(sampling_metadata: Any, num_rows: int) -> list[tuple[int, torch.Generator]]:
    """(row, generator) for each row of ``num_rows`` drawn for a seeded, non-greedy request.

    Rows map to requests one to one, or request-major in blocks (parallel drafting: K rows
    per request, as vLLM's ``_sample_from_logits`` lays them out)."""
    generators = getattr(sampling_metadata, "generators", None) or {}
    if not generators:
        return []
    num_requests = len(getattr(sampling_metadata, "output_token_ids", None) or []) or num_rows
    if num_rows % num_requests:
        return []
    per_request = num_rows // num_requests
    temperature = getattr(sampling_metadata, "temperature", None)  # [num_rows] or None
    chosen = []
    for request, generator in sorted(generators.items()):
        for row in range(request * per_request, (request + 1) * per_request):
            if row >= num_rows:
                break
            if temperature is not None and float(temperature[row]) < GREEDY_TEMPERATURE:
                continue
            chosen.append((row, generator))
    return chosen


def redraw_seeded(
    token_ids: Tensor,  # [R] vLLM's draft tokens
    probs: Tensor,  # [R, V] the law p each row was drawn from
    rows: list[tuple[int, torch.Generator]],
    use_fp64_gumbel: bool = False,
) -> Tensor:
    """``token_ids`` with each listed row redrawn from p by the exponential race on its own
    generator (module docstring); [R]."""
    if not rows:
        return token_ids
    token_ids = token_ids.clone()
    dtype = torch.float64 if use_fp64_gumbel else probs.dtype
    vocab = probs.shape[-1]
    for row, generator in rows:
        noise = torch.empty(vocab, dtype=dtype, device=probs.device)  # [V] E ~ Exp(1)
        noise.exponential_(generator=generator)
        scores = probs[row].to(dtype) / noise  # [V]
        token_ids[row] = scores.argmax().to(token_ids.dtype)
    return token_ids


def seeded_sample(
    original: Callable[..., tuple[Tensor, Tensor]],
    logits: Tensor,  # [R, V]
    sampling_metadata: Any,
    use_fp64_gumbel: bool = False,
) -> tuple[Tensor, Tensor]:
    """vLLM's ``compute_probs_and_sample_next_token`` with seeded rows redrawn: (token ids
    [R], probs [R, V])."""
    num_rows = logits.shape[0]
    token_ids, probs = original(logits, sampling_metadata, use_fp64_gumbel)
    if sampling_metadata.all_greedy:
        return token_ids, probs  # probs are vLLM's logits here: nothing was sampled
    rows = seeded_rows(sampling_metadata, num_rows)
    return redraw_seeded(token_ids, probs, rows, use_fp64_gumbel), probs


def install() -> bool:
    """Wrap the proposer's draft sampling (once); False where this vLLM has no such
    function (then drafts stay on the default generator)."""
    try:
        from vllm.v1.spec_decode import llm_base_proposer
    except ImportError:  # pragma: no cover - a vLLM without the draft proposer
        return False
    original = getattr(llm_base_proposer, "compute_probs_and_sample_next_token", None)
    if original is None:  # pragma: no cover - another vLLM layout
        return False
    if getattr(original, MARK, False):
        return True

    @functools.wraps(original)
    def patched(logits, sampling_metadata, use_fp64_gumbel=False):
        return seeded_sample(original, logits, sampling_metadata, use_fp64_gumbel)

    setattr(patched, MARK, True)
    llm_base_proposer.compute_probs_and_sample_next_token = patched
    return True
