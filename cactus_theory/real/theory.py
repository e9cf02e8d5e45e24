"""The theory against the decoder: a pool's exact acceptance against what decoding measures.

For a rule and k, on the same prompts and sampling settings, these numbers estimate the
acceptance at draft position 1, and comparing them separates sampling noise from the
reasons the pool and the decoder differ:

- **pool α** = E_c[a(q_c, p_c)] over the positions c of a pool (``real.pools``: the
  verifier's own sampled continuations, every position, teacher-forced), with a(q, p) =
  Σ_n p_n a_n the rule's exact acceptance at a position;
- **measured α₁** = (verify steps that accepted draft 1) / (verify steps that drafted it),
  from a speculative decode of the same prompts (``DecodeResult.alpha_by_position[0]``);
- **α at the step starts** = the mean of a(q, p) at exactly the positions where the
  decoder's verify steps started, on the decoder's own sequences teacher-forced
  (``pools.rows_for_sequences``), and **α at all decoded positions** = its mean over every
  position of those sequences;
- **pool α at simulated step starts**: the pool's exact acceptance averaged over where a
  decoder's steps would start on the pool's own trajectories (``simulated_step_starts``:
  no decoder needed; exact in law for sps with a draft whose deeper positions read the
  same rows; a feature draft's deeper positions accept less, so there the simulated steps
  run further than the decoder's and the selection below comes out too strong).

A verify step s of a row starts at generated position t_s = Σ_{s' < s} (L_{s'} + 1), L the
accepted drafts of step s' (``step_starts``): each step commits its accepted drafts and one
more token (the residual or the bonus). Rows never start before position 0 (the decoder
emits no token at prefill) and a row that stops (EOS, budget) takes no further step, so
the sum is exact for every step that ran.

What the comparisons mean:

- measured α₁ − α at step starts is pure sampling noise: given the history, step s accepts
  draft 1 with probability a_s exactly (the decoder's q and p at t_s are the teacher-forced
  rows), so the difference is a martingale mean with standard error
  sqrt(Σ_s a_s (1 − a_s)) / n, n the steps that drafted;
- α at all decoded positions − α at step starts is the **selection of step starts**: steps
  start after a rejection or a full block, so stretches where the draft agrees are crossed
  in few steps and stretches where it disagrees in many, and hard positions are
  over-represented among step starts (a length-biased sample); the last position of a row
  is never drafted (k_b = 0 there);
- pool α − α at all decoded positions is trajectory noise for a lossless rule (both are
  samples of the verifier's law) and, for a lossy rule, also the **trajectory shift**: the
  rule emits another law, so its contexts are not the pool's.

Predicted AL is Leviathan's Σ_{j=1..k_b} α^j with the pool's α, averaged over the
decoder's steps with each step's own number of drafts k_b (k except near a row's budget);
it assumes every draft position accepts like the first, and deeper positions of the
feature draft are weaker (``real.pools`` module docstring), as ``alpha_by_position`` shows.

Standard errors are by prompt (clusters): positions and steps of one prompt are not
independent. A ratio R = Σ_i x_i / Σ_i y_i over prompts i has
SE² = m/(m−1) Σ_i (x_i − R y_i)² / (Σ_i y_i)², m prompts; the difference of two ratios on
the same prompts (pool α − measured α₁, paired) uses the per-prompt differences of those
linearised terms. The binomial SE sqrt(α(1 − α)/n) (steps independent) is given beside.

Where things live: ``real.verify_steps`` (the step starts, measured and simulated),
``real.cluster_se`` (the cluster SEs), ``real.theory_decode`` (the settings and the cached
decodes); this module holds the exact acceptances per position and the comparison.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cactus_theory.core import law
from cactus_theory.core.rules import Rule, parse, spec_of
from cactus_theory.real import pools
from cactus_theory.real.cluster_se import by_cluster, paired_difference_se, ratio_se, z_score
from cactus_theory.real.pools import RealPool
from cactus_theory.real.theory_decode import (
    DECODE_CODE,
    DECODE_FORMAT,
    Decoded,
    TheorySettings,
    decode,
    decode_batch,
    decode_generator,
    decode_key,
)
from cactus_theory.real.tradeoff import PACKED_CHUNK as PACKED_ROWS
from cactus_theory.real.tradeoff import WHOLE_CHUNK as WHOLE_ROWS
from cactus_theory.real.verify_steps import VerifySteps, simulated_step_starts, step_starts

Array = np.ndarray

#: The rules compared by default: lossless SpS and the paper's rules at δ = 1.
DEFAULT_RULES = ("sps", "cactus:delta=1", "cactus-exact:delta=1")


def restrict(pool: RealPool, settings: TheorySettings) -> RealPool:
    """The positions of ``pool`` that a comparison with ``settings`` decodes: generated
    positions 0 .. ``max_new_tokens`` − 1 of the first ``num_prompts`` prompts. The first M
    tokens of a continuation have the same law whatever budget it was sampled with, so a
    pool of the same prompts and sampling setting with longer continuations serves (the
    report compares on its trade-off pool). ValueError when the sampling settings differ
    or the pool's continuations are shorter than ``max_new_tokens``."""
    built = pool.info.get("settings", {})
    if built.get("sampling") not in (None, settings.sampling.label):
        raise ValueError(
            f"pool: sampled with {built['sampling']}, the comparison decodes with "
            f"{settings.sampling.label}"
        )
    if built.get("max_new_tokens", settings.max_new_tokens) < settings.max_new_tokens:
        raise ValueError(
            f"max_new_tokens: the pool's continuations have {built['max_new_tokens']} tokens, "
            f"fewer than the {settings.max_new_tokens} the comparison decodes"
        )
    chosen = pool.select(
        (pool.prompt < settings.num_prompts) & (pool.step < settings.max_new_tokens)
    )
    if len(chosen) == 0:
        raise ValueError("pool: holds no position of the compared prompts")
    return chosen


