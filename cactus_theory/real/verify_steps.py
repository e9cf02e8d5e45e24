"""Where a speculative decoder's verify steps start, measured and simulated.

A verify step s of a row starts at generated position t_s = Σ_{s' < s} (L_{s'} + 1), L the
accepted drafts of step s' (``step_starts``): each step commits its accepted drafts and one
more token (the residual or the bonus). Rows never start before position 0 (the decoder
emits no token at prefill) and a row that stops (EOS, budget) takes no further step, so
the sum is exact for every step that ran.

``simulated_step_starts`` runs the same step process on a pool's own trajectories, a step
at t accepting draft j with the probability r at t + j − 1 that the emitted token there
was an accepted draft: no decoder needed (``cactus_theory.real.theory`` uses both).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cactus_theory.real.pools import RealPool

Array = np.ndarray


@dataclass(frozen=True)
class VerifySteps:
    """Every verify step that ran, row by row in step order: ``row`` [S] (the batch row),
    ``start`` [S] (the generated position it started at), ``accepted`` [S] (L_s) and
    ``drafts`` [S] (k_b)."""

    row: Array
    start: Array
    accepted: Array
    drafts: Array


def step_starts(accepted_lengths, draft_counts) -> VerifySteps:
    """The verify steps of a decode (``DecodeResult.accepted_lengths`` and
    ``draft_counts``, [steps, B], −1 where a row was not active) with the position each
    started at: t_s = Σ_{s' < s} (L_{s'} + 1) over the row's earlier steps (module
    docstring)."""
    accepted = np.asarray(accepted_lengths, dtype=np.int64)
    drafts = np.asarray(draft_counts, dtype=np.int64)
    if accepted.ndim != 2:
        raise ValueError(f"accepted_lengths: must be [steps, B], got shape {accepted.shape}")
    if drafts.shape != accepted.shape:
        raise ValueError(
            f"draft_counts: shape {drafts.shape} differs from accepted_lengths' {accepted.shape}"
        )
    active = accepted >= 0  # [steps, B]
    if np.any(active & ((drafts < 0) | (accepted > drafts))):
        raise ValueError("accepted_lengths: a step accepted more drafts than it drafted")
    first_inactive = np.argmax(~active, axis=0)  # [B] (0 when a row never stopped)
    active_until = np.where((~active).any(axis=0), first_inactive, active.shape[0])  # [B]
    if np.any(active & (np.arange(active.shape[0])[:, None] >= active_until[None, :])):
        raise ValueError("accepted_lengths: a row became active again after it stopped")
    advance = np.where(active, accepted + 1, 0)  # [steps, B] tokens each step committed
    starts = np.cumsum(advance, axis=0) - advance  # [steps, B] exclusive prefix sums
    rows, step_index = np.nonzero(active.T)  # row-major: each row's steps in order
    return VerifySteps(
        row=rows,
        start=starts[step_index, rows],
        accepted=accepted[step_index, rows],
        drafts=drafts[step_index, rows],
    )


def simulated_step_starts(
    pool: RealPool,
    accept_given_token: Array,  # [N] r_c (``emitted_acceptance``)
    k: int,
    max_new_tokens: int,
    replicates: int = 64,
    seed: int = 0,
) -> tuple[Array, Array]:
    """Where a decoder's verify steps would start on the pool's own trajectories: per
    trajectory, ``replicates`` runs of the step process (a step at t drafts k_b = min(k,
    max_new_tokens − t − 1), accepts draft j with probability r at t + j − 1 while the
    previous ones were accepted, and the next step starts after the accepted drafts and
    one more token). Returns (pool index of every simulated step start with k_b >= 1,
    its weight 1/replicates). For sps the emitted tokens have the verifier's law and
    r_c = min(p_c, q_c)(x_c)/q_c(x_c) is the exact chance that x_c was an accepted draft
    given the trajectory, so for a draft whose deeper positions read the same rows (an
    independent draft model) this is the decoder's own law of step starts; a feature
    draft's deeper positions accept less, which the simulation does not see."""
    if replicates < 1:
        raise ValueError(f"replicates: must be >= 1, got {replicates}")
    rng = np.random.default_rng(seed)
    order = np.lexsort((pool.step, pool.prompt))
    prompts = pool.prompt[order]
    boundaries = np.flatnonzero(np.diff(prompts)) + 1
    chosen = []
    for trajectory in np.split(order, boundaries):
        length = len(trajectory)
        probabilities = accept_given_token[trajectory]
        for _ in range(replicates):
            t = 0
            while t < length:
                drafts = min(k, max_new_tokens - t - 1)
                if drafts >= 1:
                    chosen.append(trajectory[t])
                accepted = 0
                while accepted < drafts and t + accepted < length:
                    if rng.random() >= probabilities[t + accepted]:
                        break
                    accepted += 1
                t += accepted + 1
    return np.asarray(chosen, dtype=np.int64), np.full(len(chosen), 1.0 / replicates)
