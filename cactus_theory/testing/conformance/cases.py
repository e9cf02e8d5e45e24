"""The inputs the conformance suite feeds an engine: drawn blocks for the exact-decision
tests (hypothesis strategies built on the kit's ``strategies``) and fixed law cases.

A **block** is one verify call: ``target`` [B, k+1, V], ``draft`` [B, k, V] (float64
holding exactly the values the engine is given in ``dtype``, so the reference decides on
what the engine saw), ``ids`` [B, k], ``uniforms``, and optionally ``num_drafts`` [B],
per-row ``settings`` with ``logits`` (the logits path), per-row ``seeds``.

Row kinds (the edge cases of the issue): every kind of the kit's ``strategies.rows``
(dense, sparse with exact zeros, ties, one-hot, near-one-hot, masses near 1e-300,
Dirichlet from peaked to flat) and disjoint supports (``strategies.pairs``); rows after
top-k/top-p (``strategies.processed_pairs``); **dyadic** rows for float16/bfloat16
(multiples of 1/64, exact in both formats and summing to exactly 1, so the reference and
the engine see the same law). Drafted ids are drawn from the draft row (``"draft"``), or
put where p_n = 0 (``"zero-draft"``), or where q_n = 0 < p_n with accept uniforms in
{0, 1e-300, drawn} (``"zero-target"``: the coin boundary of SGLang #35771). Half the
``"zero-draft"`` blocks have draft = target, so that the residual (q − p)_+ of the rejected
p_n = 0 draft is all zero (the rule then emits from q); half the ``"zero-target"`` blocks
have draft = target plus 1e-12 on a token q gives 0, drafted there, so that the excess left
by its rejection is below float32's resolution.

A **law case** is one (target [k+1, V], draft [k, V]) block repeated over many draws
(``LawCase``); ``law_cases`` builds the suite's cases from a seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cactus_theory.core import processors
from cactus_theory.core.processors import SamplingSettings
from cactus_theory.core.verify import inverse_cdf
from cactus_theory.testing.conformance.reference import Uniforms, draw_uniforms

#: Denominator of the dyadic rows (exact in float16 and bfloat16).
DYADIC_UNITS = 64


@dataclass
class Block:
    """One verify call's inputs (module docstring)."""

    target: np.ndarray
    draft: np.ndarray
    ids: np.ndarray
    uniforms: Uniforms
    dtype: str = "float32"
    num_drafts: np.ndarray | None = None
    logits: np.ndarray | None = None
    settings: list[SamplingSettings] | None = None

    def plain(self) -> dict:
        """The block as plain lists (a counterexample that can be pasted)."""
        data = {
            "dtype": self.dtype,
            "target_probs": self.target.tolist(),
            "draft_probs": self.draft.tolist(),
            "draft_ids": self.ids.tolist(),
            "accept_uniforms": self.uniforms.accept.tolist(),
            "sample_uniforms": self.uniforms.sample.tolist(),
        }
        if self.num_drafts is not None:
            data["num_drafts"] = self.num_drafts.tolist()
        if self.logits is not None:
            data["target_logits"] = self.logits.tolist()
            data["settings"] = [settings.label for settings in self.settings or []]
        return data


def rounded(rows: np.ndarray, dtype: str) -> np.ndarray:
    """``rows`` as the engine sees them in ``dtype``, back in float64."""
    import torch

    from cactus_theory.testing.conformance.adapter import DTYPES

    return torch.as_tensor(rows).to(DTYPES[dtype]).to(torch.float64).numpy()


def dyadic_row(
    generator: np.random.Generator, vocab: int, sparse: bool, near: np.ndarray | None = None
) -> np.ndarray:
    """A row of multiples of 1/64 summing to 1 (some zeros when ``sparse``; mixed 0.6 : 0.4
    with the row ``near`` when given)."""
    weights = generator.dirichlet(np.full(vocab, 0.7))
    if near is not None:
        weights = 0.6 * near + 0.4 * weights
    if sparse and vocab > 1:
        weights[generator.random(vocab) < 0.3] = 0.0
        if weights.sum() == 0:
            weights[generator.integers(vocab)] = 1.0
        weights = weights / weights.sum()
    counts = np.floor(weights * DYADIC_UNITS).astype(np.int64)
    counts[np.argmax(weights)] += DYADIC_UNITS - counts.sum()
    return counts / DYADIC_UNITS


def _nudged(target: np.ndarray) -> np.ndarray:
    """``target`` with 1e-12 moved onto its first zero entry (itself if it has none)."""
    zeros = np.flatnonzero(target == 0)
    if zeros.size == 0:
        return target
    row = target.copy()
    row[zeros[0]] = 1e-12
    return row / row.sum()


def _draft_ids(
    target: np.ndarray, draft: np.ndarray, generator: np.random.Generator, mode: str
) -> np.ndarray:
    """[B, k] drafted ids by ``mode`` (module docstring)."""
    ids = inverse_cdf(draft, generator.random(draft.shape[:2]))
    if mode == "draft":
        return ids
    wanted = draft == 0 if mode == "zero-draft" else (target[:, :-1] == 0) & (draft > 0)
    for b, i in zip(*np.nonzero(wanted.any(axis=-1)), strict=True):
        choices = np.flatnonzero(wanted[b, i])
        ids[b, i] = choices[generator.integers(choices.size)]
    return ids


