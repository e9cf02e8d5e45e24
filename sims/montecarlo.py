"""Monte Carlo speculative decoding, seeded and vectorised over sequences.

Every verification step goes through ``cactus_theory.verify.verify_block`` (the numpy
reference): k drafts, accept position i iff u_i < a_i, stop at the first rejection, emit a
residual token there or the bonus token after k acceptances.

Two sources:

- ``simulate_pool``: an i.i.d. source. Each of the k+1 positions of a step draws its own
  (q, p) row uniformly from a ``PairPool``. The block statistics of
  ``cactus_theory.block`` with α = the pool's mean exact acceptance are then exact, which
  is the check this module is tested against.
- ``simulate_text``: truly autoregressive decoding with the n-gram pair of
  ``sims.realtext``. The draft samples k tokens one after another from its processed rows,
  the verifier scores the k+1 prefixes, the rule decides, and what is emitted (accepted
  drafts, then the residual or bonus token) is appended before the next step. Verifier rows
  past a sequence's first rejection cannot change the step's outcome, so they are not
  computed: ``verify_block`` gets placeholder rows there, and the accepted counts it
  returns are checked against the position-by-position decisions.

Measured per cell (``DecodeResult``): per-position acceptance; accepted length per step
(AL, the bonus token excluded, as in the paper) and its standard error; tokens per verifier
call (AL + 1); rejected steps; the exact emitted-law KL and TV of every visited context
(bonus positions emit q exactly and add 0); the chain-rule sequence divergence
D_t = E[Σ_{s<=t} KL(μ_s‖q_s)] against generated length t (exact for the process that
includes the block phase, and an upper bound on the KL of the token sequences alone); and,
on text, the verifier's raw (T = 1, untruncated) NLL of the generated tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from cactus_theory.core import block, stats, validate
from cactus_theory.core.rules.base import Rule
from cactus_theory.core.verify import inverse_cdf, verify_block
from sims import rows
from sims.pools import PairPool
from sims.realtext import TextModels

Array = np.ndarray


@dataclass(frozen=True)
class DecodeSettings:
    """How much to decode: ``num_sequences`` sequences of ``length`` generated tokens."""

    k: int
    num_sequences: int
    length: int

    def __post_init__(self) -> None:
        validate.positive_int("k", self.k)
        validate.positive_int("num_sequences", self.num_sequences)
        validate.positive_int("length", self.length)


@dataclass(frozen=True)
class DecodeResult:
    """Everything measured in one cell (plain floats and lists: JSON-ready)."""

    k: int
    steps: int
    emitted: int
    al: float
    al_se: float
    al_predicted: float
    tokens_per_call: float
    rejected_steps: int
    position_reached: list[int]
    position_accepted: list[int]
    acceptance_mc: float
    acceptance_exact: float
    acceptance_exact_var: float
    kl_per_context: float
    tv_per_context: float
    kl_per_token: float
    tv_per_token: float
    nll_per_token: float
    sequence_kl: list[float]
    sequence_kl_se: list[float]

    def as_dict(self) -> dict:
        return asdict(self)


class _Tally:
    """Accumulates a cell's measurements step by step."""

    def __init__(self, k: int, num_sequences: int, length: int) -> None:
        self.k = k
        self.lengths: list[Array] = []
        self.reached = np.zeros(k, dtype=np.int64)
        self.accepted = np.zeros(k, dtype=np.int64)
        self.exact_sum = np.zeros(k)
        self.exact_var = 0.0
        self.kl_sum = self.tv_sum = 0.0
        self.contexts = 0
        self.token_kl = np.zeros((num_sequences, length + k + 1))
        self.token_tv = np.zeros((num_sequences, length + k + 1))
        self.nll_sum = 0.0
        self.nll_count = 0
        self.length = length

    def visit(self, position: int, accepted: Array, exact: Array, kl: Array, tv: Array) -> None:
        """Contexts that reached ``position``: MC decisions and their exact statistics."""
        self.reached[position] += accepted.size
        self.accepted[position] += int(accepted.sum())
        self.exact_sum[position] += float(exact.sum())
        self.exact_var += float((exact * (1.0 - exact)).sum())
        self.kl_sum += float(kl.sum())
        self.tv_sum += float(tv.sum())
        self.contexts += accepted.size

    def emit(self, sequences: Array, starts: Array, kl: Array, tv: Array, count: Array) -> None:
        """Per-token exact KL/TV of the ``count[r]`` tokens appended to each sequence."""
        for offset in range(kl.shape[1]):
            write = offset < count
            where = sequences[write]
            self.token_kl[where, starts[write] + offset] = kl[write, offset]
            self.token_tv[where, starts[write] + offset] = tv[write, offset]

    def result(self, al_predicted: float) -> DecodeResult:
        lengths = np.concatenate(self.lengths)
        steps = lengths.size
        emitted = int((lengths + 1).sum())
        kept_kl = self.token_kl[:, : self.length]
        cumulative = np.cumsum(kept_kl, axis=1)
        with np.errstate(invalid="ignore"):
            spread = (
                cumulative.std(axis=0, ddof=1) if cumulative.shape[0] > 1 else 0 * cumulative[0]
            )
        reached = int(self.reached.sum())
        return DecodeResult(
            k=self.k,
            steps=int(steps),
            emitted=emitted,
            al=float(lengths.mean()),
            al_se=float(lengths.std(ddof=1) / np.sqrt(steps)) if steps > 1 else float("nan"),
            al_predicted=float(al_predicted),
            tokens_per_call=float(lengths.mean() + 1.0),
            rejected_steps=int((lengths < self.k).sum()),
            position_reached=[int(v) for v in self.reached],
            position_accepted=[int(v) for v in self.accepted],
            acceptance_mc=float(self.accepted.sum() / reached),
            acceptance_exact=float(self.exact_sum.sum() / reached),
            acceptance_exact_var=float(self.exact_var),
            kl_per_context=float(self.kl_sum / self.contexts),
            tv_per_context=float(self.tv_sum / self.contexts),
            kl_per_token=float(kept_kl.mean()),
            tv_per_token=float(self.token_tv[:, : self.length].mean()),
            nll_per_token=float(self.nll_sum / self.nll_count) if self.nll_count else float("nan"),
            sequence_kl=[float(v) for v in cumulative.mean(axis=0)],
            sequence_kl_se=[float(v) for v in spread / np.sqrt(cumulative.shape[0])],
        )


