"""Real text that no one here wrote: the running Python's standard-library sources.

Every machine with Python has these files, so the real-text source needs no download.
This module owns the corpus, its train/held-out split, the BPE tokenizer trained on the
train split, and the encoded token streams. Everything expensive is cached on disk under
``cache_dir()``, keyed by the settings and by a fingerprint of the file list, so a second
run (or a second tool: the sims' n-gram models and ``cactus train-pair``) reuses it.

- Files: ``*.py`` under ``sysconfig.get_paths()["stdlib"]``, excluding ``site-packages``
  and test folders (``test``, ``tests``, ``idle_test``), read as UTF-8 (unreadable files
  are skipped), sorted by relative path.
- Split: a file is held out when ``crc32(relative path) % 1000 < 1000 * held_out``, which
  is stable across machines and Python versions for the files they share.
- Tokenizer: byte-level BPE (``tokenizers``), default vocabulary 4096, with the special
  token ``<|endoftext|>`` (id 0) that separates documents in the token streams.
"""

from __future__ import annotations

import hashlib
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cactus_theory.util import provenance
from cactus_theory.util.files import atomic_write, atomic_write_bytes
from cactus_theory.util.provenance import fingerprint

END_OF_TEXT = "<|endoftext|>"
EXCLUDED_PARTS = frozenset({"site-packages", "test", "tests", "idle_test", "__pycache__"})


def cache_dir() -> Path:
    """The cache folder ``provenance.cache_root()`` (``$CACTUS_CACHE`` or
    ``~/.cache/cactus-theory``), created."""
    path = provenance.cache_root()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"CACTUS_CACHE: cannot create cache folder {path} ({error})") from None
    return path


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The corpus files, sorted by path relative to ``root`` (default: the stdlib)."""
    base = stdlib_root() if root is None else Path(root)
    if not base.is_dir():
        raise ValueError(f"root: {base} is not a folder")
    files = [
        path
        for path in base.rglob("*.py")
        if not EXCLUDED_PARTS.intersection(path.relative_to(base).parts)
    ]
    return sorted(files, key=lambda path: path.relative_to(base).as_posix())


@dataclass(frozen=True)
class Corpus:
    """Documents of one split: relative names and texts, in a fixed order."""

    names: tuple[str, ...]
    texts: tuple[str, ...]


def _is_held_out(relative_name: str, held_out: float) -> bool:
    return zlib.crc32(relative_name.encode()) % 1000 < round(1000 * held_out)


def load_corpus(split: str, *, held_out: float = 0.1, root: Path | None = None) -> Corpus:
    """The ``"train"`` or ``"heldout"`` documents of the standard-library corpus."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split: must be 'train' or 'heldout', got {split!r}")
    if not 0.0 < held_out < 1.0:
        raise ValueError(f"held_out: must lie in (0, 1), got {held_out!r}")
    base = stdlib_root() if root is None else Path(root)
    names, texts = [], []
    for path in stdlib_files(base):
        name = path.relative_to(base).as_posix()
        if _is_held_out(name, held_out) != (split == "heldout"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            names.append(name)
            texts.append(text)
    if not texts:
        raise ValueError(f"root: no readable .py files for split {split!r} under {base}")
    return Corpus(tuple(names), tuple(texts))


def corpus_fingerprint(corpus: Corpus) -> str:
    return fingerprint(corpus.names, [len(text) for text in corpus.texts])


def train_tokenizer(vocab_size: int = 4096, *, held_out: float = 0.1, root: Path | None = None):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on the train split (cached)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if not isinstance(vocab_size, int) or vocab_size < 300:
        raise ValueError(f"vocab_size: must be an integer >= 300, got {vocab_size!r}")
    corpus = load_corpus("train", held_out=held_out, root=root)
    path = cache_dir() / f"tokenizer-{fingerprint(vocab_size, corpus_fingerprint(corpus))}.json"
    if path.exists():
        return Tokenizer.from_file(str(path))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus.texts, trainer)
    atomic_write_bytes(path, tokenizer.to_str().encode())
    return tokenizer


def token_stream(
    split: str, vocab_size: int = 4096, *, held_out: float = 0.1, root: Path | None = None
) -> np.ndarray:
    """All documents of ``split`` encoded and joined, each followed by ``<|endoftext|>``.

    Returns an int32 array (cached as .npy).
    """
    tokenizer = train_tokenizer(vocab_size, held_out=held_out, root=root)
    corpus = load_corpus(split, held_out=held_out, root=root)
    tokenizer_hash = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()
    key = fingerprint(split, vocab_size, corpus_fingerprint(corpus), tokenizer_hash)
    path = cache_dir() / f"tokens-{key}.npy"
    if path.exists():
        return np.load(path)
    end = tokenizer.token_to_id(END_OF_TEXT)
    pieces = []
    for encoding in tokenizer.encode_batch(list(corpus.texts)):
        pieces.append(np.asarray(encoding.ids, dtype=np.int32))
        pieces.append(np.asarray([end], dtype=np.int32))
    stream = np.concatenate(pieces)

    def save(temporary: Path) -> None:
        with temporary.open("wb") as handle:  # a file object: np.save adds no ".npy"
            np.save(handle, stream)

    atomic_write(path, save)
    return stream
