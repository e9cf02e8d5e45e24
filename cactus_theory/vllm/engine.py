"""Build a ``vllm.LLM`` whose accept step runs a rule of ``cactus_theory.rules``.

>>> llm = cactus_llm("path/to/verifier", "path/to/draft", rule="cactus:delta=1.0", k=3)
>>> out = llm.generate(prompts, sampling_params(temperature=1.0, max_tokens=64))
>>> metrics.read(llm)["cactus:delta=1.0"]["accepted_length"]

The rule is set for the engine (``additional_config["cactus_rule"]``, read in the workers)
and can be changed per request with ``sampling_params(rule=...)`` (``extra_args``);
``rule="vllm"`` there keeps vLLM's own sampler for that request.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from cactus_theory.core import rules
from cactus_theory.vllm import config, metrics, plugin


def speculative_config(
    draft: str, k: int, draft_sample_method: str = "probabilistic", **extra: Any
) -> dict[str, Any]:
    """vLLM's ``speculative_config`` for draft-model speculation with ``k`` drafts."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k: expected a positive number of drafts, got {k!r}")
    return {
        "method": "draft_model",
        "model": draft,
        "num_speculative_tokens": k,
        "draft_sample_method": draft_sample_method,
        **extra,
    }


def cactus_llm(
    model: str,
    draft: str,
    rule: str = "cactus:delta=1.0",
    k: int = 3,
    draft_sample_method: str = "probabilistic",
    meter: bool | None = None,
    rules_modules: Sequence[str] = (),
    **llm_kwargs: Any,
):
    """A ``vllm.LLM`` of ``model`` speculating with ``draft``, verified with ``rule``.

    Parameters
    ----------
    model, draft : verifier and draft model (folders or hub ids; same tokenizer).
    rule : the engine's rule spec (``rules.parse`` syntax), or ``"vllm"`` for vLLM's own.
    k : drafts per verify step (``num_speculative_tokens``).
    draft_sample_method : vLLM's; rules that read the draft row (``config.needs_draft_probs``)
        need "probabilistic" (with "greedy" vLLM passes no draft probabilities).
    meter : measure the exact KL per token in the engine (``metrics``); None: as
        ``CACTUS_VLLM_METER`` says (default on). It costs an O(W log W) pass per emitted
        token, W the support of q and p (vLLM's draft rows are never truncated, so the
        whole vocabulary); serving may want it off.
    rules_modules : modules (dotted names or ``.py`` paths) that register your own rules
        (``rules.register``): imported here and exported in ``CACTUS_RULES_MODULES``, so the
        engine's processes know the rules too (a rule registered only in this process is
        unknown to a spawned worker).
    llm_kwargs : passed to ``vllm.LLM`` (e.g. ``tensor_parallel_size``, ``dtype``,
        ``enforce_eager``, ``max_model_len``); ``speculative_config`` entries given there
        are merged in; ``disable_log_stats`` defaults to False and ``worker_extension_cls``
        to ``metrics.EXTENSION`` (so ``metrics.read`` works with a multiprocess engine).

    Sets ``CACTUS_VLLM_RULE`` (if unset) so that engine processes started from here load
    the plug-in, and installs it in this process.
    """
    rules.load_modules(rules_modules, argument="rules_modules", export=True)
    parsed = config.parse_spec(rule)
    if parsed is not None and config.needs_draft_probs(parsed):
        if draft_sample_method != "probabilistic":
            raise ValueError(
                f"draft_sample_method: rule {rule!r} needs the draft's probabilities; "
                "use 'probabilistic'"
            )
    from vllm import LLM

    os.environ.setdefault(config.ENV_RULE, rule)
    plugin.install()
    spec_config = speculative_config(
        draft, k, draft_sample_method, **llm_kwargs.pop("speculative_config", {})
    )
    additional = {**llm_kwargs.pop("additional_config", {}), config.RULE_KEY: rule}
    if meter is not None:
        additional[config.METER_KEY] = bool(meter)
    llm_kwargs.setdefault("disable_log_stats", False)
    llm_kwargs.setdefault("worker_extension_cls", metrics.EXTENSION)
    return LLM(
        model=model,
        speculative_config=spec_config,
        additional_config=additional,
        **llm_kwargs,
    )


def sampling_params(rule: str | None = None, **kwargs: Any):
    """``vllm.SamplingParams(**kwargs)``, verified with ``rule`` when given (checked here,
    in the caller, so a bad spec never reaches the engine)."""
    from vllm import SamplingParams

    extra = dict(kwargs.pop("extra_args", None) or {})
    if rule is not None:
        config.parse_spec(rule)
        extra[config.RULE_KEY] = rule
    return SamplingParams(extra_args=extra or None, **kwargs)
