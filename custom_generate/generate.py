"""Speculative decoding with a constrained-acceptance rule (cactus-theory) as a
``custom_generate`` recipe for transformers' ``generate()``:

    model.generate(**inputs, custom_generate="PATH", trust_remote_code=True,
                   draft_model=draft, rule="cactus:delta=1.0", k=4)

where PATH is the folder holding this ``custom_generate/`` folder (README.md beside this
file). transformers calls ``generate(model=model, **every generate() argument)``; the
function is ``cactus_theory.decode.hf.generate``, which needs the cactus-theory package
installed (``pip install "cactus-theory[torch]"``).
"""

from cactus_theory.decode.hf import generate

__all__ = ["generate"]