def exact_acceptance(pool: RealPool, rule: Rule | str) -> Array:
    """a(q_c, p_c) = Σ_n p_n a_n at every position c of ``pool`` [N] (whole rows unless
    the rule declares ``support_only``, as in ``tradeoff.rule_stats``)."""
    chosen = parse(rule) if isinstance(rule, str) else rule
    whole = pool.ids is not None and not chosen.support_only
    parts = []
    for part in pool.chunks(WHOLE_ROWS if whole else PACKED_ROWS):
        target, draft = pool.rows(part, full=whole)
        parts.append(law.acceptance_rows(chosen, target, draft))
    return np.concatenate(parts) if parts else np.zeros(0)


def emitted_acceptance(pool: RealPool, rule: Rule | str) -> Array:
    """r_c = p_c(x_c) a_c(x_c) / μ_c(x_c) at every position c of ``pool`` [N], x_c the
    pool's token there: the probability that a step starting at c accepted its draft,
    given that it emitted x_c (μ the rule's emitted law; for sps μ = q)."""
    chosen = parse(rule) if isinstance(rule, str) else rule
    whole = pool.ids is not None and not chosen.support_only
    parts = []
    for part in pool.chunks(WHOLE_ROWS if whole else PACKED_ROWS):
        target, draft = pool.rows(part, full=whole)
        accept = chosen.accept_probs(target, draft)  # [n, W]
        emitted = law.output_law_rows(chosen, target, draft)  # [n, W]
        tokens = pool.token[part].astype(np.int64)
        if whole or pool.ids is None:
            column = tokens
        else:
            column = np.argmax(pool.ids[part] == tokens[:, None], axis=1)
        index = np.arange(len(tokens))
        mass = emitted[index, column]
        share = draft[index, column] * accept[index, column] / np.where(mass > 0, mass, 1.0)
        parts.append(np.clip(np.where(mass > 0, share, 0.0), 0.0, 1.0))
    return np.concatenate(parts) if parts else np.zeros(0)


