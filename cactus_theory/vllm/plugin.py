"""The ``vllm.general_plugins`` entry point and the patches it installs.

vLLM runs every ``vllm.general_plugins`` entry point in each of its processes (the caller,
EngineCore, each worker). ``register`` installs nothing unless ``CACTUS_VLLM_RULE`` is set,
so installing cactus-theory never changes vLLM's behaviour by itself. ``install`` (also
called by ``engine.cactus_llm`` in the caller's process) puts in place, once:

- ``vllm.v1.sample.rejection_sampler.rejection_sample`` -> ``accept.rejection_sample``
  (``RejectionSampler.forward`` looks the module attribute up at call time);
- ``GPUModelRunner._sample`` wrapped so that the accept step knows each row's rule from
  the request's ``SamplingParams.extra_args`` (``config``);
- the probed CPU fix of ``expand_batch_to_tokens`` (``cpu_fix``);
- the draft proposer's sampling, so that seeded requests draw their drafts from their own
  generator (``seeded_drafts``);
- Model Runner V2's ``rejection_sample`` -> ``runner_v2.rejection_sample`` (CUDA builds);
- ``InputProcessor._validate_params`` (where vLLM checks a request's sampling parameters,
  in the caller or the API server process) also checks the request's rule spec
  (``config.check_request_spec``): a bad spec is vLLM's ``VLLMValidationError`` naming
  ``vllm_xargs.cactus_rule`` (HTTP 400) and never reaches the engine;
- ``MultiprocExecutor.shutdown`` (in EngineCore) also unlinks the shared-memory ring
  buffers of its message queues once its workers are gone: when a signal reaches the
  worker processes too (Ctrl-C, a signal to the process group), a worker exits without
  unlinking the buffer it created, and the resource tracker warns of leaked shared memory;
  SIGTERM and SIGINT are ignored while it runs, so that the second signal vLLM's process
  manager sends does not cut the teardown short.
"""

from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cactus_theory.vllm import accept, config, cpu_fix, runner_v2, seeded_drafts
from cactus_theory.vllm.config import MARK


def register() -> None:
    """Entry point: install the patches only when ``CACTUS_VLLM_RULE`` is set."""
    if config.env_default() is None:
        return
    install()


def _patch_accept() -> None:
    from vllm.v1.sample import rejection_sampler

    original = rejection_sampler.rejection_sample
    if getattr(original, MARK, False):
        return

    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any):
        return accept.rejection_sample(original, *args, **kwargs)

    setattr(patched, MARK, True)
    rejection_sampler.rejection_sample = patched


def _additional(runner: Any) -> dict:
    extra = getattr(getattr(runner, "vllm_config", None), "additional_config", None)
    return extra if isinstance(extra, dict) else {}


def engine_default(runner: Any) -> str | None:
    """The engine's rule spec: ``additional_config["cactus_rule"]``, else the environment."""
    return _additional(runner).get(config.RULE_KEY) or config.env_default()


def engine_meter(runner: Any) -> bool | None:
    """The engine's meter switch ``additional_config["cactus_meter"]`` (None if unset)."""
    value = _additional(runner).get(config.METER_KEY)
    return None if value is None else bool(value)


def row_specs(runner: Any) -> list[str | None]:
    """The spec of each row of the runner's current batch (``config.spec_of_request``)."""
    default = engine_default(runner)
    specs = []
    for req_id in runner.input_batch.req_ids:
        state = runner.requests.get(req_id)
        params = None if state is None else state.sampling_params
        specs.append(config.spec_of_request(getattr(params, "extra_args", None), default))
    return specs


def _patch_runner() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner._sample
    if getattr(original, MARK, False):
        return

    @functools.wraps(original)
    def _sample(self, logits, spec_decode_metadata):
        if spec_decode_metadata is None:
            return original(self, logits, spec_decode_metadata)
        with config.batch_rules(row_specs(self), engine_meter(self)):
            return original(self, logits, spec_decode_metadata)

    setattr(_sample, MARK, True)
    GPUModelRunner._sample = _sample


def check_params(vllm_config: Any, params: Any) -> None:
    """``config.check_request_spec`` on ``params.extra_args`` (if any) with the engine's
    ``draft_sample_method``."""
    speculative = getattr(vllm_config, "speculative_config", None)
    method = None if speculative is None else getattr(speculative, "draft_sample_method", None)
    config.check_request_spec(getattr(params, "extra_args", None), method)


def _patch_input_check() -> None:
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.input_processor import InputProcessor

    original = InputProcessor._validate_params
    if getattr(original, MARK, False):
        return

    @functools.wraps(original)
    def _validate_params(self, params, *args: Any, **kwargs: Any):
        result = original(self, params, *args, **kwargs)
        try:
            check_params(self.vllm_config, params)
        except ValueError as error:
            value = (getattr(params, "extra_args", None) or {}).get(config.RULE_KEY)
            raise VLLMValidationError(
                str(error), parameter=config.REQUEST_FIELD, value=value
            ) from None
        return result

    setattr(_validate_params, MARK, True)
    InputProcessor._validate_params = _validate_params


def shm_buffers(executor: Any) -> list[Any]:
    """The shared-memory ring buffers of a ``MultiprocExecutor``'s message queues."""
    queues = [getattr(executor, "rpc_broadcast_mq", None)]
    queues += [getattr(w, "worker_response_mq", None) for w in getattr(executor, "workers", [])]
    queues += list(getattr(executor, "response_mqs", None) or [])
    found: dict[int, Any] = {}
    for queue in queues:
        buffer = getattr(queue, "buffer", None)
        if getattr(buffer, "shared_memory", None) is not None:
            found[id(buffer)] = buffer
    return list(found.values())


def unlink_buffers(buffers: list[Any]) -> None:
    """Unlink each buffer's shared memory (already gone is fine) and stop its own
    finaliser from unlinking it again."""
    for buffer in buffers:
        try:
            buffer.shared_memory.unlink()
        except FileNotFoundError:
            pass
        buffer.is_creator = False


@contextmanager
def signals_ignored() -> Iterator[None]:
    """SIGTERM and SIGINT ignored inside (main thread only; elsewhere a no-op): a second
    signal (vLLM's process manager sends SIGTERM to EngineCore after a signal to the group
    already reached it) must not end the executor's teardown half way. vLLM's manager still
    kills EngineCore after its shutdown timeout."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    for number in saved:
        signal.signal(number, signal.SIG_IGN)
    try:
        yield
    finally:
        for number, handler in saved.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)


def _patch_executor_shutdown() -> None:
    try:
        from vllm.v1.executor.multiproc_executor import MultiprocExecutor
    except ImportError:  # pragma: no cover - a vLLM without it
        return
    original = MultiprocExecutor.shutdown
    if getattr(original, MARK, False):
        return

    @functools.wraps(original)
    def shutdown(self) -> None:
        buffers = shm_buffers(self)
        with signals_ignored():
            try:
                original(self)
            finally:
                unlink_buffers(buffers)

    setattr(shutdown, MARK, True)
    MultiprocExecutor.shutdown = shutdown


def install() -> None:
    """Install every patch (idempotent)."""
    _patch_accept()
    _patch_runner()
    _patch_input_check()
    _patch_executor_shutdown()
    cpu_fix.install()
    seeded_drafts.install()
    runner_v2.install()
