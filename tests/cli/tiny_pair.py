"""A tiny saved pair for the command-line tests: Llama checkpoints with a tiny byte-level
BPE tokenizer, saved with ``save_pretrained`` into a folder and loaded back by path, as
users do (the fixtures are in ``conftest.py``)."""

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TEXT = [
    "def main(argv):\n    return 0\n",
    "import os\nprint(os.getcwd())\n",
    "class A:\n    pass\n",
]


def make_tokenizer(vocab_size, text=TEXT):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(text * 20, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )


def save_model(folder, tokenizer, vocab, seed, layers):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=64,
        max_position_embeddings=256,
        eos_token_id=0,
        pad_token_id=0,
        bos_token_id=0,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def decode_args(checkpoints, *extra):
    return [
        "decode",
        "--verifier",
        checkpoints["verifier"],
        "--draft",
        checkpoints["draft"],
        "--prompts",
        checkpoints["prompts"],
        "--max-new-tokens",
        "6",
        "--batch-size",
        "2",
        *extra,
    ]


RAISING_RULE = """
from cactus_theory import rules


class HalfWritten(rules.Rule):
    name = "test-half-written"

    def accept_probs(self, target_probs, draft_probs):
        raise ZeroDivisionError("half-written acceptance")

    def residuals_for(self, target_probs, draft_probs, tokens):
        return target_probs


rules.register(HalfWritten)
"""


def raising_rule_module(folder):
    """A rules module whose rule ``test-half-written`` raises in ``accept_probs``."""
    path = folder / "half_written_rules.py"
    path.write_text(RAISING_RULE)
    return str(path)


def assert_one_line_naming_the_rule(error: str, command: str) -> None:
    """The CLI's word on a rule that raised: one line naming the rule and the method."""
    assert "Traceback" not in error, error
    assert error.strip().splitlines()[-1] == (
        f"cactus {command}: error: rule 'test-half-written' raised ZeroDivisionError in "
        "accept_probs: half-written acceptance"
    )