def block_strategy(
    kind: str,
    ids: str = "draft",
    dtype: str = "float32",
    ragged: bool = False,
    max_vocab: int = 24,
):
    """A hypothesis strategy of ``Block``: rows of ``kind`` ("any", "ties", "one-hot",
    "truncated", "dyadic"), drafted ids by ``ids``, inputs in ``dtype``, and random
    ``num_drafts`` when ``ragged``."""
    from cactus_theory.testing import strategies

    st = strategies.st
    kinds = {
        "ties": ("ties",),
        "one-hot": ("one_hot", "near_one_hot"),
        "any": strategies.KINDS,
    }

    @st.composite
    def draw_block(draw) -> Block:
        vocab = draw(st.integers(2 if kind in ("truncated", "dyadic") else 1, max_vocab))
        batch, steps = draw(st.integers(1, 4)), draw(st.integers(1, 3))
        seed = draw(st.integers(0, 2**32 - 1))
        generator = np.random.default_rng(seed)

        def pair() -> tuple[np.ndarray, np.ndarray]:
            if kind == "truncated":
                return draw(strategies.processed_pairs(vocab, vocab))
            if kind == "dyadic":
                sparse = bool(generator.random() < 0.5)
                return dyadic_row(generator, vocab, sparse), dyadic_row(generator, vocab, sparse)
            if kind == "any":
                return draw(strategies.pairs(vocab, vocab))
            return draw(strategies.rows(vocab, kinds[kind])), draw(
                strategies.rows(vocab, kinds[kind])
            )

        pairs = [[pair() for _ in range(steps + 1)] for _ in range(batch)]
        if ids == "zero-draft" and draw(st.booleans()):
            # draft = target: after the rejection of a p_n = 0 draft, (q − p)_+ is all zero.
            pairs = [[(q, q) for q, _ in row] for row in pairs]
        if ids == "zero-target" and draw(st.booleans()):
            # draft = target but for 1e-12 on a token q gives 0: rejecting that draft leaves
            # an excess (q − p)_+ of 1e-12, below float32's resolution.
            pairs = [[(q, _nudged(q)) for q, _ in row] for row in pairs]
        target = rounded(np.array([[p[0] for p in row] for row in pairs]), dtype)
        draft = rounded(np.array([[p[1] for p in row[:steps]] for row in pairs]), dtype)
        drafted = _draft_ids(target, draft, generator, ids)
        uniforms = draw_uniforms(generator, batch, steps, vocab)
        if ids == "zero-target":
            boundary = draw(st.sampled_from([0.0, 1e-300]))
            accept = np.where(generator.random((batch, steps)) < 0.5, boundary, uniforms.accept)
            uniforms = Uniforms(accept, uniforms.sample, uniforms.noise)
        num_drafts = generator.integers(0, steps + 1, batch) if ragged else None
        return Block(target, draft, drafted, uniforms, dtype, num_drafts)

    return draw_block()


def logits_block_strategy(max_vocab: int = 16):
    """Blocks for the logits path: target logits with per-row settings (temperature 0, 0.5,
    1, 1.7; top-k; top-p), drafts from the draft's logits through the same settings.
    Draws where a top-p cut lies within 1e-4 of a cumulative mass are redrawn (float32
    engines may cut either way there)."""
    from hypothesis import assume

    from cactus_theory.testing import strategies

    st = strategies.st

    @st.composite
    def draw_block(draw) -> Block:
        vocab = draw(st.integers(3, max_vocab))
        batch, steps = draw(st.integers(1, 4)), draw(st.integers(1, 3))
        generator = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        settings = [
            SamplingSettings(
                temperature=draw(st.sampled_from([0.0, 0.5, 1.0, 1.7])),
                top_k=draw(st.sampled_from([None, 2, 5])),
                top_p=draw(st.sampled_from([1.0, 0.9, 0.7])),
            )
            for _ in range(batch)
        ]
        logits = rounded(generator.normal(size=(batch, steps + 1, vocab)) * 2.0, "float32")
        noise = generator.normal(size=(batch, steps, vocab))
        target = np.stack([processors.process_logits(logits[b], settings[b]) for b in range(batch)])
        draft = np.stack(
            [
                processors.process_logits(logits[b, :steps] + noise[b], settings[b])
                for b in range(batch)
            ]
        )
        assume(not _near_top_p_cut(logits, settings))
        draft = rounded(draft, "float32")
        ids = _draft_ids(target, draft, generator, "draft")
        uniforms = draw_uniforms(generator, batch, steps, vocab)
        return Block(target, draft, ids, uniforms, "float32", None, logits, settings)

    return draw_block()


