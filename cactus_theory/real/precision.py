"""``--dtype auto``: the weights dtype measured fastest for verification on this device.

Speculation pays when a verify call (one forward of k + 1 tokens at batch 1 on a KV cache)
costs little more than an autoregressive step, so the dtype that matters is the one that
makes that forward fastest. On CPU the answer depends on the machine (bfloat16 halves the
memory traffic, but without native bfloat16 units its matmuls may be slower than
float32's), so it is measured:

1. the verifier is loaded in float32 and a bfloat16 copy is made;
2. a prompt of ``PROMPT_TOKENS`` token ids is prefilled into a KV cache
   (``decode.cache.CachedModel``, the decoder's own cache), then ``repeats`` times, for
   each dtype in turn (interleaved, so a slow spell on a shared machine hits both), a
   forward of ``verify_tokens`` = k + 1 tokens is timed and dropped from the cache again;
3. the dtype with the smaller median time wins (float32 on a tie within 2%, since it is
   exact), and the choice with both medians is cached as JSON under
   ``cache_root()/dtype-choice/`` keyed by the verifier's identity (name, file sizes and
   mtimes), the device, the thread count, ``verify_tokens``, the torch version, the CPU
   and the instruction set in use (``isa_in_use``: ``ATEN_CPU_CAPABILITY=avx2
   ONEDNN_MAX_CPU_ISA=AVX2`` emulates an AVX2-only machine, where bfloat16 is slow), so it
   is measured once per (model, device, threads, ISA). A damaged cache file is
   measured again, never a traceback.

On CUDA nothing is measured: bfloat16 where ``torch.cuda.is_bf16_supported()``, float32
otherwise. float16 is never chosen automatically (its range overflows on some models);
``--dtype float16`` still asks for it.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cactus_theory.util import provenance
from cactus_theory.util.files import atomic_write_json

#: The dtypes measured on CPU, the exact one first (it wins ties).
CANDIDATES = ("float32", "bfloat16")
#: Relative margin within which float32 wins (bfloat16 must be clearly faster).
TIE_MARGIN = 0.02
PROMPT_TOKENS = 32
REPEATS = 9


@dataclass(frozen=True)
class DtypeChoice:
    """The chosen dtype and why: the median seconds of one verify forward per measured
    dtype (empty on CUDA, where nothing is measured), and where it came from."""

    dtype: str
    reason: str
    verify_tokens: int
    seconds: dict[str, float] = field(default_factory=dict)
    cached: bool = False
    path: str | None = None
    repeats: int = REPEATS

    def describe(self) -> str:
        """One line: the choice, the two times and whether they were measured now."""
        if not self.seconds:
            return f"dtype auto: {self.dtype} ({self.reason})"
        times = ", ".join(f"{name} {1e3 * value:.2f} ms" for name, value in self.seconds.items())
        source = f"cached in {self.path}" if self.cached else "measured now"
        return (
            f"dtype auto: {self.dtype} ({self.reason}; one verify forward of "
            f"{self.verify_tokens} tokens at batch 1 on a KV cache: {times}, median of "
            f"{self.repeats}; {source})"
        )


def model_identity(path_or_id: str) -> dict:
    """The model's name and, for a local folder or file, its files' names, sizes, mtimes."""
    path = Path(path_or_id).expanduser()
    files = sorted(path.rglob("*")) if path.is_dir() else [path] if path.exists() else []
    return {
        "model": str(path_or_id),
        "files": [
            (file.name, file.stat().st_size, int(file.stat().st_mtime))
            for file in files
            if file.is_file()
        ],
    }


def isa_in_use() -> str:
    """The instruction set torch's kernels and oneDNN run with here: ATen's CPU capability
    (``ATEN_CPU_CAPABILITY`` can lower it, e.g. to emulate an AVX2-only machine) and
    ``ONEDNN_MAX_CPU_ISA``; part of the cache key, since it decides the dtype."""
    import os

    import torch

    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")()
    return f"{capability}/{os.environ.get('ONEDNN_MAX_CPU_ISA', '')}"


def cache_path(
    verifier: str, device: str, threads: int, verify_tokens: int, cache_dir: Path | None = None
) -> Path:
    """Where the choice for (verifier, device, threads, verify_tokens) is cached."""
    import torch

    key = provenance.fingerprint(
        model_identity(verifier),
        str(device),
        threads,
        verify_tokens,
        torch.__version__,
        platform.machine(),
        platform.processor(),
        isa_in_use(),
    )
    root = provenance.cache_root() if cache_dir is None else Path(cache_dir)
    return root / "dtype-choice" / f"{key}.json"


def choose_dtype(
    verifier: str,
    device,
    threads: int,
    verify_tokens: int,
    *,
    cache_dir: Path | None = None,
    repeats: int = REPEATS,
) -> DtypeChoice:
    """The dtype for ``--dtype auto`` (module docstring): CUDA's rule, a cached CPU choice,
    or a fresh measurement (then cached)."""
    import torch

    if verify_tokens < 1:
        raise ValueError(f"verify_tokens: must be >= 1, got {verify_tokens}")
    device = torch.device(device)
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return DtypeChoice("bfloat16", "CUDA with bfloat16 support", verify_tokens)
        return DtypeChoice("float32", "this GPU does not support bfloat16", verify_tokens)
    path = cache_path(verifier, str(device), threads, verify_tokens, cache_dir)
    cached = _load(path, verify_tokens)
    if cached is not None:
        return cached
    seconds = measure(verifier, device, verify_tokens, repeats=repeats)
    choice = _decide(seconds, verify_tokens, path, repeats)
    atomic_write_json(path, asdict(choice))
    return choice


def _decide(seconds: dict[str, float], verify_tokens: int, path: Path, repeats: int) -> DtypeChoice:
    exact, fast = seconds["float32"], seconds["bfloat16"]
    if fast < (1.0 - TIE_MARGIN) * exact:
        dtype, reason = "bfloat16", f"{exact / fast:.2f}x faster than float32 here"
    else:
        dtype, reason = "float32", f"bfloat16 is not faster here ({fast / exact:.2f}x the time)"
    return DtypeChoice(dtype, reason, verify_tokens, dict(seconds), False, str(path), repeats)


def _load(path: Path, verify_tokens: int) -> DtypeChoice | None:
    """The cached choice, or None when missing or damaged (then it is measured again)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        seconds = {name: float(data["seconds"][name]) for name in CANDIDATES}
        if data["dtype"] not in CANDIDATES or min(seconds.values()) <= 0:
            return None
        if int(data["verify_tokens"]) != verify_tokens:
            return None
        repeats = int(data["repeats"])
        return DtypeChoice(
            data["dtype"], str(data["reason"]), verify_tokens, seconds, True, str(path), repeats
        )
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def measure(
    verifier: str, device, verify_tokens: int, *, repeats: int = REPEATS
) -> dict[str, float]:
    """{dtype: median seconds of one forward of ``verify_tokens`` tokens at batch 1 on a KV
    cache of ``PROMPT_TOKENS`` tokens} for each of ``CANDIDATES``, interleaved."""
    import copy

    import torch

    from cactus_theory.decode.checks import vocab_size
    from cactus_theory.decode.loading import load_model

    if repeats < 1:
        raise ValueError(f"repeats: must be >= 1, got {repeats}")
    model, _ = load_model("verifier", verifier, device, "float32")
    models = {"float32": model, "bfloat16": copy.deepcopy(model).to(torch.bfloat16)}
    generator = torch.Generator().manual_seed(0)
    vocab = vocab_size(model)
    prompt = torch.randint(0, vocab, (1, PROMPT_TOKENS), generator=generator)  # [1, P]
    block = torch.randint(0, vocab, (1, verify_tokens), generator=generator)  # [1, k+1]
    caches = {name: _prefilled(one, prompt.to(device)) for name, one in models.items()}
    times: dict[str, list[float]] = {name: [] for name in CANDIDATES}
    for round_index in range(repeats + 1):  # round 0 warms up
        for name in CANDIDATES:
            elapsed = _verify_once(caches[name], block.to(device), device)
            if round_index:
                times[name].append(elapsed)
    return {name: statistics.median(values) for name, values in times.items()}


def _prefilled(model, prompt):
    """A ``CachedModel`` of ``model`` holding ``prompt`` [1, P]."""
    import torch

    from cactus_theory.decode.cache import CachedModel

    cached = CachedModel(model, 1, prompt.device)
    positions = torch.arange(prompt.shape[1], device=prompt.device)[None]  # [1, P]
    with torch.inference_mode():
        cached.forward(prompt, torch.ones_like(prompt), positions, keep=1)
    return cached


def _verify_once(cached, block, device) -> float:
    """Seconds of one forward of ``block`` [1, n] appended to the cache, then dropped."""
    import torch

    start_slot = cached.slots
    positions = start_slot + torch.arange(block.shape[1], device=device)[None]  # [1, n]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with torch.inference_mode():
        start = time.perf_counter()
        cached.forward(block, torch.ones_like(block), positions)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        cached.keep(torch.zeros_like(block))  # the block's slots are dropped again
    return elapsed
