"""``--dtype auto``: the weights dtype measured fastest for verification on this device.

Speculation pays when a verify call (one forward of k + 1 tokens at batch 1 on a KV cache)
costs little more than an autoregressive step, so the dtype that matters is the one that
makes that forward fastest. On CPU the answer depends on the machine (bfloat16 halves the
memory traffic, but without native bfloat16 units its matmuls may be slower than
float32's), so it is measured:

1. the verifier is loaded in float32 and a bfloat16 copy is made;
2. ``batch_size`` prompts of ``PROMPT_TOKENS`` token ids are prefilled into a KV cache
   (``decode.cache.CachedModel``, the decoder's own cache), then ``repeats`` times, for
   each dtype in turn (interleaved, so a slow spell on a shared machine hits both), a
   forward of ``verify_tokens`` = k + 1 tokens per row is timed and dropped from the cache
   again (the decoder's verify call at batch 1; a pool's generation step is
   ``verify_tokens`` = 1 at the pool's batch size, ``real.real_model``);
3. the dtype with the smaller fastest time wins (float32 on a tie within 2%, since it is
   exact): the minimum over repeats, because on a busy machine (the report measures
   while its sweep runs) contention only adds time, so the fastest of many interleaved
   runs is the closest to the machine's own cost, where a median still carries the
   load; the choice with both times is cached as JSON under
   ``cache_root()/dtype-choice/`` keyed by the verifier's identity (name, file sizes and
   mtimes), the device, the thread count, ``verify_tokens``, ``batch_size``, the torch
   version and the CPU (``cpu_identity``: its model name and the instruction set torch's
   kernels use, so a machine without AVX-512 or bfloat16 units never reads another's
   choice), so it is measured once per (model, device, threads, shape). A damaged cache
   file is measured again, never a traceback.

On CUDA nothing is measured: bfloat16 where ``torch.cuda.is_bf16_supported()``, float32
otherwise. float16 is never chosen automatically (its range overflows on some models);
``--dtype float16`` still asks for it.
"""

from __future__ import annotations

import json
import platform
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
REPEATS = 15


