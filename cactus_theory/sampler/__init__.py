"""The torch export: the numpy core's rules as a batched sampler (float32 compute).

Modules mirror ``cactus_theory.core`` file for file:

- ``rules/``: one torch adapter per numpy rule file (``rules.for_rule(rule)``);
- ``gamma``: γ*(q_n, δ) (closed forms, safeguarded Newton; float64);
- ``divergences``: elementwise KL terms and the binary divergences;
- ``processors``: temperature, top-k, top-p (HF order, tie-robust);
- ``verify_step``: ``verify``, the torch twin of ``core.verify.verify_block``;
- ``checks``: its input checks; ``dense``: the reference-style path over [B, k, V].

- ``tree_verify``: ``verify_tree``, the torch twin of ``core.trees.verify.verify_tree``
  (the walk of a batch of drafted trees with any tree rule); ``tree_structure``: depths,
  ancestors and children of a batch of trees.

Beyond the mirror, ``divergence_meter`` (and ``tree_meter`` for trees): the exact KL and
TV of every emitted token, which both engines (``decode`` and ``vllm``) read.

``from cactus_theory import sampler; sampler.verify(target_probs, draft_probs, draft_ids,
rule)`` returns ``(token_ids [B, k+1] padded with PAD_ID = -1, num_accepted [B])``.
"""

from cactus_theory.core.verify import PAD_ID
from cactus_theory.sampler.checks import SUM_TOLERANCE, check_probs, compute_dtype
from cactus_theory.sampler.dense import adjusted_targets_dense, verify_dense
from cactus_theory.sampler.emit import inverse_cdf
from cactus_theory.sampler.rules import for_rule
from cactus_theory.sampler.tree_verify import TreeWalk, verify_tree
from cactus_theory.sampler.verify_step import verify

__all__ = [
    "PAD_ID",
    "SUM_TOLERANCE",
    "TreeWalk",
    "adjusted_targets_dense",
    "check_probs",
    "compute_dtype",
    "for_rule",
    "inverse_cdf",
    "verify",
    "verify_dense",
    "verify_tree",
]
