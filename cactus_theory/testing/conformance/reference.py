"""The claimed rule's decisions for given randomness: the oracle of the exact-decision tests.

The harness injects one ``Uniforms`` per call; an engine turns it into decisions by its own
**convention**, and ``decide`` computes, in float64 with the claimed rule (core rules), the
decisions a conforming engine must make from the same randomness:

- **accept** (every engine): position i of row b is accepted iff
  ``accept[b, i] < a_i``, a_i the rule's acceptance of the drafted token
  (``Rule.accept_probs``: min(1, q_n / p_n) for SpS, 0 where p_n = 0); scan left to right,
  stop at the first rejection. (vLLM writes ``q_n / p_n >= u``, transformers ``u < q_n/p_n``:
  the same law; they differ only where u equals a_n exactly, which the ``zero-target``
  property probes at u = 0.)
- **emit**, by the engine's convention (``Adapter.recovery``):
  ``INVERSE_CDF``: the emitted token (residual after a rejection, else the bonus row) is
  the first index whose cumulative probability exceeds ``sample[b]`` times the row's total
  (``core.verify``'s convention: transformers once its multinomial is replaced by the
  injected inverse CDF, our sampler, SGLang's and FlashInfer's kernels);
  ``INVERSE_CDF_NEXT_COIN``: FlashInfer's chain kernel, whose uniforms are one row
  u [B, k+1] = (accept[b, 0..k−1], sample[b]): the token emitted after a rejection at
  position i is drawn by inverse CDF with u[b, i+1] (the next, unused accept coin, or
  ``sample`` after the last position), the bonus with u[b, k] = ``sample``;
  ``EXPONENTIAL_RACE``: after a rejection the engine emits argmax_i r_i / E_i with E = the
  injected ``noise[b]`` (i.i.d. Exp(1): vLLM's recovery, ``sample_recovered_tokens``,
  which multiplies by 1/q); argmax_i r_i/E_i is an exact sample of r / Σ r. The bonus row is
  drawn by inverse CDF with ``sample[b]`` in both conventions (vLLM's accept step takes
  the bonus as an input; its adapter draws it so).

The residual r is ``Rule.residuals_for`` normalised (for SpS (q − p)_+ / Σ(q − p)_+, and q
itself when that sum is 0). Ragged rows (``num_drafts[b] < k``) decide only their first
num_drafts[b] positions and take the bonus from ``target[b, num_drafts[b]]``.

**Near-ties.** An engine computes in float32 (or in its input's precision); the reference in
float64. A row whose accept uniform lies within ``tolerance`` of a_n, or whose sample
uniform lies within it of a cumulative breakpoint (relative gap of the two best race scores,
for the race), may decide either way; ``Decisions.margin`` holds each row's smallest such
distance so the exact tests excuse those rows (and count them). One more tie: a rejection
whose excess Σ (h − p)_+ is at most ``floor`` (rules with a target h: h = p up to the
engine's rounding, e.g. interp with p = q, or a target the engine solves for): its residual
is rounding noise in the engine's precision, so any token of h's or the residual's support
is a right answer there (``Decisions.dust``, ``allowed``); a token outside both (vLLM
emitting token 0 of probability 0 when the excess is exactly 0) is still a failure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cactus_theory.core.rules.base import Rule, exact_family
from cactus_theory.core.verify import PAD_ID, inverse_cdf

INVERSE_CDF = "inverse-cdf"
INVERSE_CDF_NEXT_COIN = "inverse-cdf-next-coin"
EXPONENTIAL_RACE = "exponential-race"
CONVENTIONS = (INVERSE_CDF, INVERSE_CDF_NEXT_COIN, EXPONENTIAL_RACE)


@dataclass(frozen=True)
class Uniforms:
    """The randomness of one verify call (numpy float64).

    accept : [B, k] in [0, 1): position i accepted iff accept[b, i] < a_i.
    sample : [B] in [0, 1): inverse-CDF uniform of the emitted (residual or bonus) token.
    noise : [B, V] > 0, Exp(1): the exponential race's noise (vLLM's q).
    """

    accept: np.ndarray
    sample: np.ndarray
    noise: np.ndarray

    def rows(self, index: object) -> Uniforms:
        """The uniforms of rows ``index`` (a slice or an index array)."""
        return Uniforms(self.accept[index], self.sample[index], self.noise[index])


def draw_uniforms(generator: np.random.Generator, batch: int, steps: int, vocab: int) -> Uniforms:
    """Fresh uniforms for a [B, k] block over V tokens."""
    return Uniforms(
        generator.random((batch, steps)),
        generator.random(batch),
        generator.exponential(size=(batch, vocab)) + 1e-300,
    )


def tolerance(compute_dtype: str) -> float:
    """How close a uniform may lie to a decision boundary and still be excused:
    8 ulps of the engine's compute precision, at least 1e-5."""
    eps = {"float64": 2.2e-16, "float32": 1.19e-7, "float16": 9.77e-4, "bfloat16": 7.81e-3}
    return max(8.0 * eps[compute_dtype], 1e-5)


