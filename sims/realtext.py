"""The real-text source: n-gram verifier and draft over the standard-library corpus.

- Verifier: an interpolated Kneser–Ney 4-gram; draft: a Kneser–Ney trigram (weaker), both
  fitted on the ``cactus_theory.real.corpus`` train stream with its BPE tokenizer and cached on
  disk.
- Both are processed by the same sampling settings (``cactus_theory.processors``; default
  the paper's T = 0.6, top-k 20, top-p 0.95; ``PLAIN_SETTING`` is T = 1 untruncated), so
  the draft row is exactly the law the drafted token is sampled from.
- ``heldout_pool`` gives (q, p) pairs in real held-out contexts (teacher forcing);
  ``TextModels`` is also what ``sims.montecarlo`` decodes with autoregressively.

Rows are compact (``sims.rows``): after top-k a row has a few dozen tokens out of 4096.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field

import numpy as np

from cactus_theory.core import validate
from cactus_theory.core.processors import PAPER_SETTING, SamplingSettings
from cactus_theory.real import corpus
from sims import ngram, rows
from sims.pools import PairPool

Array = np.ndarray


@dataclass(frozen=True)
class TextSettings:
    """Everything the real-text source depends on (part of every cache key)."""

    sampling: SamplingSettings = field(default_factory=lambda: PAPER_SETTING)
    vocab_size: int = 4096
    verifier_order: int = 4
    draft_order: int = 3
    held_out: float = 0.1

    def __post_init__(self) -> None:
        if not isinstance(self.sampling, SamplingSettings):
            raise ValueError("sampling: expected a processors.SamplingSettings")
        validate.positive_int("verifier_order", self.verifier_order)
        validate.positive_int("draft_order", self.draft_order)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def label(self) -> str:
        return (
            f"stdlib BPE-{self.vocab_size}, KN {self.verifier_order}-gram verifier / "
            f"{self.draft_order}-gram draft, {self.sampling.label}"
        )


class TextModels:
    """The verifier and draft LMs with their sampling settings; rows come out processed."""

    def __init__(self, settings: TextSettings, verifier, draft, heldout: Array) -> None:
        self.settings = settings
        self.verifier = verifier
        self.draft = draft
        self.heldout = heldout
        self.vocab_size = settings.vocab_size
        self.history_length = max(settings.verifier_order, settings.draft_order) - 1
        self._draft_table: rows.CompactRows | None = None
        self._tokenizer = None
        # A row depends only on the last order − 1 tokens: each context is processed once.
        self._verifier_memo = rows.RowMemo(
            lambda last: rows.process(self.verifier.probs(last), settings.sampling),
            self.vocab_size,
        )
        self._draft_memo = rows.RowMemo(
            lambda last: rows.process(self.draft.probs(last), settings.sampling),
            self.vocab_size,
        )

    @classmethod
    def from_corpus(cls, settings: TextSettings | None = None) -> TextModels:
        """Fit (or load from cache) both models on the stdlib train split."""
        return _models(settings or TextSettings())

    def verifier_rows(self, histories: Array) -> rows.CompactRows:
        """Processed verifier rows (the paper's q) for histories [R, history_length]."""
        return self._verifier_memo(self._last(histories, self.settings.verifier_order))

    def draft_rows(self, histories: Array) -> rows.CompactRows:
        """Processed draft rows (the paper's p) for histories [R, history_length]."""
        last = self._last(histories, self.settings.draft_order)
        if self.settings.draft_order == 2 and self._truncated:
            return self._draft_lookup().take(last[:, 0])
        return self._draft_memo(last)

    def verifier_token_probs(self, histories: Array, tokens: Array) -> Array:
        """[R]: the *raw* verifier probability (T = 1, untruncated) of each token."""
        return self.verifier.token_probs(
            self._last(histories, self.settings.verifier_order), tokens
        )

    def pairs(self, histories: Array) -> rows.AlignedPairs:
        """(q, p) for each history on the union of their supports."""
        return rows.align(self.verifier_rows(histories), self.draft_rows(histories))

    def prompts(self, count: int, rng: np.random.Generator) -> Array:
        """[count, history_length] held-out contexts to start decoding from."""
        positions = rng.integers(self.history_length, self.heldout.size, count)
        offsets = np.arange(-self.history_length, 0)
        return self.heldout[positions[:, None] + offsets].astype(np.int64)

    @property
    def tokenizer(self):
        """The BPE tokenizer the models were trained with (loaded once)."""
        if self._tokenizer is None:
            self._tokenizer = corpus.train_tokenizer(
                self.vocab_size, held_out=self.settings.held_out
            )
        return self._tokenizer

    def decode(self, tokens: object) -> str:
        """Text of token ids."""
        return self.tokenizer.decode([int(t) for t in np.asarray(tokens).ravel()])

    def token_text(self, token: int) -> str:
        """Text of one token (special tokens shown as they are)."""
        return self.tokenizer.decode([int(token)], skip_special_tokens=False)

    @property
    def _truncated(self) -> bool:
        sampling = self.settings.sampling
        return sampling.temperature == 0 or bool(sampling.top_k)

    def _draft_lookup(self) -> rows.CompactRows:
        """Processed bigram draft rows for every previous token, computed once (order 2 only)."""
        if self._draft_table is None:
            pieces = []
            every = np.arange(self.vocab_size, dtype=np.int64)[:, None]
            for start in range(0, self.vocab_size, 512):
                pieces.append(
                    rows.process(
                        self.draft.probs(every[start : start + 512]), self.settings.sampling
                    )
                )
            width = max(piece.width for piece in pieces)
            ids = np.concatenate([_pad(piece.ids, width, self.vocab_size) for piece in pieces])
            probs = np.concatenate([_pad(piece.probs, width, 0.0) for piece in pieces])
            self._draft_table = rows.CompactRows(ids, probs, self.vocab_size)
        return self._draft_table

    def _last(self, histories: Array, order: int) -> Array:
        history = np.asarray(histories)
        if history.ndim != 2 or history.shape[1] < order - 1:
            raise ValueError(
                f"histories: expected [R, >= {order - 1}] token ids, got shape {history.shape}"
            )
        return history[:, history.shape[1] - (order - 1) :]


def _pad(array: Array, width: int, value: float) -> Array:
    extra = width - array.shape[1]
    if extra == 0:
        return array
    return np.concatenate([array, np.full((array.shape[0], extra), value, array.dtype)], axis=1)


@functools.lru_cache(maxsize=4)
def _models(settings: TextSettings) -> TextModels:
    train = corpus.token_stream("train", settings.vocab_size, held_out=settings.held_out)
    heldout = corpus.token_stream("heldout", settings.vocab_size, held_out=settings.held_out)
    if train.size == 0 or heldout.size == 0:
        raise ValueError("tokens: the corpus split is empty")
    verifier = ngram.cached_model(train, settings.verifier_order, settings.vocab_size)
    draft = ngram.cached_model(train, settings.draft_order, settings.vocab_size)
    return TextModels(settings, verifier, draft, heldout)


def heldout_pool(
    models: TextModels, num_contexts: int = 2000, seed: int = 0, name: str = "text"
) -> PairPool:
    """(q, p) at ``num_contexts`` random held-out positions (teacher-forced contexts)."""
    count = validate.positive_int("num_contexts", num_contexts)
    histories = models.prompts(count, np.random.default_rng(seed))
    aligned = models.pairs(histories)
    return PairPool(
        name,
        aligned.target_probs,
        aligned.draft_probs,
        aligned.ids,
        models.vocab_size,
        f"Real text: {models.settings.label}; {count} held-out contexts",
        {**_flat(models.settings.as_dict()), "num_contexts": count, "seed": seed},
        contexts=histories,
    )


def _flat(settings: dict) -> dict:
    out = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            out.update({f"{key}.{inner}": item for inner, item in value.items()})
        else:
            out[key] = value
    return out