def _check_rule(rule: object) -> Rule:
    if not isinstance(rule, Rule):
        raise ValueError(f"rule: expected a rule, got {type(rule).__name__}")
    return rule


def _token_divergences(per_position: Array, lengths: Array, k: int) -> Array:
    """[n, k+1]: divergence of the law each emitted token came from (bonus: 0)."""
    padded = np.concatenate([per_position, np.zeros((per_position.shape[0], 1))], axis=1)
    bonus = lengths == k
    padded[bonus, k] = 0.0
    return padded


# -- i.i.d. pool source ---------------------------------------------------------------------


def simulate_pool(
    rule: Rule, pool: PairPool, settings: DecodeSettings, seed: int = 0
) -> DecodeResult:
    """Decode ``settings.num_sequences`` sequences whose every position is an i.i.d. pool row."""
    rule = _check_rule(rule)
    k, count, length = settings.k, settings.num_sequences, settings.length
    rng = np.random.default_rng(seed)
    _, acceptance, kl, tv = stats.position_stats(rule, pool.target_probs, pool.draft_probs)
    tally = _Tally(k, count, length)
    produced = np.zeros(count, dtype=np.int64)
    while True:
        active = np.flatnonzero(produced < length)
        if active.size == 0:
            break
        n = active.size
        index = rng.integers(0, pool.size, (n, k + 1))
        draft = pool.draft_probs[index[:, :k]]
        draft_ids = inverse_cdf(draft, rng.random((n, k)))
        accept_u, sample_u = rng.random((n, k)), rng.random(n)
        _, lengths = verify_block(
            rule, pool.target_probs[index], draft, draft_ids, accept_u, sample_u
        )
        # verify_block accepted exactly the first L drafts and rejected draft L (if L < k).
        decisions = np.arange(k) < lengths[:, None]
        for position in range(k):
            went = lengths >= position
            tally.visit(
                position,
                decisions[went, position],
                acceptance[index[went, position]],
                kl[index[went, position]],
                tv[index[went, position]],
            )
        tally.lengths.append(lengths)
        per_position = kl[index[:, :k]]
        tally.emit(
            active,
            produced[active],
            _token_divergences(per_position, lengths, k),
            _token_divergences(tv[index[:, :k]], lengths, k),
            lengths + 1,
        )
        produced[active] += lengths + 1
    predicted = block.expected_accepted(float(acceptance.mean()), k)
    return tally.result(predicted)


# -- autoregressive real-text source ---------------------------------------------------------