@dataclass
class Decisions:
    """The claimed rule's outcome for one block.

    token_ids : [B, k+1] int64: accepted drafts, the emitted token, then PAD_ID.
    num_accepted : [B] accepted drafts.
    margin : [B] the smallest distance of a uniform to a decision boundary in the row
        (accept uniforms to a_n, the sample uniform to a CDF breakpoint or the race's
        relative gap); rows with margin <= tolerance may legitimately differ.
    emit_law : [B, V] the law the emitted token was drawn from (residual or bonus row).
    accept_probs : [B, k] the rule's acceptance of each drafted token.
    dust : [B] bool: the row was rejected with an excess Σ (h − p)_+ at most ``floor``.
    allowed : [B, V] bool: on a dust row, the tokens of h's or the residual's support.
    """

    token_ids: np.ndarray
    num_accepted: np.ndarray
    margin: np.ndarray
    emit_law: np.ndarray
    accept_probs: np.ndarray
    dust: np.ndarray
    allowed: np.ndarray


def _cdf_margin(law: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """[B]: min_j |u − C_j| over the interior breakpoints C_j = cumsum(law)_j / total."""
    cumulative = np.cumsum(law, axis=-1)
    cumulative = cumulative / cumulative[:, -1:]
    if law.shape[-1] < 2:
        return np.full(law.shape[0], np.inf)
    return np.abs(cumulative[:, :-1] - uniform[:, None]).min(axis=-1)


def _race(law: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(argmax_i law_i / noise_i [B], relative gap of the two best scores [B])."""
    scores = law / noise
    token = np.argmax(scores, axis=-1)
    if law.shape[-1] < 2:
        return token, np.full(law.shape[0], np.inf)
    top = -np.sort(-scores, axis=-1)[:, :2]
    gap = np.where(top[:, 0] > 0, (top[:, 0] - top[:, 1]) / np.maximum(top[:, 0], 1e-300), 0.0)
    return token, gap


def decide(
    rule: Rule,
    target_probs: np.ndarray,
    draft_probs: np.ndarray,
    draft_ids: np.ndarray,
    uniforms: Uniforms,
    recovery: str = INVERSE_CDF,
    num_drafts: np.ndarray | None = None,
    floor: float = 0.0,
) -> Decisions:
    """The decisions of ``rule`` for one block (module docstring).

    Shapes: target_probs [B, k+1, V], draft_probs [B, k, V] (float64; the exact values the
    engine was given), draft_ids [B, k], uniforms for [B, k] and V, num_drafts [B] or None;
    ``floor``: the excess at or below which a residual is rounding noise.
    """
    if recovery not in CONVENTIONS:
        raise ValueError(f"recovery: expected one of {CONVENTIONS}, got {recovery!r}")
    # The engine's rows in float64, renormalised (a float32 row sums to 1 within ~1e-7;
    # the rule contract asks for 1e-9; the difference is far inside the near-tie window).
    target = np.asarray(target_probs, dtype=np.float64)
    target = target / target.sum(axis=-1, keepdims=True)
    draft = np.asarray(draft_probs, dtype=np.float64)
    draft = draft / np.where(draft.sum(axis=-1, keepdims=True) > 0, draft.sum(-1, keepdims=True), 1)
    ids = np.asarray(draft_ids, dtype=np.int64)
    batch, steps, vocab = draft.shape
    drafts = np.full(batch, steps) if num_drafts is None else np.asarray(num_drafts, np.int64)
    rows = np.arange(batch)
    margin = np.full(batch, np.inf)
    if steps:
        accept = rule.accept_probs(target[:, :steps], draft)  # [B, k, V]
        drafted = np.take_along_axis(accept, ids[..., None], axis=-1)[..., 0]  # [B, k]
        decided = np.arange(steps)[None, :] < drafts[:, None]  # [B, k]
        accepted = (uniforms.accept < drafted) & decided
        num_accepted = np.cumprod(accepted, axis=1).sum(axis=1)  # [B]
        reached = decided & (np.arange(steps)[None, :] <= num_accepted[:, None])
        # a_n = 0 exactly (q_n = 0 or p_n = 0 in the engine's own values) admits no
        # rounding: it must reject at every u, u = 0 included.
        gaps = np.where(reached & (drafted > 0), np.abs(uniforms.accept - drafted), np.inf)
        margin = np.minimum(margin, gaps.min(axis=1))
    else:
        drafted = np.zeros((batch, 0))
        num_accepted = np.zeros(batch, dtype=np.int64)
    rejected = num_accepted < drafts
    stop = np.minimum(num_accepted, max(steps - 1, 0))
    emit_law = target[rows, np.minimum(drafts, steps)].copy()  # the bonus rows
    dust = np.zeros(batch, dtype=bool)
    allowed = np.zeros((batch, vocab), dtype=bool)
    if rejected.any():
        where = rows[rejected]
        at = (target[where, stop[where]], draft[where, stop[where]], ids[where, stop[where]])
        residual = rule.residuals_for(*at)
        emit_law[where] = residual
        if exact_family(rule) in ("target", "branch"):
            adjusted = rule.targets_for(*at)  # [R, V] the h of each rejected row
            excess = np.maximum(adjusted - at[1], 0.0).sum(axis=-1)  # [R]
            dust[where] = excess <= floor
            allowed[where] = (adjusted > 0) | (residual > 0)
    emit_law = emit_law / emit_law.sum(axis=-1, keepdims=True)
    sample = uniforms.sample
    if recovery == INVERSE_CDF_NEXT_COIN and steps:
        coins = np.concatenate([uniforms.accept, uniforms.sample[:, None]], axis=1)  # [B, k+1]
        sample = coins[rows, np.minimum(num_accepted + 1, steps)]
    emitted = inverse_cdf(emit_law, sample)
    sample_margin = _cdf_margin(emit_law, sample)
    if recovery == EXPONENTIAL_RACE and rejected.any():
        raced, gap = _race(emit_law, uniforms.noise)
        emitted = np.where(rejected, raced, emitted)
        sample_margin = np.where(rejected, gap, sample_margin)
    margin = np.minimum(margin, sample_margin)

    token_ids = np.full((batch, steps + 1), PAD_ID, dtype=np.int64)
    keep = np.arange(steps)[None, :] < num_accepted[:, None]
    token_ids[:, :steps] = np.where(keep, ids, PAD_ID)
    token_ids[rows, num_accepted] = emitted
    return Decisions(
        token_ids, num_accepted.astype(np.int64), margin, emit_law, drafted, dust, allowed
    )
