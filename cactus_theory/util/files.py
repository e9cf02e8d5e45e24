"""All-or-nothing writes: a reader sees the old file, the new file, or nothing, never half.

Every writer of a cache or result file in the toolkit goes through ``atomic_write`` (or its
text and JSON forms, or ``atomic_folder`` for a folder written by someone else's code), so a
run killed at any instant leaves no truncated file behind for the next run to trip on.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


def atomic_write(path: Path | str, write: Callable[[Path], object]) -> Path:
    """Call ``write(temporary)`` on a temporary file beside ``path``, then rename it onto
    ``path`` (``os.replace``, atomic on POSIX). The temporary is removed if ``write`` fails.
    Parent folders are created. Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    temporary = Path(name)
    try:
        write(temporary)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


def atomic_write_bytes(path: Path | str, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    return atomic_write(path, lambda temporary: temporary.write_bytes(data))


def atomic_write_text(path: Path | str, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path | str, value: object, indent: int | None = 1) -> Path:
    """Write ``value`` as JSON to ``path`` atomically (``default=str`` for odd values)."""
    return atomic_write_text(path, json.dumps(value, indent=indent, default=str))


@contextlib.contextmanager
def atomic_folder(destination: Path | str) -> Iterator[Path]:
    """Yield a temporary folder beside ``destination``; on success it replaces
    ``destination`` (an old one is removed first), on failure it is deleted."""
    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(dir=destination.parent, prefix=f".{destination.name}."))
    try:
        yield temporary
        if destination.exists():
            shutil.rmtree(destination)
        os.replace(temporary, destination)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def check_writable(name: str, path: Path | str) -> Path:
    """Raise ``ValueError`` naming ``name`` unless a file can be created at ``path``.

    Checked before a long job starts, so an unwritable ``--json`` or ``--out`` is a clear
    error at once instead of a traceback after the work. Creates missing parent folders.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise ValueError(f"{name}: {str(path)!r} is a folder, expected a file path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".probe")
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise ValueError(f"{name}: cannot write {str(path)!r} ({error.strerror})") from None
    return path


def check_writable_folder(name: str, folder: Path | str) -> Path:
    """Raise ``ValueError`` naming ``name`` unless files can be created inside ``folder``
    (created if missing)."""
    folder = Path(folder).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{name}: {str(folder)!r} exists and is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".probe.")
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise ValueError(f"{name}: cannot write into {str(folder)!r} ({error.strerror})") from None
    return folder
