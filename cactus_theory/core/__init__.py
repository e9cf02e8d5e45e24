"""The numpy core: every rule as exact float64 mathematics. It never imports torch.

- ``rules``: every acceptance rule (``rules.make``, ``rules.parse``), one file per rule family;
- ``law``: the exact law of the emitted token, acceptance, per-branch and emitted divergences;
- ``gamma``: γ*(q_n, δ) for every divergence (closed forms and feasible-side roots);
- ``divergences``: KL, reverse KL, TV, χ², squared Hellinger, JS and their binary forms;
- ``roots``: the feasible-side root finders ``gamma`` and ``rules.frontier`` share;
- ``block``: accepted-length law, E[L], tokens per call, speed-up, best k;
- ``processors``: temperature, top-k, top-p (the reference the torch processors mirror);
- ``verify``: one verification step from explicit uniforms (the torch sampler's oracle);
- ``validate``: input checks raising ``ValueError`` that names the argument;
- ``trees``: multi-draft (tree) verification: nodes, tree rules, exact node laws.

The torch export (``cactus_theory.sampler``) mirrors these modules file for file.
"""

from cactus_theory.core import (
    block,
    divergences,
    gamma,
    law,
    processors,
    roots,
    rules,
    trees,
    validate,
    verify,
)

__all__ = [
    "block",
    "divergences",
    "gamma",
    "law",
    "processors",
    "roots",
    "rules",
    "trees",
    "validate",
    "verify",
]
