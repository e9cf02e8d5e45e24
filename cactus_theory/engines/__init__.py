"""The inference engines' relaxed (lossy) acceptance rules, computed exactly.

Each engine ships a rule that accepts more drafts than speculative sampling, with no
divergence guarantee. Here each is one file written with the public rule API only
(``from cactus_theory import rules``), registered through ``rules.register`` exactly as a
user's plug-in is, so it gets every face: its exact law (``law.output_law``), the torch
sampler and decoder (its methods are written against the array API, so they run on
tensors as they are), the meter, every CLI ``--rule``, vLLM, and ``cactus_theory.testing``.

- ``sglang`` (``sglang.py``): SGLang's ``speculative_accept_threshold_single`` /
  ``speculative_accept_threshold_acc`` (sgl-kernel ``speculative_sampling.cuh``,
  ``TreeSpeculativeSamplingTargetOnly``);
- ``relaxed`` (``tensorrt_llm.py``): TensorRT-LLM's relaxed acceptance for MTP
  (``relaxed_topk``, ``relaxed_delta``; ``_torch/speculative/mtp.py`` and the
  ``mtpRelaxedAcceptanceKernel``), copied by Modular MAX and AMD ATOM;
- ``relaxed-ratio`` (``vllm_proposals.py``): the top-K-with-ratio relaxations proposed for
  vLLM V1 (vllm-project/vllm #21506, #22238, #43184, #45229; none merged);
- ``sglang-tree`` (``sglang_tree.py``, a tree rule registered with ``trees.register``):
  SGLang's thresholds as its tree kernel applies them to the siblings of a node.

The engines run the last two on greedy (one-hot) drafts only; with sampled drafts they are
defined here as written in each file, which is what the exact law then describes.

This package is loaded at rule discovery (``rules.discover``), not when
``cactus_theory.rules`` is imported.
"""

from cactus_theory import rules, trees
from cactus_theory.engines.sglang import SGLangThreshold
from cactus_theory.engines.sglang_tree import SGLangTree
from cactus_theory.engines.tensorrt_llm import RelaxedTopK
from cactus_theory.engines.vllm_proposals import RelaxedRatio

for _rule in (SGLangThreshold, RelaxedTopK, RelaxedRatio):
    rules.register(_rule)
trees.register(SGLangTree)

__all__ = ["RelaxedRatio", "RelaxedTopK", "SGLangThreshold", "SGLangTree"]
