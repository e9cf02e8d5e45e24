"""Adapters for transformers' speculative sampling (``generation.utils._speculative_sampling``).

``_speculative_sampling(candidate_input_ids [1, n + k], candidate_logits [1, k, V],
candidate_length k, new_logits [1, k+1, V], assistant_ensemble_weight=None)`` returns
(valid_tokens [1, m+1], n_matches m). transformers names the target p and the draft q
(the reverse of the paper). Its conventions, as read from the installed source:

- logits in, ``softmax`` inside (so rows are renormalised in the input's dtype);
- batch 1: the adapter loops over rows (and so takes ragged rows: candidate_length =
  num_drafts[b]);
- randomness from torch's *global* RNG: ``torch.rand_like`` for the k accept coins
  (accept iff r < target_n / draft_n, our convention), ``torch.multinomial`` for the
  residual (target − draft)_+ / Σ or the bonus row. In law mode the adapter seeds the
  global RNG from the harness's generator; in exact mode it runs the function with a
  stand-in for the ``torch`` module transformers' code names, whose ``rand_like`` returns
  the injected accept uniforms (in the dtype transformers asks for) and whose
  ``multinomial`` draws by inverse CDF with the injected sample uniform (after the real
  ``torch.multinomial`` has checked the row, so a NaN row still raises as it does in
  transformers). Everything else is transformers' own code.
- since 5.25 (not in 5.17-5.19): ``assistant_ensemble_weight`` w, DIVERSE's static
  ensemble, verifies against v = w · target + (1 − w) · draft: our ``interp`` rule with
  alpha = 1 − w (accept min(1, 1 − w + w · target_n / draft_n); residual ∝
  (target − draft)_+, which is ∝ (v − draft)_+).

Assisted generation end to end (``assisted``): ``model.generate(assistant_model=...)`` with
two mock causal LMs whose next-token logits are fixed vectors (a tiny Llama whose logits
are replaced), so the verifier's law at every position is q_T = softmax(L_target / T) and
a conforming assistant drafts from p_T = softmax(L_draft / T). ``assisted-draft-law``
tests the drafted tokens against p_T (and reports the fit to T², the processors applied
twice); ``assisted-output-law`` tests the emitted tokens against q_T (lossless, and with
fixed logits the emitted tokens are i.i.d. q_T).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from cactus_theory.testing.conformance.adapter import Adapter
from cactus_theory.testing.conformance.reference import Uniforms

Tensor = torch.Tensor
#: Law-case draws cap: the function verifies one row per call (about 130 µs on a 2-core
#: CPU), so 10^6 rows per case would take minutes.
MAX_DRAWS = 100_000


def version() -> str:
    import transformers

    return transformers.__version__


def has_ensemble_weight() -> bool:
    """Whether the installed ``_speculative_sampling`` takes ``assistant_ensemble_weight``."""
    from transformers.generation import utils

    return "assistant_ensemble_weight" in inspect.signature(utils._speculative_sampling).parameters


class _InjectedTorch:
    """The ``torch`` module as transformers' code sees it during an exact-mode call: the
    same module, but ``rand_like`` and ``multinomial`` return the injected draws."""

    def __init__(self, accept: np.ndarray, sample: float) -> None:
        self._accept = accept  # [k] float64
        self._sample = sample

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    def rand_like(self, like: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        values = torch.as_tensor(self._accept[: like.numel()], dtype=torch.float64)
        return values.reshape(like.shape).to(like.dtype)

    def multinomial(self, probs: Tensor, num_samples: int, *args: Any, **kwargs: Any) -> Tensor:
        torch.multinomial(probs, num_samples)  # transformers' own validation of the row
        rows = probs.reshape(-1, probs.shape[-1]).to(torch.float64)  # [1, V]
        cumulative = rows.cumsum(-1)
        threshold = self._sample * cumulative[:, -1:]
        index = (cumulative <= threshold).sum(-1)
        last = rows.shape[-1] - 1 - torch.argmax((rows > 0).flip(-1).to(torch.int64), dim=-1)
        index = torch.where(index >= rows.shape[-1], last, index)
        return index.reshape(*probs.shape[:-1], 1)


@contextlib.contextmanager
def _torch_as_seen(stand_in: object) -> Iterator[None]:
    from transformers.generation import utils

    original = utils.torch
    utils.torch = stand_in  # type: ignore[assignment]
    try:
        yield
    finally:
        utils.torch = original


def _logits(probs: Tensor) -> Tensor:
    """log(probs) in the input's dtype (-inf where 0): softmax gives the row back."""
    return torch.log(probs)


def verify_with(weight: float | None = None):
    """The harness's verify function for ``_speculative_sampling`` (ensemble weight
    ``weight`` when given)."""
    from transformers.generation import utils

    keywords = {} if weight is None else {"assistant_ensemble_weight": weight}

    def verify(
        target_probs: Tensor,
        draft_probs: Tensor,
        draft_ids: Tensor,
        generator: torch.Generator,
        uniforms: Uniforms | None = None,
        num_drafts: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        batch, steps = draft_ids.shape
        counts = [steps] * batch if num_drafts is None else num_drafts.tolist()
        token_ids = torch.full((batch, steps + 1), -1, dtype=torch.int64)
        num_accepted = torch.zeros(batch, dtype=torch.int64)
        target_logits, draft_logits = _logits(target_probs), _logits(draft_probs)
        if uniforms is None:
            torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
        for row in range(batch):
            count = int(counts[row])
            candidates = draft_ids[row : row + 1, :count]
            context = contextlib.nullcontext()
            if uniforms is not None:
                stand_in = _InjectedTorch(uniforms.accept[row, :count], float(uniforms.sample[row]))
                context = _torch_as_seen(stand_in)
            with context:
                valid, matches = utils._speculative_sampling(
                    candidates,
                    draft_logits[row : row + 1, :count],
                    count,
                    target_logits[row : row + 1, : count + 1],
                    **keywords,
                )
            emitted = valid.reshape(-1)
            token_ids[row, : emitted.numel()] = emitted
            num_accepted[row] = int(matches)
        return token_ids, num_accepted

    return verify


NOTES = (
    "transformers: logits in (softmax in the input dtype), batch 1 (looped), global RNG: "
    "rand_like coins (accept iff r < target_n/draft_n), multinomial recovery; exact mode "
    "injects both through a stand-in for the torch module its code names",
)


def adapter(weight: float | None = None, assisted: bool = True) -> Adapter:
    """``_speculative_sampling`` claiming SpS, or, with ``weight``, DIVERSE's ensemble
    claiming ``interp:alpha=1-w``; ``assisted`` adds the end-to-end properties."""
    rule = "sps" if weight is None else f"interp:alpha={1.0 - weight:g}"
    name = "transformers" if weight is None else f"transformers (ensemble w={weight:g})"
    from cactus_theory.testing.conformance.adapters import assisted as end_to_end

    extra = [] if not assisted else end_to_end.checks()
    return Adapter(
        name=name,
        verify=verify_with(weight),
        rule=rule,
        version=version(),
        ragged=True,
        compute_dtype=lambda dtype: dtype,
        max_draws=MAX_DRAWS,
        max_draws_reason="one row per call (about 130 µs each)",
        extra=extra,
        notes=NOTES,
    )