def simulate_text(
    rule: Rule,
    models: TextModels,
    settings: DecodeSettings,
    seed: int = 0,
    prompts: Array | None = None,
) -> DecodeResult:
    """Autoregressive speculative decoding with the n-gram verifier and draft (see module)."""
    return run_text(rule, models, settings, seed, prompts)[0]


def run_text(
    rule: Rule,
    models: TextModels,
    settings: DecodeSettings,
    seed: int = 0,
    prompts: Array | None = None,
) -> tuple[DecodeResult, Array]:
    """``simulate_text`` plus the token sequences [num_sequences, history + length]: each row
    is its prompt followed by its first ``length`` generated tokens."""
    rule = _check_rule(rule)
    k, count, length = settings.k, settings.num_sequences, settings.length
    rng = np.random.default_rng(seed)
    width = models.history_length
    if prompts is None:
        prompts = models.prompts(count, rng)
    prompts = np.asarray(prompts, dtype=np.int64)
    if prompts.shape != (count, width):
        raise ValueError(f"prompts: expected shape {(count, width)}, got {prompts.shape}")
    sequences = np.zeros((count, width + length + k + 1), dtype=np.int64)
    sequences[:, :width] = prompts
    produced = np.zeros(count, dtype=np.int64)
    tally = _Tally(k, count, length)
    while True:
        active = np.flatnonzero(produced < length)
        if active.size == 0:
            break
        lengths, emitted = _text_step(rule, models, sequences, produced, active, k, rng, tally)
        for offset in range(k + 1):
            write = offset <= lengths
            rows_written = active[write]
            sequences[rows_written, width + produced[rows_written] + offset] = emitted[
                write, offset
            ]
        produced[active] += lengths + 1
    position_counts = tally.reached.astype(np.float64)
    position_means = np.divide(
        tally.exact_sum, position_counts, out=np.zeros(k), where=position_counts > 0
    )
    predicted = float(np.cumprod(position_means).sum())
    return tally.result(predicted), sequences[:, : width + length].copy()


def _text_step(
    rule: Rule,
    models: TextModels,
    sequences: Array,
    produced: Array,
    active: Array,
    k: int,
    rng: np.random.Generator,
    tally: _Tally,
) -> tuple[Array, Array]:
    """One verification step for the active sequences; returns (L [n], tokens [n, k+1])."""
    width = models.history_length
    n = active.size
    starts = produced[active]
    offsets = starts[:, None] + np.arange(width)
    work = np.zeros((n, width + k + 1), dtype=np.int64)  # [n, history + drafts + 1]
    work[:, :width] = np.take_along_axis(sequences[active], offsets, axis=1)
    draft_u, accept_u, sample_u = rng.random((n, k)), rng.random((n, k)), rng.random(n)
    draft_rows = _draft_text(models, work, draft_u, k)
    drafted = work[:, width : width + k]  # [n, k]
    pairs, bonus, decided_lengths, kl_at, tv_at = _verify_positions(
        rule, models, work, draft_rows, drafted, accept_u, tally
    )
    target_full, draft_full, ids_full, columns = _assemble(pairs, bonus, draft_rows, drafted)
    tokens, lengths = verify_block(rule, target_full, draft_full, columns, accept_u, sample_u)
    if not np.array_equal(lengths, decided_lengths):  # pragma: no cover - a bug guard
        raise RuntimeError("verify_block disagrees with the position-by-position decisions")
    rows_n = np.arange(n)
    emitted_column = tokens[rows_n, lengths]
    emitted = np.full((n, k + 1), -1, dtype=np.int64)
    emitted[:, :k] = np.where(np.arange(k) < lengths[:, None], drafted, -1)
    emitted[rows_n, lengths] = ids_full[rows_n, lengths, emitted_column]
    if np.any(emitted[rows_n, lengths] >= models.vocab_size):  # pragma: no cover
        raise RuntimeError("a padding column was sampled")

    tally.lengths.append(lengths)
    tally.emit(
        active,
        starts,
        _token_divergences(kl_at, lengths, k),
        _token_divergences(tv_at, lengths, k),
        lengths + 1,
    )
    _tally_nll(models, work, emitted, lengths, tally)
    return lengths, emitted


def _draft_text(models: TextModels, work: Array, draft_u: Array, k: int) -> list:
    """Draft k tokens autoregressively from the processed draft rows, written into ``work``
    after the history; returns each position's draft rows."""
    width, n = models.history_length, work.shape[0]
    draft_rows = []
    for i in range(k):
        row = models.draft_rows(work[:, i : i + width])
        column = inverse_cdf(row.probs, draft_u[:, i])
        work[:, width + i] = row.ids[np.arange(n), column]
        draft_rows.append(row)
    return draft_rows


