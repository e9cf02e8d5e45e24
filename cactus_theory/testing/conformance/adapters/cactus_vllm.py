"""Adapters for this project's vLLM plug-in (``cactus_theory.vllm``): its accept step on
vLLM's flattened layout, checked against the rule it runs.

- **probabilities** (``verify``): ``accept.accept_flat(rule, draft_token_ids [N],
  num_draft_tokens, target_probs [N, V], draft_probs [N, V], bonus_token_ids [B],
  uniforms=(accept [B, k], sample [B]) or generators={row: generator})`` — what the
  plug-in's ``rejection_sample`` calls for each rule's rows. Conventions: our sampler's
  (``reference.INVERSE_CDF``); the bonus is an input, as in vLLM (drawn here by inverse CDF
  with the sample uniform, or by multinomial); a seeded row draws its num_drafts + 1
  uniforms from its own generator (``accept.row_uniforms``).
- **logits** (``logits``): vLLM's own logits path with the plug-in installed (its accept
  step in ``rejection_sampler.rejection_sample``, the probed CPU fix of
  ``expand_batch_to_tokens``) and the rule given to every row
  (``config.batch_rules``). Law mode is ``RejectionSampler.forward`` as in an engine;
  exact mode is vLLM's ``apply_sampling_constraints`` (fixed), then ``accept_flat`` on the
  processed rows with the injected uniforms. Temperature-0 rows keep vLLM's greedy sampler
  (the plug-in never changes greedy output), so they claim ``greedy``.

Needs vLLM (``.venv-vllm``); every registered rule claims itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cactus_theory.core import rules
from cactus_theory.core.rules.base import Rule
from cactus_theory.testing.conformance.adapter import BONUS_SUPPLIED, Adapter
from cactus_theory.testing.conformance.adapters import vllm_cpu
from cactus_theory.testing.conformance.adapters.cactus_torch import torch_uniforms
from cactus_theory.testing.conformance.reference import Uniforms

Tensor = torch.Tensor


def verify_with(rule: Rule):
    """The harness's verify function for ``accept.accept_flat`` with ``rule``."""
    from cactus_theory.vllm import accept

    def verify(
        target_probs: Tensor,
        draft_probs: Tensor,
        draft_ids: Tensor,
        generator: Any,
        uniforms: Uniforms | None = None,
        num_drafts: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        steps = draft_ids.shape[1]
        flat = vllm_cpu.flat_batch(
            target_probs, draft_probs, draft_ids, generator, uniforms, num_drafts
        )
        result = accept.accept_flat(
            rule,
            flat.ids.to(torch.int64),
            flat.counts,
            flat.target,
            flat.draft,
            flat.bonus,
            width=steps + 1,
            uniforms=None if uniforms is None else _padded(uniforms, steps, flat.counts),
            generators=flat.generators,
        )
        return result.token_ids.to(torch.int64), result.num_accepted

    return verify


def _padded(uniforms: Uniforms, steps: int, counts: Sequence[int]) -> tuple[Tensor, Tensor]:
    """accept_flat's uniforms: accept [B, max(counts)], sample [B]."""
    accept, sample = torch_uniforms(uniforms, torch.device("cpu"))
    return accept[:, : max(counts, default=0)], sample


def logits_with(rule: Rule):
    """The plug-in's logits path (module docstring) with ``rule`` on every row."""
    from cactus_theory.vllm import accept, config

    spec = rules.spec_of(rule)

    def accept_step(ids, counts, cumulative, draft, target_logits, bonus, metadata, uniforms):
        """Exact mode, routed as the plug-in routes: temperature-0 rows by vLLM's own
        function, the others by the accept step with the injected uniforms."""
        probs = target_logits.softmax(dim=-1, dtype=torch.float32)
        result = accept.accept_flat(
            rule, ids.to(torch.int64), counts, probs, draft, bonus,
            uniforms=_padded(uniforms, max(counts), counts),
        )  # fmt: skip
        token_ids = result.token_ids.to(torch.int64)
        greedy = metadata.temperature == 0
        if bool(greedy.any()):
            own = vllm_cpu.own_rejection_sample()
            with vllm_cpu.injected(uniforms, counts):
                theirs = own(
                    ids, counts, max(counts), cumulative, draft, target_logits, bonus, metadata
                )
            token_ids[greedy] = theirs[greedy].to(torch.int64)
        return token_ids, ((token_ids != -1).sum(dim=1) - 1).clamp(min=0)

    inner = vllm_cpu.logits_path(fixed=True, accept_step=accept_step)

    def verify_logits(target_logits, draft_probs, draft_ids, settings, generator, uniforms=None):
        with config.batch_rules([spec] * draft_ids.shape[0], meter=False):
            return inner(target_logits, draft_probs, draft_ids, settings, generator, uniforms)

    return verify_logits


def adapter(rule: Rule | str = "sps") -> Adapter:
    """The plug-in's accept step with ``rule``, claiming ``rule``."""
    parsed = rules.parse(rule) if isinstance(rule, str) else rule
    return Adapter(
        name="cactus-vllm",
        verify=verify_with(parsed),
        rule=rules.spec_of(parsed),
        version=vllm_cpu.version(),
        ragged=True,
        row_generators=True,
        bonus=BONUS_SUPPLIED,
        logits=logits_with(parsed),
        logits_injects=True,
        greedy_rule="greedy",
        notes=(
            "cactus_theory.vllm accept_flat: our sampler's conventions on vLLM's layout; "
            "the bonus is vLLM's input; seeded rows draw from their own generator; logits "
            "path: vLLM's with the plug-in and its CPU fix installed",
        ),
    )
