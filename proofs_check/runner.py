"""Run every check, with progress bars and a resumable on-disk cache.

``run(quick, seed, progress, cache_dir)`` returns the JSON-serialisable result

    {"claims": [row, ...], "curves": {...}, "mode": "quick" | "full", "seed": int,
     "fingerprint": str, "guarantees_hold": bool}

Each finished check is written to ``<cache>/proofs_check/<fingerprint>-<mode>-seed<N>/
<check>.json`` with an atomic rename, so an interrupted run resumes where it stopped; a
damaged or wrong-shaped file there is ignored and rewritten (``load_cached``). The
fingerprint hashes the source of proofs_check and the numpy core: editing either starts a
fresh cache. Without ``cache_dir`` the full run caches under ``$CACTUS_CACHE`` (or
``~/.cache/cactus-theory``) and the quick run does not cache at all.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from cactus_theory.util import provenance
from cactus_theory.util.files import atomic_write_text
from proofs_check import claims

#: The code a claims result depends on (the numpy core it checks, not the torch layers).
_PACKAGES = ("proofs_check", "cactus_theory/core", "cactus_theory/util")


def default_cache_root() -> Path:
    """The toolkit's cache root (``cactus_theory.util.provenance.cache_root``)."""
    return provenance.cache_root()


def source_fingerprint() -> str:
    """A short hash of every .py file in proofs_check and cactus_theory."""
    return provenance.source_fingerprint(*_PACKAGES)


def jsonable(value: Any) -> Any:
    """Plain JSON values: non-finite floats become the strings "inf", "-inf", "nan"."""
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def cache_folder(
    root: Path | str, *, quick: bool, seed: int, fingerprint: str | None = None
) -> Path:
    """Where ``run`` caches each finished check's JSON under the cache root ``root``
    (``fingerprint``: ``source_fingerprint()``, computed here unless given)."""
    mode = "quick" if quick else "full"
    fingerprint = fingerprint or source_fingerprint()
    return Path(root) / "proofs_check" / f"{fingerprint}-{mode}-seed{seed}"


def run(
    quick: bool = True,
    seed: int = 0,
    progress: bool = True,
    cache_dir: str | None = None,
    only: tuple[str, ...] | None = None,
) -> dict:
    """Every claim's verdict and the measured curves (see the module docstring).

    ``only`` restricts the run to the named checks (names from ``claims.checks()``).
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
    mode = "quick" if quick else "full"
    fingerprint = source_fingerprint()
    registry = claims.checks()
    names = [name for name, _ in registry]
    if only is not None:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise ValueError(f"only: unknown check {unknown[0]!r}; choose from {names}")
        registry = [(name, check) for name, check in registry if name in only]
    root = Path(cache_dir) if cache_dir is not None else (None if quick else default_cache_root())
    folder = None
    if root is not None:
        folder = cache_folder(root, quick=quick, seed=seed, fingerprint=fingerprint)
    context = claims.Context(quick=quick, seed=seed, progress=progress)

    from tqdm.auto import tqdm

    rows: list[dict] = []
    curves: dict[str, Any] = {}
    with tqdm(registry, desc=f"cactus check ({mode})", disable=not progress, unit="check") as bar:
        for name, check in bar:
            bar.set_postfix_str(name)
            path = None if folder is None else folder / f"{name}.json"
            result = None if path is None else load_cached(path, name)
            if result is None:
                result = jsonable(check(context))
                if path is not None:
                    record = {"check": name, "result": result}
                    atomic_write_text(path, json.dumps(record, ensure_ascii=False))
            rows.extend(result["rows"])
            curves.update(result.get("curves", {}))
    return {
        "claims": rows,
        "curves": curves,
        "mode": mode,
        "seed": seed,
        "fingerprint": fingerprint,
        "guarantees_hold": guarantees_hold(rows),
    }


#: The keys every claims-table row has (``claims.row``).
ROW_KEYS = ("id", "statement", "owner", "verdict", "instances", "worst_case", "counterexample")


def load_cached(path: Path, name: str) -> dict | None:
    """The cached result of check ``name``, or None when the file is missing or damaged
    (empty, truncated, not JSON, another check's, or rows without the table's keys): the
    check is then run again and the file replaced."""
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("check") != name:
        return None
    result = record.get("result")
    if not isinstance(result, dict) or not isinstance(result.get("rows"), list):
        return None
    if not all(isinstance(item, dict) and set(ROW_KEYS) <= set(item) for item in result["rows"]):
        return None
    if not isinstance(result.get("curves", {}), dict):
        return None
    return result


def guarantees_hold(rows: list[dict]) -> bool:
    """True unless one of our own claims (owner "ours") fails."""
    return all(item["verdict"] == "holds" for item in rows if item["owner"] == "ours")