def _verify_positions(rule, models: TextModels, work, draft_rows, drafted, accept_u, tally):
    """Verify position by position, only where every earlier draft was accepted: (aligned
    pairs per position, the bonus rows, the accepted lengths [n], KL and TV at each
    verified position [n, k])."""
    width = models.history_length
    n, k = drafted.shape
    alive = np.ones(n, dtype=bool)
    decided_lengths = np.full(n, k, dtype=np.int64)
    pairs: list[tuple[Array, rows.AlignedPairs]] = []
    kl_at = np.zeros((n, k))
    tv_at = np.zeros((n, k))
    bonus: tuple[Array, rows.CompactRows] | None = None
    for i in range(k + 1):
        which = np.flatnonzero(alive)
        if which.size == 0:
            break
        target = models.verifier_rows(work[which, i : i + width])
        if i == k:
            bonus = (which, target)
            break
        aligned = rows.align(target, draft_rows[i].take(which))
        column = aligned.column_of(drafted[which, i])
        accept, exact, kl, tv = stats.position_stats(
            rule, aligned.target_probs, aligned.draft_probs
        )
        decided = accept_u[which, i] < accept[np.arange(which.size), column]
        tally.visit(i, decided, exact, kl, tv)
        kl_at[which, i], tv_at[which, i] = kl, tv
        pairs.append((which, aligned))
        alive[which[~decided]] = False
        decided_lengths[which[~decided]] = i
    return pairs, bonus, decided_lengths, kl_at, tv_at


def _tally_nll(models: TextModels, work: Array, emitted: Array, lengths: Array, tally) -> None:
    """The raw verifier NLL of each emitted token, in its own context."""
    width = models.history_length
    rows_n = np.arange(work.shape[0])
    step_rows = np.repeat(rows_n, lengths + 1)
    step_pos = np.arange(step_rows.size) - np.repeat(
        np.cumsum(lengths + 1) - (lengths + 1), lengths + 1
    )
    histories = work[step_rows[:, None], step_pos[:, None] + np.arange(width)]
    probs = models.verifier_token_probs(histories, emitted[step_rows, step_pos])
    tally.nll_sum += float(-np.log(probs).sum())
    tally.nll_count += int(step_rows.size)


def _assemble(
    pairs: list[tuple[Array, rows.AlignedPairs]],
    bonus: tuple[Array, rows.CompactRows] | None,
    draft_rows: list[rows.CompactRows],
    drafted: Array,
) -> tuple[Array, Array, Array, Array]:
    """verify_block's inputs [n, k+1, W], [n, k, W], ids [n, k+1, W], columns [n, k].

    Rows a sequence never reached (after its first rejection) get the draft row as both
    target and draft, and the bonus row a one-hot: valid distributions that cannot change
    the outcome, because ``verify_block`` stops at the first rejection.
    """
    n, k = drafted.shape
    vocab = draft_rows[0].vocab_size
    widths = [row.width for row in draft_rows] + [aligned.ids.shape[1] for _, aligned in pairs]
    if bonus is not None:
        widths.append(bonus[1].width)
    size = max(widths)
    target_full = np.zeros((n, k + 1, size))
    draft_full = np.zeros((n, k, size))
    ids_full = np.full((n, k + 1, size), vocab, dtype=np.int64)
    columns = np.zeros((n, k), dtype=np.int64)
    for i, row in enumerate(draft_rows):
        w = row.width
        target_full[:, i, :w] = row.probs
        draft_full[:, i, :w] = row.probs
        ids_full[:, i, :w] = row.ids
        columns[:, i] = np.argmax(row.ids == drafted[:, i, None], axis=1)
    for i, (which, aligned) in enumerate(pairs):
        w = aligned.ids.shape[1]
        target_full[which, i] = 0.0
        draft_full[which, i] = 0.0
        ids_full[which, i] = vocab
        target_full[which, i, :w] = aligned.target_probs
        draft_full[which, i, :w] = aligned.draft_probs
        ids_full[which, i, :w] = aligned.ids
        columns[which, i] = aligned.column_of(drafted[which, i])
    target_full[:, k, 0] = 1.0
    if bonus is not None:
        which, target = bonus
        w = target.width
        target_full[which, k] = 0.0
        target_full[which, k, :w] = target.probs
        ids_full[which, k, :w] = target.ids
    return target_full, draft_full, ids_full, columns
