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
- Model Runner V2's ``rejection_sample`` -> ``runner_v2.rejection_sample`` (CUDA builds).
"""

from __future__ import annotations

import functools
from typing import Any

from cactus_theory.vllm import accept, config, cpu_fix, runner_v2

MARK = "_cactus_patched"


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


def install() -> None:
    """Install every patch (idempotent)."""
    _patch_accept()
    _patch_runner()
    cpu_fix.install()
    runner_v2.install()
