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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cactus_theory.core import law, validate
from cactus_theory.core.processors import PAPER_SETTING, SamplingSettings
from cactus_theory.core.rules import Rule, parse, spec_of
from cactus_theory.real import pools
from cactus_theory.real.pools import RealPool
from cactus_theory.real.tradeoff import PACKED_CHUNK as PACKED_ROWS
from cactus_theory.real.tradeoff import WHOLE_CHUNK as WHOLE_ROWS
from cactus_theory.util import provenance

Array = np.ndarray

#: The rules compared by default: lossless SpS and the paper's rules at δ = 1.
DEFAULT_RULES = ("sps", "cactus:delta=1", "cactus-exact:delta=1")
#: Bumped when what a cached decode holds changes.
DECODE_FORMAT = 1
#: The code a cached decode depends on (beside ``DECODE_FORMAT``).
DECODE_CODE = provenance.source_fingerprint(
    "cactus_theory/decode",
    "cactus_theory/sampler",
    "cactus_theory/core/rules",
    "cactus_theory/real/pools.py",
)


@dataclass(frozen=True)
class TheorySettings:
    """What one comparison decodes: k drafts per step, ``num_prompts`` prompts of
    ``max_new_tokens`` tokens, in batches of ``batch_size`` (a row's law does not depend
    on the batch), from ``seed``."""

    k: int = 3
    num_prompts: int = 24
    max_new_tokens: int = 64
    sampling: SamplingSettings = PAPER_SETTING
    batch_size: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("k", "num_prompts", "max_new_tokens", "batch_size"):
            object.__setattr__(self, name, validate.positive_int(name, getattr(self, name)))
        if self.sampling.temperature == 0:
            raise ValueError("temperature: the comparison needs sampled decoding (temperature > 0)")

    def pool_settings(self) -> pools.PoolSettings:
        """The pool of the same prompts and settings (every prompt, every position)."""
        return pools.PoolSettings(
            positions=self.num_prompts * self.max_new_tokens,
            num_prompts=self.num_prompts,
            max_new_tokens=self.max_new_tokens,
            sampling=self.sampling,
            batch_size=self.batch_size,
            seed=self.seed,
        )


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


# --- verify steps -------------------------------------------------------------------------


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


# --- exact acceptance per position --------------------------------------------------------


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


# --- cluster statistics -------------------------------------------------------------------


def _by_cluster(values: Array, clusters: Array, labels: Array) -> Array:
    """Σ of ``values`` per label of ``labels`` (0 for a label with no value)."""
    index = np.searchsorted(labels, clusters)
    return np.bincount(index, weights=np.asarray(values, dtype=np.float64), minlength=len(labels))


def ratio_se(numerators: Array, denominators: Array) -> float:
    """The cluster SE of R = Σ x_i / Σ y_i over clusters i (module docstring); NaN with
    fewer than 2 clusters."""
    x, y = np.asarray(numerators, float), np.asarray(denominators, float)
    m = len(x)
    if m < 2 or y.sum() <= 0:
        return math.nan
    ratio = x.sum() / y.sum()
    return float(math.sqrt(m / (m - 1) * np.sum((x - ratio * y) ** 2)) / y.sum())


def paired_difference_se(x_a: Array, y_a: Array, x_b: Array, y_b: Array) -> float:
    """The cluster SE of Σx_a/Σy_a − Σx_b/Σy_b with both ratios over the same clusters
    (index i): the per-cluster difference of the linearised terms (module docstring)."""
    x_a, y_a, x_b, y_b = (np.asarray(v, float) for v in (x_a, y_a, x_b, y_b))
    m = len(x_a)
    if m < 2 or y_a.sum() <= 0 or y_b.sum() <= 0:
        return math.nan
    ratio_a, ratio_b = x_a.sum() / y_a.sum(), x_b.sum() / y_b.sum()
    terms = (x_a - ratio_a * y_a) / y_a.sum() - (x_b - ratio_b * y_b) / y_b.sum()
    return float(math.sqrt(m / (m - 1) * np.sum(terms**2)))


def _z(difference: float, se: float) -> float:
    if not se > 0:
        return 0.0 if difference == 0 else math.copysign(math.inf, difference)
    return difference / se


# --- one decode, kept with its teacher-forced rows ----------------------------------------


