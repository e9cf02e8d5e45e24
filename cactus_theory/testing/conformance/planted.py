"""Samplers with planted defects, each claiming SpS: the suite must catch every one (and
pass the control, our own sampler).

==========================  ===================================================================
defect                      the sampler (q = target, p = draft, n = drafted token)
==========================  ===================================================================
control                     ``sampler.verify`` with SpS: no defect
acceptance-off-1%           accepts with 0.99 · min(1, q_n / p_n) (residual as SpS's)
residual-unclamped          emits from the *unclamped* q − p: the first index whose running
                            sum of (q − p) exceeds u · Σ(q − p)_+ (the clamp max(·, 0)
                            forgotten in an inverse-CDF sampler)
temperature-dropped         the logits path applies top-k and top-p but not the temperature
processors-twice            the logits path applies the processors twice (T², as
                            transformers' assistant drafts)
==========================  ===================================================================

The first three take probabilities; the last two differ from the control only in their
logits path (``Adapter.logits``), so only the logits properties can catch them.
``exact_tv(name, ...)`` gives the exact TV between a defect's emitted law and SpS's, where
it has a closed form, so a test can show the suite detects a TV of a few thousandths.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch

from cactus_theory.core import law, rules
from cactus_theory.core.processors import SamplingSettings
from cactus_theory.core.rules.base import Rule
from cactus_theory.testing.conformance.adapter import Adapter
from cactus_theory.testing.conformance.adapters import cactus_torch

Tensor = torch.Tensor


class ScaledAcceptance(Rule):
    """SpS with every acceptance multiplied by ``factor`` (the residual unchanged): the
    general family, so the toolkit's exact law and torch sampler run it as it is."""

    name = "planted-scaled-acceptance"

    def __init__(self, factor: float = 0.99) -> None:
        self.factor = float(factor)
        self.base = rules.make("sps")

    def params(self) -> dict:
        return {"factor": self.factor}

    def accept_probs(self, target_probs, draft_probs):
        return self.factor * self.base.accept_probs(*_laws(target_probs, draft_probs))

    def residuals_for(self, target_probs, draft_probs, tokens):
        return self.base.residuals_for(*_laws(target_probs, draft_probs), tokens)


def _laws(target_probs, draft_probs):
    """The rows renormalised in float64 (the torch sampler hands a general rule its float32
    rows, which sum to 1 only within ~1e-7; SpS's contract asks for 1e-9)."""
    rows = []
    for probs in (target_probs, draft_probs):
        probs = np.asarray(probs, dtype=np.float64)
        total = probs.sum(axis=-1, keepdims=True)
        rows.append(probs / np.where(total > 0, total, 1.0))
    return rows


def verify_unclamped(
    target_probs: Tensor,
    draft_probs: Tensor,
    draft_ids: Tensor,
    generator: torch.Generator | None,
    uniforms=None,
    num_drafts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """SpS whose residual sampler forgot the clamp (module docstring); ragged rows."""
    from cactus_theory.sampler.emit import inverse_cdf_flat
    from cactus_theory.sampler.verify_step import layout_tokens

    target, draft = target_probs.to(torch.float64), draft_probs.to(torch.float64)
    batch, steps = draft_ids.shape
    if uniforms is None:
        drawn = torch.rand(batch, steps + 1, dtype=torch.float64, generator=generator)
        accept_u, sample_u = drawn[:, :steps], drawn[:, steps]
    else:
        accept_u, sample_u = cactus_torch.torch_uniforms(uniforms, target.device)
    drafts = torch.full((batch,), steps) if num_drafts is None else num_drafts.to(torch.int64)
    target_at = target[:, :steps].gather(-1, draft_ids[..., None])[..., 0]  # [B, k]
    draft_at = draft.gather(-1, draft_ids[..., None])[..., 0]  # [B, k]
    ratio = torch.where(draft_at > 0, target_at / draft_at.clamp(min=1e-300), 0.0).clamp(max=1)
    decided = torch.arange(steps)[None, :] < drafts[:, None]
    accepted = (accept_u < ratio) & decided
    num_accepted = torch.cumprod(accepted.to(torch.int64), dim=1).sum(dim=1)  # [B]
    rows = torch.arange(batch)
    stop = num_accepted.clamp(max=max(steps - 1, 0))
    difference = target[rows, stop] - draft[rows, stop]  # [B, V] unclamped
    total = difference.clamp(min=0).sum(-1)  # [B]
    running = difference.cumsum(-1)
    crossed = running > (sample_u * total)[:, None]
    unclamped = torch.where(
        crossed.any(-1), crossed.to(torch.int64).argmax(-1), draft.shape[-1] - 1
    )
    bonus = inverse_cdf_flat(target[rows, drafts].to(torch.float32), sample_u)
    emitted = torch.where(num_accepted < drafts, unclamped, bonus)
    return layout_tokens(draft_ids.to(torch.int64), num_accepted, emitted), num_accepted


def _logits_path(process: Callable[[Tensor, SamplingSettings], Tensor]):
    verify = cactus_torch.verify_with(rules.make("sps"))

    def verify_logits(target_logits, draft_probs, draft_ids, settings, generator, uniforms=None):
        target = cactus_torch.processed_rows(process, target_logits, settings)
        return verify(target, draft_probs, draft_ids, generator, uniforms)

    return verify_logits


def _without_temperature(logits: Tensor, settings: SamplingSettings) -> Tensor:
    from cactus_theory.sampler import processors

    dropped = (
        settings if settings.temperature == 0 else dataclasses.replace(settings, temperature=1.0)
    )
    return processors.process_logits(logits, dropped)


def _twice(logits: Tensor, settings: SamplingSettings) -> Tensor:
    from cactus_theory.sampler import processors

    once = processors.process_logits(logits, settings)
    return processors.process_logits(torch.log(once), settings)


def adapter(name: str) -> Adapter:
    """The planted sampler ``name`` (``DEFECTS``), claiming SpS."""
    if name not in DEFECTS:
        raise ValueError(f"name: unknown planted defect {name!r}; choose from {list(DEFECTS)}")
    control = cactus_torch.adapter("sps")
    verify, logits = control.verify, control.logits
    if name == "acceptance-off-1%":
        verify = cactus_torch.verify_with(ScaledAcceptance(0.99))
        logits = cactus_torch.logits_with(ScaledAcceptance(0.99))
    elif name == "residual-unclamped":
        verify = verify_unclamped
        logits = None
    elif name == "temperature-dropped":
        logits = _logits_path(_without_temperature)
    elif name == "processors-twice":
        logits = _logits_path(_twice)
    return dataclasses.replace(
        control,
        name=f"planted: {name}",
        verify=verify,
        logits=logits,
        logits_injects=logits is not None,
        notes=(DEFECTS[name],),
    )


DEFECTS = {
    "control": "our own sampler (sampler.verify, SpS): no defect",
    "acceptance-off-1%": "acceptance 0.99 min(1, q_n/p_n)",
    "residual-unclamped": "residual sampled from the running sum of the unclamped q - p",
    "temperature-dropped": "the logits path ignores each row's temperature",
    "processors-twice": "the logits path applies temperature, top-k and top-p twice",
}


def exact_tv(name: str, target: np.ndarray, draft: np.ndarray) -> float:
    """TV between the emitted law of defect ``name`` at one position and SpS's (q), for
    the defects that take probabilities and have a closed form (acceptance-off-1%)."""
    if name != "acceptance-off-1%":
        raise ValueError(f"name: no closed form for {name!r}")
    emitted = law.output_law(ScaledAcceptance(0.99), target, draft)
    return float(0.5 * np.abs(emitted - target).sum())