def compare(
    pool: RealPool,
    decoded: Decoded,
    rule: Rule | str,
    k: int,
    max_new_tokens: int | None = None,
    replicates: int = 64,
) -> dict:
    """One rule's row: pool α, measured α₁, α at the step starts and at all decoded
    positions, their differences in standard errors, predicted and measured AL (module
    docstring); with ``max_new_tokens``, also the pool's α at simulated step starts
    (``simulated_step_starts``). ``pool.prompt`` and ``decoded.prompt`` must index the
    same prompts."""
    chosen = parse(rule) if isinstance(rule, str) else rule
    if len(pool) == 0:
        raise ValueError("pool: has no positions")
    steps = decoded.steps
    drafted = steps.drafts >= 1  # steps that reached draft position 1
    if not drafted.any():
        raise ValueError("decoded: no verify step drafted a token (max_new_tokens 1?)")
    labels = np.union1d(np.unique(pool.prompt), decoded.prompt)
    pool_acceptance = exact_acceptance(pool, chosen)  # [N]
    pool_sum = by_cluster(pool_acceptance, pool.prompt, labels)
    pool_count = by_cluster(np.ones(len(pool)), pool.prompt, labels)
    step_prompt = decoded.prompt[steps.row]
    accepted_first = (steps.accepted >= 1) & drafted
    measured_sum = by_cluster(accepted_first, step_prompt, labels)
    measured_count = by_cluster(drafted, step_prompt, labels)
    decoded_acceptance = exact_acceptance(decoded.rows, chosen)  # [M]
    at_starts = decoded_acceptance[decoded.position_index(steps.row, steps.start)][drafted]
    row_prompt = decoded.prompt[decoded.rows.prompt]
    all_sum = by_cluster(decoded_acceptance, row_prompt, labels)
    all_count = by_cluster(np.ones(len(decoded_acceptance)), row_prompt, labels)
    start_sum = by_cluster(at_starts, step_prompt[drafted], labels)

    n = int(drafted.sum())
    pool_alpha = float(pool_acceptance.mean())
    measured = float(accepted_first.sum() / n)
    starts_alpha = float(at_starts.mean())
    all_alpha = float(decoded_acceptance.mean())
    pool_vs_measured_se = paired_difference_se(pool_sum, pool_count, measured_sum, measured_count)
    bernoulli = np.clip(at_starts, 0.0, 1.0)  # float rounding can pass 1 by an ulp
    martingale_se = float(math.sqrt(np.sum(bernoulli * (1 - bernoulli))) / n)
    selection_se = paired_difference_se(all_sum, all_count, start_sum, measured_count)

    steps_al = steps.accepted.astype(float)
    step_sum = by_cluster(steps_al, decoded.prompt[steps.row], labels)
    step_count = by_cluster(np.ones(len(steps_al)), decoded.prompt[steps.row], labels)
    measured_al = float(steps_al.mean())
    measured_al_se = ratio_se(step_sum, step_count)
    predicted = float(np.mean([_al(pool_alpha, int(d)) for d in steps.drafts]))
    slope = float(np.mean([_al_slope(pool_alpha, int(d)) for d in steps.drafts]))
    pool_se = ratio_se(pool_sum, pool_count)
    alpha_by_position = []
    for j in range(1, k + 1):
        reached = (steps.drafts >= j) & (steps.accepted >= j - 1)
        taken = (steps.drafts >= j) & (steps.accepted >= j)
        alpha_by_position.append(float(taken.sum() / reached.sum()) if reached.any() else None)
    simulated = {}
    if max_new_tokens is not None:
        starts, weights = simulated_step_starts(
            pool, emitted_acceptance(pool, chosen), k, max_new_tokens, replicates
        )
        simulated_sum = by_cluster(pool_acceptance[starts] * weights, pool.prompt[starts], labels)
        simulated_count = by_cluster(weights, pool.prompt[starts], labels)
        simulated_alpha = float(simulated_sum.sum() / simulated_count.sum())
        simulated_se = paired_difference_se(
            simulated_sum, simulated_count, measured_sum, measured_count
        )
        simulated = {
            "pool_alpha_simulated_starts": simulated_alpha,
            "simulated_minus_measured_se": simulated_se,
            "simulated_z": z_score(simulated_alpha - measured, simulated_se),
        }
    return {
        "rule": spec_of(chosen),
        "label": chosen.label,
        "k": k,
        "positions": len(pool),
        "decoded_positions": len(decoded_acceptance),
        "steps": len(steps_al),
        "drafted_steps": n,
        "prompts": len(labels),
        "pool_alpha": pool_alpha,
        "pool_alpha_se": pool_se,
        "measured_alpha": measured,
        "measured_alpha_se": ratio_se(measured_sum, measured_count),
        "measured_alpha_binomial_se": math.sqrt(measured * (1 - measured) / n),
        "pool_minus_measured": pool_alpha - measured,
        "pool_minus_measured_se": pool_vs_measured_se,
        "pool_z": z_score(pool_alpha - measured, pool_vs_measured_se),
        "alpha_all_positions": all_alpha,
        "alpha_step_starts": starts_alpha,
        "starts_minus_measured_se": martingale_se,
        "starts_z": z_score(starts_alpha - measured, martingale_se),
        "selection": all_alpha - starts_alpha,
        "selection_se": selection_se,
        "trajectory": pool_alpha - all_alpha,
        "alpha_by_position": alpha_by_position,
        "predicted_al": predicted,
        "predicted_al_se": abs(slope) * pool_se if math.isfinite(pool_se) else math.nan,
        "predicted_al_full_k": _al(pool_alpha, k),
        "measured_al": measured_al,
        "measured_al_se": measured_al_se,
        **simulated,
    }


