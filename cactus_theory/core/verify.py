"""The numpy reference of one verification step: scan k drafts, stop at the first rejection.

This is the oracle for the torch sampler (``cactus_theory.sampler.verify``) and the engine of the
Monte Carlo simulations. Randomness enters only through explicit uniforms, so the same
uniforms give the same tokens here and in torch:

- position i is accepted iff ``accept_uniforms[b, i] < a_i`` (the rule's acceptance of the
  drafted token, ``Rule.accept_probs``);
- the token emitted at the first rejected position, or the bonus token after k
  acceptances, is drawn by inverse CDF with ``sample_uniforms[b]``: the first index whose
  cumulative probability exceeds u · total, so a zero-probability token is never drawn.

Output layout (vLLM / FlashInfer): ``token_ids [B, k+1]`` holds the accepted drafts, then
the emitted (residual or bonus) token, then ``PAD_ID`` (−1) padding; ``num_accepted [B]`` counts the
accepted drafts (0..k).
"""

from __future__ import annotations

import numpy as np

from cactus_theory.core import validate
from cactus_theory.core.rules.base import Rule

Array = np.ndarray

#: The id that pads ``token_ids`` after the emitted token (vLLM's placeholder).
PAD_ID = -1


def inverse_cdf(probs: Array, uniforms: Array) -> Array:
    """Token ids drawn from rows ``probs [..., V]`` with uniforms in [0, 1) (inverse CDF).

    Returns the first index whose cumulative sum exceeds u · Σ row; rounding past the end
    falls back to the last index with positive probability, so the result always has
    positive probability and lies in [0, V).
    """
    cumulative = np.cumsum(probs, axis=-1)
    threshold = uniforms * cumulative[..., -1]
    index = (cumulative <= threshold[..., None]).sum(axis=-1)
    size = probs.shape[-1]
    last_positive = size - 1 - np.argmax((probs > 0)[..., ::-1], axis=-1)
    return np.where(index >= size, last_positive, index)


def verify_block(
    rule: Rule,
    target_probs: object,
    draft_probs: object,
    draft_ids: object,
    accept_uniforms: object,
    sample_uniforms: object,
) -> tuple[Array, Array]:
    """Verify k drafted tokens per row against the verifier; see the module docstring.

    Shapes: target_probs [B, k+1, V] (the last row is the bonus distribution),
    draft_probs [B, k, V], draft_ids [B, k], accept_uniforms [B, k], sample_uniforms [B].
    """
    target = validate.distribution("target_probs", target_probs)
    draft = validate.distribution("draft_probs", draft_probs)
    if target.ndim != 3 or draft.ndim != 3:
        raise ValueError("target_probs: expected [B, k+1, V] and draft_probs [B, k, V]")
    batch, steps, vocab = draft.shape
    if target.shape != (batch, steps + 1, vocab):
        raise ValueError(
            f"target_probs: shape {target.shape} does not match draft_probs {draft.shape}"
            " (expected [B, k+1, V])"
        )
    ids = np.asarray(draft_ids)
    if ids.shape != (batch, steps) or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"draft_ids: expected integer ids of shape {(batch, steps)}, got {ids.shape}"
        )
    if np.any((ids < 0) | (ids >= vocab)):
        raise ValueError(f"draft_ids: ids must lie in [0, {vocab})")
    accept_u = validate.unit_interval_array("accept_uniforms", accept_uniforms)
    sample_u = validate.unit_interval_array("sample_uniforms", sample_uniforms)
    if accept_u.shape != (batch, steps) or sample_u.shape != (batch,):
        raise ValueError(
            f"accept_uniforms: expected shape {(batch, steps)} and sample_uniforms {(batch,)}"
        )

    accept = rule.accept_probs(target[:, :steps], draft)  # [B, k, V]
    drafted_accept = np.take_along_axis(accept, ids[..., None], axis=-1)[..., 0]
    accepted = accept_u < drafted_accept
    num_accepted = np.cumprod(accepted, axis=1).sum(axis=1)

    rows = np.arange(batch)
    stop = np.minimum(num_accepted, steps - 1)
    rejected = num_accepted < steps
    emit_law = target[rows, num_accepted].copy()  # bonus rows; replaced where rejected
    if np.any(rejected):
        where = rows[rejected]
        emit_law[where] = rule.residuals_for(
            target[where, stop[where]], draft[where, stop[where]], ids[where, stop[where]]
        )
    emitted = inverse_cdf(emit_law, sample_u)

    token_ids = np.full((batch, steps + 1), PAD_ID, dtype=np.int64)
    positions = np.arange(steps + 1)
    keep = positions[None, :steps] < num_accepted[:, None]
    token_ids[:, :steps] = np.where(keep, ids, PAD_ID)
    token_ids[rows, num_accepted] = emitted
    return token_ids, num_accepted