def _near_top_p_cut(logits: np.ndarray, settings: list[SamplingSettings]) -> bool:
    """Whether some row's top-p cut lies within 1e-4 of a cumulative mass."""
    for row_logits, row_settings in zip(logits, settings, strict=True):
        if row_settings.top_p >= 1.0 or row_settings.temperature == 0:
            continue
        kept = processors.process_logits(
            row_logits, SamplingSettings(row_settings.temperature, row_settings.top_k)
        )
        cumulative = np.cumsum(-np.sort(-kept, axis=-1), axis=-1)
        if np.any(np.abs(cumulative - row_settings.top_p) < 1e-4):
            return True
    return False


@dataclass
class LawCase:
    """One block repeated over a law test's draws (float64 values as the engine sees them).

    target : [k+1, V] the verifier's rows (row k: the bonus law), or the processed rows of
        ``logits`` under ``settings`` (one setting per group of rows).
    draft : [k, V].
    property : the property whose tests this case feeds.
    share : the fraction of the run's draws this case takes (per settings group).
    """

    name: str
    property: str
    target: np.ndarray
    draft: np.ndarray
    dtype: str = "float32"
    seeded: bool = False
    logits: np.ndarray | None = None
    settings: list[SamplingSettings] = field(default_factory=list)
    share: float = 1.0

    @property
    def steps(self) -> int:
        return self.draft.shape[0]

    def targets(self) -> list[np.ndarray]:
        """The exact target block of each settings group ([k+1, V] each; one group when
        the case has no logits)."""
        if self.logits is None:
            return [self.target]
        return [processors.process_logits(self.logits, settings) for settings in self.settings]


def law_cases(seed: int = 0) -> list[LawCase]:
    """The suite's law cases (V <= 16, k = 2), from ``seed``; ``dense`` and ``truncated``
    take the run's draws, the others a fifth of them (per settings group; half the
    ``seeded`` case's rows have their own generator), which their tests' stated power
    reflects:

    - ``dense`` (V = 12): Dirichlet(1) targets, drafts 0.6 q + 0.4 Dirichlet(1) (so most
      rows reach the later positions);
    - ``truncated`` (V = 16): both models' logits through top-k 8 and top-p 0.9 at T = 0.8,
      so q has zeros where p has mass and the other way round;
    - ``bfloat16`` (V = 8): dyadic rows with zeros (drafts near the targets), given in
      bfloat16;
    - ``seeded`` (V = 10): rows as ``dense``, half the rows with their own generator;
    - ``logits`` (V = 12): one logits block under three settings (T = 0.5 and top-k 4;
      T = 1.3 and top-p 0.8; T = 0.8, top-k 6 and top-p 0.9) in interleaved rows, drafts
      from noisy logits at T = 1 (untruncated, as vLLM's draft rows).
    """
    generator = np.random.default_rng(seed)
    steps = 2
    dense_target = generator.dirichlet(np.ones(12), size=steps + 1)
    dense_draft = 0.6 * dense_target[:steps] + 0.4 * generator.dirichlet(np.ones(12), size=steps)
    truncate = SamplingSettings(temperature=0.8, top_k=8, top_p=0.9)
    logits = generator.normal(size=(steps + 1, 16)) * 1.5
    truncated_target = processors.process_logits(logits, truncate)
    truncated_draft = processors.process_logits(
        logits[:steps] + generator.normal(size=(steps, 16)), truncate
    )
    dyadic_target = np.stack([dyadic_row(generator, 8, True) for _ in range(steps + 1)])
    dyadic_draft = np.stack([dyadic_row(generator, 8, True, row) for row in dyadic_target[:steps]])
    seeded_target = generator.dirichlet(np.ones(10), size=steps + 1)
    seeded_draft = 0.6 * seeded_target[:steps] + 0.4 * generator.dirichlet(np.ones(10), size=steps)
    group_logits = generator.normal(size=(steps + 1, 12)) * 1.5
    groups = [
        SamplingSettings(temperature=0.5, top_k=4),
        SamplingSettings(temperature=1.3, top_p=0.8),
        SamplingSettings(temperature=0.8, top_k=6, top_p=0.9),
    ]
    group_draft = processors.process_logits(
        group_logits[:steps] + 0.5 * generator.normal(size=(steps, 12))
    )
    return [
        LawCase("dense", "law", rounded(dense_target, "float32"), rounded(dense_draft, "float32")),
        LawCase(
            "truncated",
            "law",
            rounded(truncated_target, "float32"),
            rounded(truncated_draft, "float32"),
        ),
        LawCase(
            "bfloat16", "law-low-precision", dyadic_target, dyadic_draft, "bfloat16", share=0.2
        ),
        LawCase(
            "seeded",
            "law-seeded-rows",
            rounded(seeded_target, "float32"),
            rounded(seeded_draft, "float32"),
            seeded=True,
            share=0.2,
        ),
        LawCase(
            "logits",
            "law-logits",
            np.zeros((steps + 1, 12)),
            rounded(group_draft, "float32"),
            logits=rounded(group_logits, "float32"),
            settings=groups,
            share=0.2,
        ),
    ]