def _al(alpha: float, drafts: int) -> float:
    """Σ_{j=1..drafts} α^j."""
    return float(sum(alpha**j for j in range(1, drafts + 1)))


def _al_slope(alpha: float, drafts: int) -> float:
    """d/dα Σ_{j=1..drafts} α^j (the delta method's factor)."""
    return float(sum(j * alpha ** (j - 1) for j in range(1, drafts + 1)))


def run(
    setups: dict,
    settings: TheorySettings,
    rules: Sequence[str],
    cache: Path | None,
    *,
    device: str,
    dtype: str,
    progress: bool = True,
) -> dict:
    """Every (dataset, rule) row: ``setups`` maps a dataset name to its ``Setup``; each
    dataset's pool is built once (cached) and every rule decoded (cached)."""
    if not rules:
        raise ValueError("rule: give at least one rule")
    chosen = [parse(rule) for rule in rules]
    rows, pool_info = [], {}
    for name, setup in setups.items():
        pool = pools.build_pool(
            setup,
            settings.pool_settings(),
            None if cache is None else Path(cache) / "pools",
            device=device,
            dtype=dtype,
            progress=progress,
            name=name,
        )
        pool_info[name] = {
            key: pool.info.get(key)
            for key in ("positions", "prompts", "generation_seconds", "teacher_forcing_seconds")
        }
        for rule in chosen:
            decoded = decode(
                setup, settings, rule, cache, device=device, dtype=dtype, progress=progress
            )
            row = compare(pool, decoded, rule, settings.k, settings.max_new_tokens)
            rows.append({"dataset": name, **row})
    return {
        "settings": {**settings.__dict__, "sampling": settings.sampling.label},
        "device": device,
        "dtype": dtype,
        "pools": pool_info,
        "rows": rows,
    }


__all__ = [
    "DECODE_CODE",
    "DECODE_FORMAT",
    "DEFAULT_RULES",
    "Decoded",
    "TheorySettings",
    "VerifySteps",
    "compare",
    "decode",
    "decode_batch",
    "decode_generator",
    "decode_key",
    "emitted_acceptance",
    "exact_acceptance",
    "paired_difference_se",
    "ratio_se",
    "restrict",
    "run",
    "simulated_step_starts",
    "step_starts",
]
