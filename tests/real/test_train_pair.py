"""``cactus train-pair`` on a tiny corpus: loadable checkpoints, determinism, resume, cache."""

import dataclasses
import shutil
import sysconfig
import zlib
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cactus_theory.cli import dispatch as cli
from cactus_theory.real import train_pair
from cactus_theory.real.train_pair import ModelSpec, PairSettings

SOURCES = ("textwrap.py", "colorsys.py", "bisect.py", "keyword.py", "fnmatch.py", "glob.py")


def tiny_corpus(folder: Path) -> Path:
    """Standard-library files under names chosen so that some land in the held-out split."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(stdlib / name).read_text(encoding="utf-8") for name in SOURCES]
    held, kept, index = 0, 0, 0
    while held < 2 or kept < 6:
        name = f"module_{index}.py"
        is_held = zlib.crc32(name.encode()) % 1000 < 100
        if (is_held and held < 2) or (not is_held and kept < 6):
            (folder / name).write_text(texts[(held + kept) % len(texts)])
            held, kept = held + is_held, kept + (not is_held)
        index += 1
    return folder


@pytest.fixture
def settings(tmp_path, monkeypatch):
    monkeypatch.setenv("CACTUS_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "corpus"
    folder.mkdir()
    corpus = tiny_corpus(folder)
    return PairSettings(
        vocab_size=300,
        context=32,
        batch_size=4,
        verifier=ModelSpec(32, 1, 2, 64),
        draft=ModelSpec(16, 1, 2, 32),
        verifier_steps=6,
        draft_steps=4,
        eval_windows=4,
        num_prompts=2,
        prompt_chars=80,
        checkpoint_every=2,
        corpus_root=str(corpus),
    )


def weights(path):
    model = AutoModelForCausalLM.from_pretrained(path)
    return {name: value.clone() for name, value in model.state_dict().items()}


def test_pair_loads_like_any_checkpoint(settings, monkeypatch):
    verifier_path, draft_path = train_pair.ensure_pair(settings, progress=False)
    manifest = train_pair.train(settings, progress=False)
    assert manifest["verifier"] == verifier_path and manifest["draft"] == draft_path
    for path, spec in ((verifier_path, settings.verifier), (draft_path, settings.draft)):
        model = AutoModelForCausalLM.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        assert model.config.hidden_size == spec.hidden_size
        assert model.config.vocab_size == 300 and len(tokenizer) <= 300
        assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.eos_token_id == 0
        assert tokenizer.pad_token_id == 0
        text = "def f(x):\n    return x\n"
        assert tokenizer.decode(tokenizer(text).input_ids) == text
    perplexity = manifest["heldout_perplexity"]
    assert all(1.0 < value < 1e4 for value in perplexity.values())
    prompts = Path(manifest["prompts"]).read_text().splitlines()
    assert len(prompts) == 2
    # Second call: cached, no training at all.
    monkeypatch.setattr(train_pair, "train_model", lambda *a, **k: pytest.fail("retrained"))
    assert train_pair.ensure_pair(settings, progress=False) == (verifier_path, draft_path)


def test_training_is_deterministic_and_resumes_exactly(settings, tmp_path, monkeypatch):
    first = train_pair.train(settings, progress=False)
    reference = weights(first["verifier"])
    folder = train_pair.pair_dir(settings)
    shutil.rmtree(folder)

    real_batch = train_pair._batch

    def interrupted(stream, pair_settings, role, step):
        if role == "verifier" and step == 5:
            raise KeyboardInterrupt
        return real_batch(stream, pair_settings, role, step)

    monkeypatch.setattr(train_pair, "_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_pair.train(settings, progress=False)
    checkpoint = torch.load(folder / "verifier.ckpt", weights_only=True)
    assert checkpoint["step"] == 4
    monkeypatch.setattr(train_pair, "_batch", real_batch)
    resumed = train_pair.train(settings, progress=False)
    for name, value in weights(resumed["verifier"]).items():
        assert torch.equal(value, reference[name]), name
    assert not (folder / "verifier.ckpt").exists()


def test_cache_key_changes_with_settings(settings):
    other = dataclasses.replace(settings, seed=1)
    assert train_pair.pair_dir(other) != train_pair.pair_dir(settings)


def test_cli_help_and_errors(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train-pair", "--help"])
    text = capsys.readouterr().out
    for flag in ("--seed", "--verifier-steps", "--draft-steps", "--device", "--force"):
        assert flag in text
    assert cli.main(["train-pair", "--verifier-steps", "0"]) == 2
    assert "verifier_steps: must be >= 1" in capsys.readouterr().err
    assert cli.main(["train-pair", "--device", "tpu"]) == 2
    assert "device: must be 'cpu' or 'cuda'" in capsys.readouterr().err
