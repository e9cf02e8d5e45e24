"""The one signature every engine's verify step is wrapped in, and what an adapter declares.

An engine enters the harness as a verify function::

    verify(target_probs, draft_probs, draft_ids, generator, uniforms=None, **extra)
        -> (token_ids [B, k+1], num_accepted [B])

- ``target_probs`` [B, k+1, V] the verifier's laws q (row k: the bonus law), in the dtype
  under test (float32 unless a low-precision property asks for float16 or bfloat16);
- ``draft_probs`` [B, k, V] the laws p the drafts were sampled from; ``draft_ids`` [B, k]
  int64;
- ``generator``: a ``torch.Generator`` that seeds the engine's randomness for the call
  (an engine with a global RNG, like transformers, seeds it from this), or, for an
  adapter with ``row_generators``, a list of B entries (``torch.Generator`` or None:
  that row uses the engine's default randomness), as vLLM's per-request seeds;
- ``uniforms``: a ``reference.Uniforms`` (numpy) to decide with, for an adapter with
  ``injects``; None: the engine draws its own;
- ``num_drafts=`` [B] int64 tensor, only for an adapter with ``ragged``.

It returns ``token_ids`` [B, k+1] (accepted drafts, the emitted token, then -1) and
``num_accepted`` [B], as tensors or arrays.

An engine that takes logits and per-row sampling settings through its own metadata also
gives ``logits``::

    logits(target_logits [B, k+1, V] float32, draft_probs, draft_ids, settings, generator,
           uniforms=None) -> (token_ids, num_accepted)

with ``settings`` B ``core.processors.SamplingSettings`` (temperature, top-k, top-p per
row); the claimed target law of row b is ``core.processors.process_logits(target_logits[b],
settings[b])``.

``Adapter`` holds the function and the conventions the harness must know (module
``reference`` for the randomness conventions). ``call`` runs one call, converts the output
to numpy and checks its layout (``layout_problem``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cactus_theory.core.verify import PAD_ID
from cactus_theory.testing.conformance.reference import CONVENTIONS, INVERSE_CDF

VerifyFn = Callable[..., tuple[Any, Any]]

#: The bonus token comes from the engine itself ...
BONUS_ENGINE = "engine"
#: ... or is an input of the engine's verify step that the adapter supplies (vLLM's
#: rejection_sample takes the bonus sampled by its main sampler).
BONUS_SUPPLIED = "supplied"

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class ExtraCheck:
    """A property only some engines have (transformers' assisted generation end to end).

    ``run(level, draws, seed)`` returns a ``report.PropertyResult``; ``tests`` is how many
    chi-square tests it runs (they count in the suite's Bonferroni correction).
    """

    name: str
    tests: int
    run: Callable[[float, int, int], Any]


@dataclass
class Adapter:
    """An engine's verify step and what it declares (module docstring).

    name, version : what the report calls the engine.
    verify : the verify function (module docstring).
    rule : the spec of the rule the engine claims ("sps" for a lossless sampler).
    recovery : how the engine turns injected randomness into its emitted token
        (``reference.INVERSE_CDF`` or ``reference.EXPONENTIAL_RACE``).
    injects : the engine takes injected uniforms (exact-decision tests run).
    ragged : ``verify`` takes ``num_drafts=`` (drafts per row).
    row_generators : ``generator`` may be a list of per-row generators (vLLM's seeds).
    dtypes : input dtypes the engine takes besides float32.
    compute_dtype : the precision the engine decides in, by input dtype (near-tie window).
    bonus : ``BONUS_ENGINE`` or ``BONUS_SUPPLIED`` (then the bonus law is not the engine's).
    logits, logits_injects, logits_bonus : the logits path, whether it takes uniforms, and
        where its bonus comes from.
    greedy_rule : the rule the logits path claims for temperature-0 rows, when it is not
        ``rule`` (this project's vLLM plug-in leaves them to vLLM's greedy sampler).
    max_draws : cap on a law case's draws (an engine verifying one row per call is slow),
        with ``max_draws_reason``.
    extra : properties only this engine has.
    notes : the engine's conventions, written down for the report.
    """

    name: str
    verify: VerifyFn
    rule: str = "sps"
    version: str = ""
    recovery: str = INVERSE_CDF
    injects: bool = True
    ragged: bool = False
    row_generators: bool = False
    dtypes: tuple[str, ...] = ("float16", "bfloat16")
    compute_dtype: Callable[[str], str] = lambda dtype: "float32"
    bonus: str = BONUS_ENGINE
    logits: VerifyFn | None = None
    logits_injects: bool = False
    logits_bonus: str = BONUS_ENGINE
    greedy_rule: str | None = None
    max_draws: int | None = None
    max_draws_reason: str = ""
    extra: list[ExtraCheck] = field(default_factory=list)
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not callable(self.verify):
            raise ValueError(f"verify: expected a callable, got {type(self.verify).__name__}")
        if self.recovery not in CONVENTIONS:
            raise ValueError(f"recovery: expected one of {CONVENTIONS}, got {self.recovery!r}")
        unknown = [dtype for dtype in self.dtypes if dtype not in DTYPES]
        if unknown:
            raise ValueError(f"dtypes: unknown dtype {unknown[0]!r}; choose from {list(DTYPES)}")
        if self.logits is not None and not callable(self.logits):
            raise ValueError("logits: expected a callable or None")
        for key in ("bonus", "logits_bonus"):
            if getattr(self, key) not in (BONUS_ENGINE, BONUS_SUPPLIED):
                raise ValueError(f"{key}: expected {BONUS_ENGINE!r} or {BONUS_SUPPLIED!r}")


def as_numpy(value: Any) -> np.ndarray:
    """An engine's output (tensor, array or list) as an int64 numpy array."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().to(torch.int64).numpy()
    return np.asarray(value, dtype=np.int64)


def layout_problem(
    token_ids: np.ndarray,
    num_accepted: np.ndarray,
    draft_ids: np.ndarray,
    vocab: int,
    num_drafts: np.ndarray | None = None,
) -> str | None:
    """What is wrong with one output's layout, or None: shape [B, k+1]; num_accepted in
    [0, num_drafts]; the accepted positions hold the drafts; the emitted token lies in
    [0, V); -1 everywhere after it and nowhere before it."""
    batch, steps = draft_ids.shape
    if token_ids.shape != (batch, steps + 1):
        return f"token_ids has shape {token_ids.shape}, expected {(batch, steps + 1)}"
    if num_accepted.shape != (batch,):
        return f"num_accepted has shape {num_accepted.shape}, expected {(batch,)}"
    drafts = np.full(batch, steps) if num_drafts is None else num_drafts
    bad = (num_accepted < 0) | (num_accepted > drafts)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        return f"row {row}: num_accepted {num_accepted[row]} outside [0, {drafts[row]}]"
    positions = np.arange(steps + 1)[None, :]
    accepted = positions[:, :steps] < num_accepted[:, None]
    wrong = accepted & (token_ids[:, :steps] != draft_ids)
    if wrong.any():
        row = int(np.flatnonzero(wrong.any(axis=1))[0])
        return f"row {row}: an accepted position does not hold its draft: {token_ids[row]}"
    emitted = token_ids[np.arange(batch), num_accepted]
    outside = (emitted < 0) | (emitted >= vocab)
    if outside.any():
        row = int(np.flatnonzero(outside)[0])
        return f"row {row}: emitted id {emitted[row]} outside [0, {vocab}): {token_ids[row]}"
    after = positions > num_accepted[:, None]
    padded = np.where(after, token_ids == PAD_ID, True)
    if not padded.all():
        row = int(np.flatnonzero(~padded.all(axis=1))[0])
        return f"row {row}: ids after the emitted token are not -1: {token_ids[row]}"
    return None


@dataclass
class LayoutLog:
    """Layout problems seen in every call of a run (the ``output-layout`` property)."""

    calls: int = 0
    rows: int = 0
    problems: list[dict[str, Any]] = field(default_factory=list)

    def record(self, problem: str | None, where: str, rows: int) -> None:
        self.calls += 1
        self.rows += rows
        if problem is not None and len(self.problems) < 5:
            self.problems.append({"where": where, "problem": problem})


def call(
    function: VerifyFn,
    log: LayoutLog,
    where: str,
    first: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_ids: torch.Tensor,
    *args: Any,
    num_drafts: np.ndarray | None = None,
    **kwargs: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """Call ``function(first, draft_probs, draft_ids, *args, **kwargs)`` (``num_drafts``
    passed as a tensor when given), return (token_ids, num_accepted) as numpy, and log the
    output's layout problems under ``where``."""
    if num_drafts is not None:
        kwargs["num_drafts"] = torch.as_tensor(num_drafts, dtype=torch.int64)
    token_ids, num_accepted = function(first, draft_probs, draft_ids, *args, **kwargs)
    token_ids, num_accepted = as_numpy(token_ids), as_numpy(num_accepted).reshape(-1)
    ids = draft_ids.cpu().numpy()
    problem = layout_problem(token_ids, num_accepted, ids, first.shape[-1], num_drafts)
    log.record(problem, where, ids.shape[0])
    return token_ids, num_accepted


def generators_for(seeds: Sequence[int | None]) -> list[torch.Generator | None]:
    """Per-row generators from seeds (None: the engine's default randomness)."""
    return [None if seed is None else torch.Generator().manual_seed(int(seed)) for seed in seeds]
