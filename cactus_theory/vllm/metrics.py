"""Acceptance and divergence metrics recorded inside the engine, readable from the caller.

The accept step (``accept.rejection_sample``) records, per rule spec and per verify step of
a row with at least one draft: the drafts verified, the drafts accepted, and (when the meter
is on) Σ KL(emitted law ‖ q) over the row's emitting positions, the exact per-token KL of
``sampler.law.emitted_divergence`` (the decoder's divergence meter; 0 for SpS and for a
bonus token). Counters live in the process that runs the model (each worker); the caller
reads them with ``read(llm)`` through ``LLM.collective_rpc``: by method name when the
engine was built with ``worker_extension_cls=EXTENSION`` (``engine.cactus_llm`` sets it;
needed with a multiprocess engine, whose RPC does not ship functions unless
``VLLM_ALLOW_INSECURE_SERIALIZATION=1``), else with a function of this module (works for
an in-process engine).

Rows that vLLM's own sampler verified are recorded under ``"vllm"`` (or ``"vllm-greedy"``
for temperature-0 rows), without KL.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class RuleCounters:
    """Totals for one rule spec: verify steps (rows with drafts), drafts verified, drafts
    accepted, tokens emitted (accepted + 1 per step), Σ KL (nats), and whether KL was
    measured on every step."""

    steps: int = 0
    drafts: int = 0
    accepted: int = 0
    tokens: int = 0
    kl_sum: float = 0.0
    kl_measured: bool = True

    def summary(self) -> dict[str, Any]:
        """The counters plus AL (accepted drafts per step, bonus excluded), tokens per step,
        the acceptance rate per draft and KL per emitted token (None if not measured)."""
        steps = max(self.steps, 1)
        return {
            **asdict(self),
            "accepted_length": self.accepted / steps,
            "tokens_per_step": self.tokens / steps,
            "acceptance_rate": self.accepted / max(self.drafts, 1),
            "kl_per_token": self.kl_sum / max(self.tokens, 1) if self.kl_measured else None,
        }


class Recorder:
    """Per-process counters keyed by rule spec (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: dict[str, RuleCounters] = {}

    def add(
        self,
        spec: str,
        drafts: list[int],
        accepted: list[int],
        kl: list[float] | None,
    ) -> None:
        """Record one verify step of len(drafts) rows verified with ``spec``."""
        if len(drafts) != len(accepted) or (kl is not None and len(kl) != len(drafts)):
            raise ValueError("accepted: expected one entry per row of drafts (and of kl)")
        with self._lock:
            counters = self.counters.setdefault(spec, RuleCounters())
            counters.steps += len(drafts)
            counters.drafts += sum(drafts)
            counters.accepted += sum(accepted)
            counters.tokens += sum(accepted) + len(accepted)
            if kl is None:
                counters.kl_measured = counters.kl_measured and spec.startswith("sps")
            else:
                counters.kl_sum += float(sum(kl))

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """{spec: summary} of everything recorded so far."""
        with self._lock:
            return {spec: counters.summary() for spec, counters in sorted(self.counters.items())}

    def reset(self) -> None:
        with self._lock:
            self.counters.clear()


_RECORDER = Recorder()


def recorder() -> Recorder:
    """This process's recorder."""
    return _RECORDER


#: The worker extension ``engine.cactus_llm`` installs (``worker_extension_cls``).
EXTENSION = "cactus_theory.vllm.metrics.MetricsExtension"


class MetricsExtension:
    """Mixed into vLLM's worker class: ``collective_rpc("cactus_metrics")`` and
    ``collective_rpc("cactus_metrics_reset")``."""

    def cactus_metrics(self) -> dict[str, dict[str, Any]]:
        return _RECORDER.snapshot()

    def cactus_metrics_reset(self) -> bool:
        _RECORDER.reset()
        return True


def _has_extension(llm: Any) -> bool:
    try:
        parallel = llm.llm_engine.vllm_config.parallel_config
    except AttributeError:
        return False
    return getattr(parallel, "worker_extension_cls", "") == EXTENSION


def worker_snapshot(worker: Any = None) -> dict[str, dict[str, Any]]:
    """Run in a worker by ``collective_rpc``: its counters' summaries."""
    return _RECORDER.snapshot()


def worker_reset(worker: Any = None) -> bool:
    """Run in a worker by ``collective_rpc``: clear its counters."""
    _RECORDER.reset()
    return True


def read(llm: Any) -> dict[str, dict[str, Any]]:
    """{spec: summary} from the engine of ``llm`` (a ``vllm.LLM``).

    Every worker runs the accept step on the same rows under tensor parallelism (and only
    the last pipeline stage samples), so the first worker that recorded anything speaks for
    the engine.
    """
    return first_snapshot(
        llm.collective_rpc("cactus_metrics" if _has_extension(llm) else worker_snapshot)
    )


def first_snapshot(snapshots: list[dict[str, dict[str, Any]] | None]) -> dict[str, dict]:
    """The engine's {spec: summary} from one snapshot per worker: the first that recorded
    anything (every worker runs the accept step on the same rows under tensor
    parallelism), else {}. ``read`` and the server's ``/metrics`` both answer this way."""
    for snapshot in snapshots:
        if snapshot:
            return snapshot
    return {}


def reset(llm: Any) -> None:
    """Clear the counters in every worker of ``llm``'s engine."""
    llm.collective_rpc("cactus_metrics_reset" if _has_extension(llm) else worker_reset)
