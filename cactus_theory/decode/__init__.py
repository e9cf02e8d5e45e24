"""Speculative decoding with any rule for Hugging Face causal LMs (batched, KV-cached).

- ``generate``: ``speculative_generate``, ``autoregressive_generate``, ``verifier_nll``;
- ``steps``: the steps of one speculative iteration (draft, verify, sample, measure,
  commit, roll back, retire) and the loop state;
- ``settings``: ``GenerationSettings`` (the keywords both generate functions share) and
  ``prepare`` (their checks and defaults); ``result``: ``DecodeResult``;
- ``cache``: the per-model KV cache of slots, its rollback and right-alignment;
- ``budget``: the per-sequence KL budget (``max_kl``; the divergence meter it reads is
  ``cactus_theory.sampler.divergence_meter``, shared with the vLLM plug-in);
- ``checks``: the decoder's input checks; ``loading``: models from a folder, a .gguf file
  or a hub id; ``feature_draft``: EAGLE-style drafts; ``runs``: pairs, prompts, totals;
- trees (``speculative_generate(tree=...)``): ``tree_shape`` (the shapes), ``tree_draft``
  (drafting level by level), ``tree_cache`` (4D tree masks, compaction, supported
  models), ``tree_steps`` (the tree loop's steps), ``tree_rules`` (which tree rule walks),
  ``tree_budget`` (``max_kl``), ``tree_stats`` (α by depth and rank, costs),
  ``tree_auto`` (``tree="auto"``).
"""

from cactus_theory.decode.checks import parse_rule
from cactus_theory.decode.generate import (
    DecodeResult,
    autoregressive_generate,
    speculative_generate,
    verifier_nll,
)

__all__ = [
    "DecodeResult",
    "autoregressive_generate",
    "parse_rule",
    "speculative_generate",
    "verifier_nll",
]
