"""The engines ``cactus conform`` checks, each a list of variants (one report each).

=============  ===============================================================  ==========
engine         variants                                                         needs
=============  ===============================================================  ==========
transformers   ``_speculative_sampling`` claiming SpS, with assisted generation     transformers
               end to end (``hf_transformers``, ``assisted``); with
               ``assistant_ensemble_weight`` w = 0.7 claiming ``interp:alpha=0.3``
               where the installed version has it (5.25, not 5.17-5.19)
vllm           V1 ``rejection_sample`` on the CPU stand-ins, stock (``vllm_cpu``)   vLLM (CPU)
               and with this project's probed fix of vllm #55005
cactus-torch   ``sampler.verify`` with every registered rule (``cactus_torch``)    torch
cactus-vllm    the plug-in's accept step with every registered rule                vLLM (CPU)
               (``cactus_vllm``)
planted        the planted defects and their control (``..planted``)               torch
flashinfer     FlashInfer's ``chain_speculative_sampling`` (``gpu``)               CUDA
sglang         SGLang's ``tree_speculative_sampling_target_only`` on a chain,       CUDA
               thresholds (1, 1) and (0.9, 0.5) (``gpu``)
vllm-triton    vLLM's ``rejection_sample`` with its Triton kernels (``gpu``)        CUDA
=============  ===============================================================  ==========

The GPU engines are run by ``scripts/gpu_check.sh`` on a CUDA machine (not in CI here).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

ENGINES = ("transformers", "vllm", "cactus-torch", "cactus-vllm")
#: Engine names ``cactus conform`` also takes (not part of ``--all``).
EXTRA_ENGINES = ("planted", "flashinfer", "sglang", "vllm-triton")
#: The thresholds (single, acc) SGLang's kernel is checked at.
SGLANG_THRESHOLDS = ((1.0, 1.0), (0.9, 0.5))
#: The DIVERSE ensemble weight the transformers variant is checked at.
ENSEMBLE_WEIGHT = 0.7


@dataclass(frozen=True)
class Variant:
    """One adapter of an engine: ``key`` builds it (``build``); ``main`` variants run the
    full draws, the others (the non-SpS rules of our own engines) the reduced ones."""

    engine: str
    key: str
    main: bool = True


def missing(engine: str) -> str | None:
    """Why ``engine`` cannot run in this Python, or None."""
    if engine not in ENGINES + EXTRA_ENGINES:
        raise ValueError(
            f"engine: unknown engine {engine!r}; choose from {', '.join(ENGINES + EXTRA_ENGINES)}"
        )
    if engine in ("flashinfer", "sglang", "vllm-triton"):
        from cactus_theory.testing.conformance.adapters import gpu

        return gpu.missing(engine)
    needs = {"transformers": "transformers", "vllm": "vllm", "cactus-vllm": "vllm"}
    module = needs.get(engine, "torch")
    return None if installed(module) else f"{module} is not installed in this Python"


def installed(module: str) -> bool:
    """Whether ``module`` is an installed package (a folder of the same name on sys.path,
    such as the tests' ``tests/vllm``, is a namespace package and does not count)."""
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.origin not in (None, "namespace")


def variants(engine: str, rule_specs: list[str] | None = None) -> list[Variant]:
    """The variants of ``engine`` (``rule_specs``: the rules of our own engines; default
    every registered rule)."""
    if engine == "transformers":
        from cactus_theory.testing.conformance.adapters import hf_transformers

        found = [Variant(engine, "sps")]
        if hf_transformers.has_ensemble_weight():
            found.append(Variant(engine, f"ensemble:{ENSEMBLE_WEIGHT:g}"))
        return found
    if engine == "vllm":
        return [Variant(engine, "stock"), Variant(engine, "fixed")]
    if engine == "planted":
        from cactus_theory.testing.conformance import planted

        return [Variant(engine, name) for name in planted.DEFECTS]
    if engine == "sglang":
        return [Variant(engine, f"{single:g},{acc:g}") for single, acc in SGLANG_THRESHOLDS]
    if engine in ("flashinfer", "vllm-triton"):
        return [Variant(engine, "sps")]
    from cactus_theory.testing.conformance.adapters import cactus_torch

    specs = rule_specs if rule_specs is not None else cactus_torch.every_rule_spec()
    runnable = [spec for spec in specs if not spec.endswith(":parameters?")]
    return [Variant(engine, spec, main=spec == "sps") for spec in runnable]


def build(variant: Variant, device: str = "cpu"):
    """The ``Adapter`` of ``variant`` (``device``: where cactus-torch's sampler runs)."""
    engine, key = variant.engine, variant.key
    if engine == "transformers":
        from cactus_theory.testing.conformance.adapters import hf_transformers

        if key == "sps":
            return hf_transformers.adapter()
        return hf_transformers.adapter(weight=float(key.split(":", 1)[1]), assisted=False)
    if engine == "vllm":
        from cactus_theory.testing.conformance.adapters import vllm_cpu

        return vllm_cpu.adapter(fixed=key == "fixed")
    if engine == "cactus-torch":
        from cactus_theory.testing.conformance.adapters import cactus_torch

        return cactus_torch.adapter(key, device)
    if engine == "cactus-vllm":
        from cactus_theory.testing.conformance.adapters import cactus_vllm

        return cactus_vllm.adapter(key)
    if engine in ("flashinfer", "sglang", "vllm-triton"):
        from cactus_theory.testing.conformance.adapters import gpu

        if engine == "flashinfer":
            return gpu.flashinfer_adapter()
        if engine == "sglang":
            single, acc = (float(value) for value in key.split(","))
            return gpu.sglang_adapter(single, acc)
        return gpu.vllm_triton_adapter()
    from cactus_theory.testing.conformance import planted

    return planted.adapter(key)
