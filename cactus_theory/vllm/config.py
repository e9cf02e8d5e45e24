"""Which rule verifies each row: the engine default, per-request overrides, and the batch
context the model runner hands to the accept step.

Resolution, per request row (first that is set wins):

1. ``SamplingParams(extra_args={"cactus_rule": SPEC})``: SPEC is a rule spec
   (``"cactus:delta=1.0"``), or ``"vllm"`` for vLLM's own rejection sampler on that row;
2. the engine's ``additional_config={"cactus_rule": SPEC}`` (set by ``engine.cactus_llm``);
3. the environment variable ``CACTUS_VLLM_RULE`` (the plug-in's switch: without it the
   entry point installs nothing).

A row whose rule resolves to ``None`` (``"vllm"``) keeps vLLM's own sampler.

**What a request may name.** A spec names a registered rule only (``rules.parse`` looks
names up in the registry and never imports anything), so a request can choose among the
rules the server loaded (built-ins, the engines' rules, installed plug-ins, and the modules
of ``CACTUS_RULES_MODULES``, which every vLLM process inherits) and can never load code. A
value that is not a string (a list, a dict, a number) is a ValueError naming
``vllm_xargs.cactus_rule``, answered with HTTP 400.
"""

from __future__ import annotations

import contextvars
import functools
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from cactus_theory.core import rules
from cactus_theory.core.rules.base import Rule, exact_family
from cactus_theory.core.rules.sps import SpS

#: The attribute that marks a function the plug-in has already patched (patching is idempotent).
MARK = "_cactus_patched"
#: Environment variable holding the default rule spec; it also switches the plug-in on.
ENV_RULE = "CACTUS_VLLM_RULE"
#: Environment variable: "0" turns the in-engine KL meter off (acceptance is still counted).
ENV_METER = "CACTUS_VLLM_METER"
#: Key of the rule spec in ``SamplingParams.extra_args`` and ``additional_config``.
RULE_KEY = "cactus_rule"
#: The spec that selects vLLM's own rejection sampler for a row.
VLLM_SPEC = "vllm"
#: The request field of a per-request spec in vLLM's HTTP API (``SamplingParams.extra_args``
#: is filled from the request's ``vllm_xargs``).
REQUEST_FIELD = "vllm_xargs.cactus_rule"


def parse_spec(spec: object) -> Rule | None:
    """The rule of ``spec`` (``None`` for ``"vllm"``); ValueError naming ``spec`` if bad,
    including a value that is not a string (checked before the cache, which would raise
    TypeError on an unhashable list or dict)."""
    if not isinstance(spec, str):
        raise ValueError(f"spec: expected a rule spec string, got {type(spec).__name__}")
    return _parse_string(spec)


@functools.lru_cache(maxsize=256)
def _parse_string(spec: str) -> Rule | None:
    if spec.strip() == VLLM_SPEC:
        return None
    return rules.parse(spec)


def check_request_spec(extra_args: dict | None, draft_sample_method: str | None) -> None:
    """Check a request's spec (``extra_args["cactus_rule"]``, if any) before it reaches the
    engine: ValueError naming ``REQUEST_FIELD`` for a bad spec, or for a rule that reads the
    draft's row when the drafts are one-hot (``draft_sample_method`` other than
    "probabilistic"; None: no speculation, nothing to check there)."""
    if not isinstance(extra_args, dict) or RULE_KEY not in extra_args:
        return
    spec = extra_args[RULE_KEY]
    try:
        rule = parse_spec(spec)
    except ValueError as error:
        raise ValueError(f"{REQUEST_FIELD}: {error}") from None
    if rule is None or draft_sample_method in (None, "probabilistic"):
        return
    if needs_draft_probs(rule):
        raise ValueError(
            f"{REQUEST_FIELD}: rule {spec!r} needs the draft's probabilities, but this server "
            f"drafts with draft_sample_method={draft_sample_method!r} (one-hot drafts)"
        )


def needs_draft_probs(rule: Rule) -> bool:
    """True for rules whose decisions need the draft's real row p, not a one-hot.

    SpS with a one-hot draft is exactly vLLM's own lossless path for a greedy draft (the
    one-hot is then the draft's true law), and decision rules in their closed form (tas,
    topk, greedy, relaxed, relaxed-ratio) never read p; every other rule (cactus,
    cactus-exact, frontier, pareto, interp, sglang, a user's rule) may.
    """
    return not (isinstance(rule, SpS) or exact_family(rule) == "decision")


def env_default() -> str | None:
    """The spec in ``CACTUS_VLLM_RULE``, or None when unset or empty."""
    value = os.environ.get(ENV_RULE, "").strip()
    return value or None


def meter_enabled() -> bool:
    """False when ``CACTUS_VLLM_METER=0``: the KL meter is skipped (its O(V log V) cost)."""
    return os.environ.get(ENV_METER, "1").strip() != "0"


#: Key of the meter switch in ``additional_config`` (True/False; default: ``ENV_METER``).
METER_KEY = "cactus_meter"


@dataclass(frozen=True)
class BatchRules:
    """The rule of each row of the batch being verified (``None``: vLLM's own sampler), and
    the engine's meter switch (None: ``meter_enabled()``)."""

    specs: tuple[str | None, ...]
    meter: bool | None = None

    @property
    def rules(self) -> list[Rule | None]:
        return [None if spec is None else parse_spec(spec) for spec in self.specs]


_CURRENT: contextvars.ContextVar[BatchRules | None] = contextvars.ContextVar(
    "cactus_batch_rules", default=None
)


def spec_of_request(extra_args: dict | None, engine_default: str | None) -> str | None:
    """The spec one request row resolves to (``None``: vLLM's sampler); see the module
    docstring."""
    spec = (extra_args if isinstance(extra_args, dict) else {}).get(RULE_KEY, engine_default)
    if spec is None:
        return None
    if parse_spec(spec) is None:
        return None
    return spec


@contextmanager
def batch_rules(specs: Sequence[str | None], meter: bool | None = None) -> Iterator[None]:
    """Make ``specs`` (one per batch row) the rules of the accept step called inside, and
    ``meter`` (None: the environment's) its meter switch."""
    token = _CURRENT.set(BatchRules(tuple(specs), meter))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_specs(batch_size: int) -> list[str | None]:
    """The specs of the ``batch_size`` rows being verified: the model runner's (set by
    ``batch_rules``) when their count matches, else the engine default for every row."""
    found = _CURRENT.get()
    if found is not None and len(found.specs) == batch_size:
        return list(found.specs)
    default = env_default()
    return [spec_of_request(None, default)] * batch_size


def current_meter() -> bool:
    """Whether the accept step running now measures KL: the engine's switch (set by the
    model runner from ``additional_config["cactus_meter"]``), else ``meter_enabled()``."""
    found = _CURRENT.get()
    if found is not None and found.meter is not None:
        return found.meter
    return meter_enabled()
