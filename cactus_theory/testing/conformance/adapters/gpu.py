"""Adapters for GPU-only kernels (CUDA): FlashInfer's chain kernel, SGLang's tree kernel on
a chain, vLLM's Triton path. Written from the kernels' published signatures and sources;
**not run in this project's CI** (no GPU); ``scripts/gpu_check.sh`` runs them the day a
CUDA machine with these packages is at hand. Every import is guarded (``missing``).

**FlashInfer** ``flashinfer.sampling.chain_speculative_sampling``. Two APIs:

- with ``uniform_samples`` [B, k+1] (up to 0.2): accept draft i iff u[b, i] · p < q
  (strict, so a draft with p_n = 0 and q_n > 0 is accepted); the token after a rejection
  at i is drawn by inverse CDF of (q − p)_+ with u[b, i+1] (u[b, k] for the bonus):
  ``reference.INVERSE_CDF_NEXT_COIN``, with u = (accept, sample);
- with ``generator`` / ``seed`` / ``offset`` (Philox inside the kernel): no uniforms can
  be injected, so only the law properties run (``injects=False``).

Its output: [B, k+1] ids (-1 padded), and the number of accepted drafts before the first
rejection (``output_emitted_draft_token_num``, called ``maybe_output_emitted_token_num``
in older versions).

**SGLang** ``sgl_kernel.tree_speculative_sampling_target_only`` on a chain (top-k 1): node
0 is the root, node j the j-th draft (``candidates`` [B, k+1]); ``retrive_next_token``
links j to j+1, no siblings. The draft of node j+1 is accepted iff
coin ≤ q_n / threshold_acc or q_n ≥ threshold_single, coin = ``uniform_samples[b, j]``
(the coin of the last accepted node); a rejected token's target mass is written into
``draft_probs`` (zeros on input), and the final token is drawn by inverse CDF of
(q − draft_probs)_+ with ``uniform_samples_for_final_sampling[b]``: q without the rejected
token, or the bonus row. That is the ``sglang`` rule whatever the draft law (the kernel
never reads p), claimed at the thresholds the adapter is built with; ``≤`` differs from
our ``u < a`` only at u = a, which ``exact-zero-target`` probes (SGLang #35771). Older
kernels without ``uniform_samples_for_final_sampling`` run the law properties only.

**vLLM's Triton path**: ``vllm_cpu.adapter(device="cuda")``: the same entry points with
vLLM's Triton kernels.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from cactus_theory.testing.conformance.adapter import Adapter
from cactus_theory.testing.conformance.adapters.cactus_torch import torch_uniforms
from cactus_theory.testing.conformance.reference import INVERSE_CDF, INVERSE_CDF_NEXT_COIN

Tensor = torch.Tensor
DEVICE = "cuda"
#: The module each GPU engine needs.
MODULES = {"flashinfer": "flashinfer", "sglang": "sgl_kernel", "vllm-triton": "vllm"}


def missing(engine: str) -> str | None:
    """Why the GPU engine cannot run here, or None."""
    from cactus_theory.testing.conformance.adapters import installed

    if not installed(MODULES[engine]):
        return f"{MODULES[engine]} is not installed in this Python"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def _cuda_generator(generator: Any) -> torch.Generator:
    seed = int(torch.randint(0, 2**62, (1,), generator=generator)) if generator else 0
    return torch.Generator(device=DEVICE).manual_seed(seed)


def flashinfer_verify(target_probs, draft_probs, draft_ids, generator, uniforms=None):
    """The harness's verify function for FlashInfer's chain kernel (module docstring)."""
    from flashinfer import sampling

    function = sampling.chain_speculative_sampling
    parameters = inspect.signature(function).parameters
    batch, steps = draft_ids.shape
    draft = draft_probs.to(DEVICE, torch.float32).contiguous()
    target = target_probs.to(DEVICE, torch.float32).contiguous()
    ids = draft_ids.to(DEVICE, torch.int32).contiguous()
    accepted = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    emitted = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    if "uniform_samples" in parameters:
        if uniforms is None:
            coins = torch.rand(batch, steps + 1, generator=generator, dtype=torch.float64)
        else:
            accept, sample = torch_uniforms(uniforms, torch.device("cpu"))
            coins = torch.cat([accept, sample[:, None]], dim=1)
        output = function(
            draft, ids, coins.to(DEVICE, torch.float32), target, accepted, emitted,
            deterministic=True,
        )  # fmt: skip
    else:
        keywords = {"generator": _cuda_generator(generator), "deterministic": True}
        output = function(draft, ids, target, accepted, emitted, **keywords)
    token_ids = output[0] if isinstance(output, tuple) else output
    return token_ids.cpu().to(torch.int64), emitted.cpu().to(torch.int64)


def flashinfer_adapter() -> Adapter:
    import flashinfer
    from flashinfer import sampling

    injects = "uniform_samples" in inspect.signature(sampling.chain_speculative_sampling).parameters
    return Adapter(
        name="flashinfer",
        verify=flashinfer_verify,
        rule="sps",
        version=getattr(flashinfer, "__version__", ""),
        recovery=INVERSE_CDF_NEXT_COIN,
        injects=injects,
        dtypes=(),
        notes=(
            "FlashInfer chain_speculative_sampling: accept iff u*p < q; the token after a "
            "rejection at i uses uniform i+1; float32 inputs only",
        ),
    )


def sglang_verify_with(threshold_single: float, threshold_acc: float):
    """The harness's verify function for SGLang's tree kernel on a chain (module docstring)."""

    def verify(target_probs, draft_probs, draft_ids, generator, uniforms=None):
        import sgl_kernel

        function = sgl_kernel.tree_speculative_sampling_target_only
        parameters = inspect.signature(function).parameters
        batch, steps = draft_ids.shape
        nodes = steps + 1
        root = torch.zeros(batch, 1, dtype=torch.int64)
        candidates = torch.cat([root, draft_ids.to(torch.int64)], dim=1).to(DEVICE)
        index = (torch.arange(batch)[:, None] * nodes + torch.arange(nodes)[None, :]).to(DEVICE)
        following = torch.arange(1, nodes + 1).clamp(max=nodes)[None, :].repeat(batch, 1)
        following[:, -1] = -1
        siblings = torch.full((batch, nodes), -1, dtype=torch.int64)
        if uniforms is None:
            drawn = torch.rand(batch, nodes + 1, generator=generator, dtype=torch.float64)
            coins, final = drawn[:, :nodes], drawn[:, nodes]
        else:
            accept, final = torch_uniforms(uniforms, torch.device("cpu"))
            coins = torch.cat([accept, final[:, None]], dim=1)
        predicts = torch.full((batch * nodes,), -1, dtype=torch.int32, device=DEVICE)
        accept_index = torch.full((batch, nodes), -1, dtype=torch.int32, device=DEVICE)
        accept_count = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
        arguments = [
            predicts, accept_index, accept_count, candidates, index,
            following.to(DEVICE), siblings.to(DEVICE), coins.to(DEVICE, torch.float32),
        ]  # fmt: skip
        if "uniform_samples_for_final_sampling" in parameters:
            arguments.append(final.to(DEVICE, torch.float32))
        arguments += [
            target_probs.to(DEVICE, torch.float32).contiguous(),
            torch.zeros(batch, nodes, target_probs.shape[-1], device=DEVICE),
        ]
        function(*arguments, threshold_single=threshold_single, threshold_acc=threshold_acc,
                 deterministic=True)  # fmt: skip
        count = accept_count.cpu().to(torch.int64)
        slots = accept_index.cpu().to(torch.int64)
        flat = predicts.cpu().to(torch.int64)
        token_ids = torch.full((batch, nodes), -1, dtype=torch.int64)
        for row in range(batch):
            taken = slots[row, : int(count[row]) + 1]
            token_ids[row, : taken.numel()] = flat[taken]
        return token_ids, count

    return verify


def sglang_adapter(threshold_single: float = 1.0, threshold_acc: float = 1.0) -> Adapter:
    import sgl_kernel

    function = sgl_kernel.tree_speculative_sampling_target_only
    injects = "uniform_samples_for_final_sampling" in inspect.signature(function).parameters
    return Adapter(
        name="sglang",
        verify=sglang_verify_with(threshold_single, threshold_acc),
        rule=f"sglang:threshold_single={threshold_single:g},threshold_acc={threshold_acc:g}",
        version=getattr(sgl_kernel, "__version__", ""),
        recovery=INVERSE_CDF,
        injects=injects,
        dtypes=(),
        notes=(
            "SGLang tree_speculative_sampling_target_only on a chain: accept iff coin <= "
            "q_n/t_acc or q_n >= t_single, the coin of the last accepted node; final token "
            "by inverse CDF of q without the rejected token",
        ),
    )


def vllm_triton_adapter() -> Adapter:
    from cactus_theory.testing.conformance.adapters import vllm_cpu

    return vllm_cpu.adapter(device=DEVICE)
