"""Adapters for this project's own torch sampler (``cactus_theory.sampler.verify``).

``sampler.verify(target_probs, draft_probs, draft_ids, rule, generator=None,
uniforms=(accept [B, k], sample [B]), num_drafts=None)`` already has the harness's
signature and its randomness convention (``reference.INVERSE_CDF``): accept iff u < a_n,
emit by inverse CDF with one uniform per row. It takes float16/bfloat16 rows (computes in
float32), ragged rows (``num_drafts``), but one generator per batch (no per-row seeds:
verifying a batch equals verifying its rows one by one with the same generator, since the
CPU generator fills U = rand(B, k+1) row by row).

Its logits path is the decoder's: ``sampler.processors.process_logits`` with each row's
settings (rows grouped by settings), then ``verify``. Every registered rule claims itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from cactus_theory.core import rules
from cactus_theory.core.processors import SamplingSettings
from cactus_theory.core.rules.base import Rule
from cactus_theory.testing.conformance.adapter import Adapter
from cactus_theory.testing.conformance.reference import Uniforms

Tensor = torch.Tensor


def torch_uniforms(uniforms: Uniforms | None, device: torch.device) -> tuple[Tensor, Tensor] | None:
    """The (accept [B, k], sample [B]) float64 tensors ``sampler.verify`` takes."""
    if uniforms is None:
        return None
    return (
        torch.as_tensor(uniforms.accept, dtype=torch.float64, device=device),
        torch.as_tensor(uniforms.sample, dtype=torch.float64, device=device),
    )


def processed_rows(
    process: Callable[[Tensor, SamplingSettings], Tensor],
    logits: Tensor,  # [B, n, V]
    settings: Sequence[SamplingSettings],
) -> Tensor:
    """[B, n, V] float32 probabilities: each row's logits through ``process`` with its own
    settings (rows grouped by settings, one call per group)."""
    probs = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    for chosen in set(settings):
        rows = torch.tensor([b for b, s in enumerate(settings) if s == chosen], dtype=torch.long)
        probs[rows] = process(logits[rows], chosen).to(torch.float32)
    return probs


def verify_with(rule: Rule, device: str = "cpu") -> Callable[..., tuple[Tensor, Tensor]]:
    """The harness's verify function for ``sampler.verify`` with ``rule`` on ``device``
    (a CPU generator draws on the CPU, as ``sampler.verify`` documents)."""
    from cactus_theory import sampler

    def verify(target_probs, draft_probs, draft_ids, generator, uniforms=None, num_drafts=None):
        return sampler.verify(
            target_probs.to(device),
            draft_probs.to(device),
            draft_ids.to(device),
            rule,
            generator=generator if uniforms is None else None,
            uniforms=torch_uniforms(uniforms, torch.device(device)),
            num_drafts=None if num_drafts is None else num_drafts.to(device),
        )

    return verify


def logits_with(rule: Rule, device: str = "cpu") -> Callable[..., tuple[Tensor, Tensor]]:
    """The logits path: ``sampler.processors`` per row, then ``sampler.verify``."""
    from cactus_theory.sampler import processors

    verify = verify_with(rule, device)

    def verify_logits(target_logits, draft_probs, draft_ids, settings, generator, uniforms=None):
        target = processed_rows(processors.process_logits, target_logits.to(device), settings)
        return verify(target, draft_probs, draft_ids, generator, uniforms)

    return verify_logits


def adapter(rule: Rule | str = "sps", device: str = "cpu") -> Adapter:
    """``sampler.verify`` with ``rule`` on ``device``, claiming ``rule``."""
    parsed = rules.parse(rule) if isinstance(rule, str) else rule
    spec = rules.spec_of(parsed)
    return Adapter(
        name="cactus-torch" if device == "cpu" else f"cactus-torch ({device})",
        verify=verify_with(parsed, device),
        rule=spec,
        version=_version(),
        ragged=True,
        logits=logits_with(parsed, device),
        logits_injects=True,
        notes=(
            "sampler.verify: accept iff u < a_n, emit by inverse CDF; float32 compute; "
            "one generator per batch (no per-row seeds)",
        ),
    )


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("cactus-theory")
    except metadata.PackageNotFoundError:  # pragma: no cover - a checkout without install
        return ""


#: The rule of each registered name the engine adapters are checked with (parameters
#: where a rule needs them; the engines' defaults otherwise).
RULE_SPECS = {
    "sps": "sps",
    "cactus": "cactus:delta=0.5",
    "cactus-exact": "cactus-exact:delta=0.5",
    "frontier": "frontier:delta=0.3",
    "pareto": "pareto:spread=1.0",
    "interp": "interp:alpha=0.3",
    "tas": "tas",
    "topk": "topk:k=3",
    "greedy": "greedy",
    "sglang": "sglang:threshold_single=0.9,threshold_acc=0.5",
    "relaxed": "relaxed:top_k=10,delta=0.6",
    "relaxed-ratio": "relaxed-ratio:top_k=3,ratio=0.3",
}


def every_rule_spec() -> list[str]:
    """A spec for every registered rule: ``RULE_SPECS`` for the built-ins and the engines'
    rules, and for a plug-in rule its name with the parameters it can take from a default
    (a plug-in that needs parameters is listed with ``parameters?`` so the caller can skip
    it)."""
    specs = []
    for name in rules.names():
        if name in RULE_SPECS:
            specs.append(RULE_SPECS[name])
            continue
        try:
            specs.append(rules.spec_of(rules.make(name)))
        except (TypeError, ValueError):
            specs.append(f"{name}:parameters?")
    return specs
