"""Fixtures shared by the train-draft tests: a character-level ChatML tokenizer and a tiny
random Llama verifier over its 99 tokens (float64)."""

import pytest
import torch
import torch_tiny_models as tiny


@pytest.fixture(scope="module")
def tokenizer():
    return tiny.chatml_tokenizer()


@pytest.fixture(scope="module")
def verifier():
    return tiny.llama(seed=0, vocab=99, dtype=torch.float64, init=0.2)