@dataclass
class Decoded:
    """A speculative decode of prompts with one rule: per decoded row its ``prompt``
    index and ``num_generated``; its verify steps (``steps``, rows indexing the decoded
    rows); and ``rows``, its sequences teacher-forced (a ``RealPool`` whose ``prompt`` is
    the decoded row and ``step`` the generated position)."""

    prompt: Array
    num_generated: Array
    steps: VerifySteps
    rows: RealPool
    info: dict = field(default_factory=dict)

    def position_index(self, row: Array, start: Array) -> Array:
        """Index into ``rows`` of generated position ``start`` of decoded row ``row``."""
        offsets = np.concatenate([[0], np.cumsum(self.num_generated)[:-1]])
        return offsets[row] + start


def _decode_generator(seed: int, batch: int):
    import torch

    stream = int(provenance.fingerprint("theory-decode", seed, batch), 16) % (2**62)
    return torch.Generator().manual_seed(stream)  # apart from the pools' streams


def decode_batch(setup, prompts: list[str], settings: TheorySettings, rule: Rule, batch: int):
    """One batch decoded speculatively, then its sequences teacher-forced (arrays)."""
    import time

    from cactus_theory.decode import speculative_generate
    from cactus_theory.decode.checks import vocab_size
    from cactus_theory.decode.runs import encode

    input_ids, mask = encode(setup, prompts)
    input_ids, mask = input_ids.to(setup.device), mask.to(setup.device)
    started = time.perf_counter()
    result = speculative_generate(
        setup.verifier,
        setup.draft,
        input_ids,
        rule=rule,
        k=settings.k,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.sampling.temperature,
        top_k=settings.sampling.top_k,
        top_p=settings.sampling.top_p,
        eos_token_id=setup.tokenizer.eos_token_id,
        pad_token_id=setup.tokenizer.pad_token_id,
        generator=_decode_generator(settings.seed, batch),
        attention_mask=mask,
        divergence=False,
    )
    decoded_seconds = time.perf_counter() - started
    started = time.perf_counter()
    target, draft, ids = pools.rows_for_sequences(
        setup.verifier,
        setup.draft,
        result.sequences.to(setup.device),
        mask,
        result.num_generated.to(setup.device),
        settings.sampling,
        vocab_size(setup.verifier),
    )
    return {
        "num_generated": result.num_generated.numpy(),
        "accepted": result.accepted_lengths.numpy(),
        "drafts": result.draft_counts.numpy(),
        "target": target,
        "draft": draft,
        "ids": np.zeros((0, 0), np.int32) if ids is None else ids,
        "dense": np.array(ids is None),
        "seconds": np.array([decoded_seconds, time.perf_counter() - started]),
        "vocab": np.array(vocab_size(setup.verifier)),
    }


def decode_key(setup, settings: TheorySettings, rule: Rule, device: str, dtype: str) -> str:
    """The cached decode's key: the pair, the prompts and chat setting, the settings, the
    rule, device and dtype, and the code."""
    from cactus_theory.real.decode_table import pair_identity

    return provenance.fingerprint(
        "theory-decode",
        DECODE_FORMAT,
        {**settings.__dict__, "sampling": settings.sampling.label},
        spec_of(rule),
        pair_identity(setup),
        setup.prompts[: settings.num_prompts],
        setup.chat,
        device,
        dtype,
        DECODE_CODE,
    )


