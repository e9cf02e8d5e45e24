"""Where cached results live, and a fingerprint of the code that made them.

Every cache in the toolkit (tokenizer, n-gram models, the trained pair, sweep cells, the
claims check) lives under ``cache_root()`` or a folder the user names, and every cache key
that depends on our own code includes ``source_fingerprint`` of the packages involved, so
editing a rule can never serve a stale result. ``fingerprint`` keys caches by settings.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

_REPOSITORY = Path(__file__).resolve().parents[2]


def cache_root() -> Path:
    """``$CACTUS_CACHE``, else ``$XDG_CACHE_HOME/cactus-theory`` (``~/.cache/cactus-theory``)."""
    explicit = os.environ.get("CACTUS_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "cactus-theory"


def fingerprint(*parts: object) -> str:
    """A short stable sha256 of JSON-able ``parts`` (settings, file lists): a cache key."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def source_fingerprint(*packages: str) -> str:
    """A short sha256 of every ``.py`` file (path and bytes) under the named packages or
    files, given as paths from the repository root (``"sims"``, ``"cactus_theory/core"``,
    ``"cactus_theory/real/decode_table.py"``)."""
    digest = hashlib.sha256()
    for package in packages:
        folder = _REPOSITORY / package
        if folder.is_file() and folder.suffix == ".py":
            files = [folder]
        elif folder.is_dir():
            files = sorted(folder.rglob("*.py"))
        else:
            raise ValueError(f"packages: {package!r} is not a package of this repository")
        for path in files:
            digest.update(str(path.relative_to(_REPOSITORY)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
