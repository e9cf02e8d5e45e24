"""Fixtures of the command-line tests: a private CACTUS_CACHE and the tiny saved pair
(``tiny_pair``)."""

import pytest
from tiny_pair import make_tokenizer, save_model


@pytest.fixture
def private_cache(tmp_path_factory, monkeypatch):
    """A temporary CACTUS_CACHE: ``--dtype auto`` caches its choice there, never in the
    user's cache."""
    folder = tmp_path_factory.mktemp("cactus-cache")
    monkeypatch.setenv("CACTUS_CACHE", str(folder))
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    tokenizer = make_tokenizer(300)
    vocab = len(tokenizer)
    other = make_tokenizer(300, ["zebra quokka yak\n", "lorem ipsum dolor\n"])
    prompts = root / "prompts.txt"
    prompts.write_text("def main(\nimport os\\nprint(\n\nclass A:\n")
    return {
        "verifier": save_model(root / "verifier", tokenizer, vocab, 0, 2),
        "draft": save_model(root / "draft", tokenizer, vocab, 1, 1),
        "other_tokenizer": save_model(root / "other", other, len(other), 2, 1),
        "other_vocab": save_model(root / "wide", tokenizer, vocab + 8, 3, 1),
        "prompts": str(prompts),
        "root": root,
    }