@dataclass(frozen=True)
class DtypeChoice:
    """The chosen dtype and why: the fastest seconds of one verify forward per measured
    dtype (empty on CUDA, where nothing is measured), and where it came from."""

    dtype: str
    reason: str
    verify_tokens: int
    seconds: dict[str, float] = field(default_factory=dict)
    cached: bool = False
    path: str | None = None
    repeats: int = REPEATS
    batch_size: int = 1

    def describe(self) -> str:
        """One line: the choice, the two times and whether they were measured now."""
        if not self.seconds:
            return f"dtype auto: {self.dtype} ({self.reason})"
        times = ", ".join(f"{name} {1e3 * value:.2f} ms" for name, value in self.seconds.items())
        source = f"cached in {self.path}" if self.cached else "measured now"
        return (
            f"dtype auto: {self.dtype} ({self.reason}; one forward of {self.verify_tokens} "
            f"token{'s' * (self.verify_tokens != 1)} at batch {self.batch_size} on a KV "
            f"cache: {times}, fastest of "
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


def cpu_identity() -> dict:
    """What decides which dtype is fastest on this CPU: its model name (``/proc/cpuinfo``),
    the instruction set torch's kernels dispatch to (``torch.backends.cpu.
    get_cpu_capability``: AVX2, AVX512, ...; ``ATEN_CPU_CAPABILITY`` lowers it) and whether
    oneDNN has bfloat16 units (``ONEDNN_MAX_CPU_ISA`` can switch them off)."""
    import torch

    name = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            name = next(
                (line.split(":", 1)[1].strip() for line in info if line.startswith("model name")),
                name,
            )
    except OSError:
        pass
    return {
        "machine": platform.machine(),
        "model": name,
        "capability": torch.backends.cpu.get_cpu_capability(),
        "bf16_units": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    }


def cache_path(
    verifier: str,
    device: str,
    threads: int,
    verify_tokens: int,
    cache_dir: Path | None = None,
    batch_size: int = 1,
) -> Path:
    """Where the choice for (verifier, device, threads, verify_tokens, batch_size) is
    cached, on this CPU (``cpu_identity``) and torch version."""
    import torch

    key = provenance.fingerprint(
        model_identity(verifier),
        str(device),
        threads,
        verify_tokens,
        torch.__version__,
        cpu_identity(),
        *([] if batch_size == 1 else [batch_size]),
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
    batch_size: int = 1,
) -> DtypeChoice:
    """The dtype for ``--dtype auto`` (module docstring): CUDA's rule, a cached CPU choice,
    or a fresh measurement (then cached). ``batch_size`` rows of ``verify_tokens`` tokens
    each are timed (1: the decoder's verify call at batch 1)."""
    import torch

    if verify_tokens < 1:
        raise ValueError(f"verify_tokens: must be >= 1, got {verify_tokens}")
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    device = torch.device(device)
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return DtypeChoice("bfloat16", "CUDA with bfloat16 support", verify_tokens)
        return DtypeChoice("float32", "this GPU does not support bfloat16", verify_tokens)
    path = cache_path(verifier, str(device), threads, verify_tokens, cache_dir, batch_size)
    cached = _load(path, verify_tokens, batch_size)
    if cached is not None:
        return cached
    seconds = measure(verifier, device, verify_tokens, repeats=repeats, batch_size=batch_size)
    choice = _decide(seconds, verify_tokens, path, repeats, batch_size)
    atomic_write_json(path, asdict(choice))
    return choice


def _decide(
    seconds: dict[str, float], verify_tokens: int, path: Path, repeats: int, batch_size: int = 1
) -> DtypeChoice:
    exact, fast = seconds["float32"], seconds["bfloat16"]
    if fast < (1.0 - TIE_MARGIN) * exact:
        dtype, reason = "bfloat16", f"{exact / fast:.2f}x faster than float32 here"
    else:
        dtype, reason = "float32", f"bfloat16 is not faster here ({fast / exact:.2f}x the time)"
    return DtypeChoice(
        dtype, reason, verify_tokens, dict(seconds), False, str(path), repeats, batch_size
    )


def _load(path: Path, verify_tokens: int, batch_size: int = 1) -> DtypeChoice | None:
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
        if int(data.get("batch_size", 1)) != batch_size:
            return None
        repeats = int(data["repeats"])
        return DtypeChoice(
            data["dtype"],
            str(data["reason"]),
            verify_tokens,
            seconds,
            True,
            str(path),
            repeats,
            batch_size,
        )
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def measure(
    verifier: str, device, verify_tokens: int, *, repeats: int = REPEATS, batch_size: int = 1
) -> dict[str, float]:
    """{dtype: fastest seconds of one forward of ``verify_tokens`` tokens per row at batch
    ``batch_size`` on a KV cache of ``PROMPT_TOKENS`` tokens per row} for each of
    ``CANDIDATES``, interleaved."""
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
    prompt = torch.randint(0, vocab, (batch_size, PROMPT_TOKENS), generator=generator)  # [B, P]
    block = torch.randint(0, vocab, (batch_size, verify_tokens), generator=generator)  # [B, n]
    caches = {name: _prefilled(one, prompt.to(device)) for name, one in models.items()}
    times: dict[str, list[float]] = {name: [] for name in CANDIDATES}
    for round_index in range(repeats + 1):  # round 0 warms up
        for name in CANDIDATES:
            elapsed = _verify_once(caches[name], block.to(device), device)
            if round_index:
                times[name].append(elapsed)
    return {name: min(values) for name, values in times.items()}


def _prefilled(model, prompt):
    """A ``CachedModel`` of ``model`` holding ``prompt`` [B, P]."""
    import torch

    from cactus_theory.decode.cache import CachedModel

    cached = CachedModel(model, prompt.shape[0], prompt.device)
    positions = torch.arange(prompt.shape[1], device=prompt.device)[None].expand_as(prompt)
    with torch.inference_mode():
        cached.forward(prompt, torch.ones_like(prompt), positions, keep=1)
    return cached


def _verify_once(cached, block, device) -> float:
    """Seconds of one forward of ``block`` [B, n] appended to the cache, then dropped."""
    import torch

    start_slot = cached.slots
    positions = start_slot + torch.arange(block.shape[1], device=device)[None]  # [1, n]
    positions = positions.expand_as(block)  # [B, n]
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


def workload_dtypes(
    verifier: str, device, *, pool_batch_size: int, verify_tokens: int, threads: int = 1
) -> dict[str, DtypeChoice]:
    """{"pools": choice, "decoder": choice}: the dtype measured fastest for a pool's work (a
    generation step, one token per row at ``pool_batch_size``, the bulk of building a pool)
    and for the decoder's (a verify call of ``verify_tokens`` = k + 1 tokens at batch 1),
    each ``choose_dtype``'s (cached per machine)."""
    return {
        "pools": choose_dtype(verifier, device, threads, 1, batch_size=pool_batch_size),
        "decoder": choose_dtype(verifier, device, threads, verify_tokens),
    }