def decode(
    setup,
    settings: TheorySettings,
    rule: Rule | str,
    cache: Path | None,
    *,
    device: str,
    dtype: str,
    progress: bool = True,
) -> Decoded:
    """The first ``settings.num_prompts`` prompts of ``setup`` decoded with ``rule``,
    batch by batch, each batch cached under ``cache`` (None: no cache) and read back."""
    from tqdm.auto import tqdm

    chosen = parse(rule) if isinstance(rule, str) else rule
    prompts = setup.prompts[: settings.num_prompts]
    if not prompts:
        raise ValueError("prompts: the decode needs at least one prompt")
    folder = None
    if cache is not None:
        folder = Path(cache) / f"decode-{decode_key(setup, settings, chosen, device, dtype)}"
    count = -(-len(prompts) // settings.batch_size)
    shards, built, seconds = [], 0, np.zeros(2)
    for batch in tqdm(range(count), desc=f"decode {chosen.label}", disable=not progress):
        chunk = prompts[batch * settings.batch_size : (batch + 1) * settings.batch_size]
        path = None if folder is None else folder / f"batch-{batch:05d}.npz"
        arrays = None if path is None else pools._load(path)
        if arrays is None:
            arrays = decode_batch(setup, chunk, settings, chosen, batch)
            built += 1
            seconds += arrays["seconds"]
            if path is not None:
                pools._save(path, arrays)
        arrays["first_prompt"] = batch * settings.batch_size
        shards.append(arrays)
    return _assemble(shards, {"batches_decoded": built, "seconds": seconds.tolist()})


def _assemble(shards: list[dict], info: dict) -> Decoded:
    prompt, generated, rows, starts, accepted, drafts = [], [], [], [], [], []
    offset = 0
    for shard in shards:
        batch_rows = len(shard["num_generated"])
        steps = step_starts(shard["accepted"], shard["drafts"])
        prompt.append(shard["first_prompt"] + np.arange(batch_rows))
        generated.append(shard["num_generated"].astype(np.int64))
        rows.append(steps.row + offset)
        starts.append(steps.start)
        accepted.append(steps.accepted)
        drafts.append(steps.drafts)
        offset += batch_rows
    num_generated = np.concatenate(generated)
    owners = np.repeat(np.arange(offset), num_generated)
    positions = np.concatenate([np.arange(n) for n in num_generated]) if offset else np.zeros(0)
    vocab = int(shards[0]["vocab"])
    target, draft, ids = pools._join(
        [
            (s["target"], s["draft"], None if bool(s["dense"]) else s["ids"])
            for s in shards
            if len(s["target"])
        ],
        vocab,
    )
    teacher_forced = RealPool(
        target_probs=target,
        draft_probs=draft,
        ids=ids,
        vocab_size=vocab,
        prompt=owners,
        step=positions.astype(np.int64),
        token=np.zeros(len(owners), np.int64),
    )
    steps = VerifySteps(*(np.concatenate(part) for part in (rows, starts, accepted, drafts)))
    if np.any(steps.start >= num_generated[steps.row]):
        raise ValueError("accepted_lengths: a step starts past its row's generated tokens")
    return Decoded(np.concatenate(prompt), num_generated, steps, teacher_forced, info)


# --- the comparison -----------------------------------------------------------------------


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
    pool_sum = _by_cluster(pool_acceptance, pool.prompt, labels)
    pool_count = _by_cluster(np.ones(len(pool)), pool.prompt, labels)
    step_prompt = decoded.prompt[steps.row]
    accepted_first = (steps.accepted >= 1) & drafted
    measured_sum = _by_cluster(accepted_first, step_prompt, labels)
    measured_count = _by_cluster(drafted, step_prompt, labels)
    decoded_acceptance = exact_acceptance(decoded.rows, chosen)  # [M]
    at_starts = decoded_acceptance[decoded.position_index(steps.row, steps.start)][drafted]
    row_prompt = decoded.prompt[decoded.rows.prompt]
    all_sum = _by_cluster(decoded_acceptance, row_prompt, labels)
    all_count = _by_cluster(np.ones(len(decoded_acceptance)), row_prompt, labels)
    start_sum = _by_cluster(at_starts, step_prompt[drafted], labels)

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
    step_sum = _by_cluster(steps_al, decoded.prompt[steps.row], labels)
    step_count = _by_cluster(np.ones(len(steps_al)), decoded.prompt[steps.row], labels)
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
        simulated_sum = _by_cluster(pool_acceptance[starts] * weights, pool.prompt[starts], labels)
        simulated_count = _by_cluster(weights, pool.prompt[starts], labels)
        simulated_alpha = float(simulated_sum.sum() / simulated_count.sum())
        simulated_se = paired_difference_se(
            simulated_sum, simulated_count, measured_sum, measured_count
        )
        simulated = {
            "pool_alpha_simulated_starts": simulated_alpha,
            "simulated_minus_measured_se": simulated_se,
            "simulated_z": _z(simulated_alpha - measured, simulated_se),
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
        "pool_z": _z(pool_alpha - measured, pool_vs_measured_se),
        "alpha_all_positions": all_alpha,
        "alpha_step_starts": starts_alpha,
        "starts_minus_measured_se": martingale_se,
        "starts_z": _z(starts_alpha - measured, martingale_se),
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
