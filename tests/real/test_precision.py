"""``--dtype auto`` (``cactus_theory.real.precision``): the choice rule on exact times, the
cache (read back, damaged files measured again), CUDA's rule, and the timed verify forward
leaving the KV cache as it found it. Every test caches under a temporary folder."""

import json

import pytest
import torch
import torch_tiny_models as tiny

from cactus_theory.real import precision

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def verifier_folder(tmp_path_factory):
    """A tiny Llama and its tokenizer saved as a folder, loaded by path as users do."""
    folder = tmp_path_factory.mktemp("verifier")
    tiny.llama(seed=0, vocab=99, dtype=torch.float32).save_pretrained(folder)
    tiny.chatml_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize(
    ("float32", "bfloat16", "dtype", "reason"),
    [
        (1.0, 0.5, "bfloat16", "2.00x faster than float32 here"),
        (1.0, 0.99, "float32", "bfloat16 is not faster here (0.99x the time)"),  # a tie
        (1.0, 1.5, "float32", "bfloat16 is not faster here (1.50x the time)"),
    ],
)
def test_the_faster_dtype_wins_and_float32_wins_a_tie(float32, bfloat16, dtype, reason, tmp_path):
    seconds = {"float32": float32, "bfloat16": bfloat16}
    choice = precision._decide(seconds, 4, tmp_path / "c.json", 9)
    assert (choice.dtype, choice.reason) == (dtype, reason)
    assert choice.seconds == seconds and not choice.cached
    line = choice.describe()
    assert f"float32 {1e3 * float32:.2f} ms, bfloat16 {1e3 * bfloat16:.2f} ms" in line
    assert "4 tokens at batch 1" in line and "measured now" in line


def test_a_choice_is_measured_once_then_read_from_the_cache(verifier_folder, tmp_path, monkeypatch):
    first = precision.choose_dtype(verifier_folder, "cpu", 1, 4, cache_dir=tmp_path, repeats=3)
    assert first.dtype in precision.CANDIDATES and not first.cached
    assert set(first.seconds) == {"float32", "bfloat16"} and min(first.seconds.values()) > 0
    path = precision.cache_path(verifier_folder, "cpu", 1, 4, tmp_path)
    assert first.path == str(path) and json.loads(path.read_text())["dtype"] == first.dtype

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again although the choice is cached")

    monkeypatch.setattr(precision, "measure", no_measuring)
    second = precision.choose_dtype(verifier_folder, "cpu", 1, 4, cache_dir=tmp_path)
    assert second.cached and (second.dtype, second.seconds) == (first.dtype, first.seconds)
    assert second.repeats == 3 and "cached in" in second.describe()
    # Another thread count or verify width is another key: measured, not read.
    with pytest.raises(AssertionError, match="measured again"):
        precision.choose_dtype(verifier_folder, "cpu", 2, 4, cache_dir=tmp_path)
    with pytest.raises(AssertionError, match="measured again"):
        precision.choose_dtype(verifier_folder, "cpu", 1, 6, cache_dir=tmp_path)
    # Another batch size (a pool's generation step) is another key too.
    with pytest.raises(AssertionError, match="measured again"):
        precision.choose_dtype(verifier_folder, "cpu", 1, 4, cache_dir=tmp_path, batch_size=8)
    # So is another CPU: a machine without bfloat16 units never reads this one's choice.
    other = {**precision.cpu_identity(), "capability": "AVX2", "bf16_units": False}
    monkeypatch.setattr(precision, "cpu_identity", lambda: other)
    with pytest.raises(AssertionError, match="measured again"):
        precision.choose_dtype(verifier_folder, "cpu", 1, 4, cache_dir=tmp_path)


def test_a_batched_shape_is_measured_and_described(verifier_folder, tmp_path):
    choice = precision.choose_dtype(
        verifier_folder, "cpu", 1, 1, cache_dir=tmp_path, repeats=2, batch_size=3
    )
    assert choice.batch_size == 3 and "1 token at batch 3" in choice.describe()
    again = precision.choose_dtype(verifier_folder, "cpu", 1, 1, cache_dir=tmp_path, batch_size=3)
    assert again.cached and again.batch_size == 3 and again.dtype == choice.dtype
    with pytest.raises(ValueError, match="^batch_size: must be >= 1, got 0"):
        precision.choose_dtype(verifier_folder, "cpu", 1, 1, cache_dir=tmp_path, batch_size=0)


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps(
            {
                "dtype": "int8",
                "reason": "x",
                "verify_tokens": 4,
                "repeats": 3,
                "seconds": {"float32": 1.0, "bfloat16": 0.5},
            }
        ),  # fmt: skip
        json.dumps({"dtype": "float32", "seconds": {"float32": 1.0}}),
        json.dumps(["a", "list"]),
    ],
)
def test_a_damaged_cache_file_is_measured_again(verifier_folder, tmp_path, monkeypatch, content):
    path = precision.cache_path(verifier_folder, "cpu", 1, 4, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    monkeypatch.setattr(precision, "measure", lambda *a, **k: {"float32": 2.0, "bfloat16": 1.0})
    choice = precision.choose_dtype(verifier_folder, "cpu", 1, 4, cache_dir=tmp_path)
    assert (choice.dtype, choice.cached) == ("bfloat16", False)
    assert json.loads(path.read_text())["seconds"] == {"float32": 2.0, "bfloat16": 1.0}


def test_cuda_takes_bfloat16_where_supported_without_measuring(tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "measure", lambda *a, **k: pytest.fail("measured on CUDA"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    choice = precision.choose_dtype("any-model", "cuda", 1, 4, cache_dir=tmp_path)
    assert (choice.dtype, choice.seconds) == ("bfloat16", {})
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert precision.choose_dtype("any-model", "cuda", 1, 4, cache_dir=tmp_path).dtype == "float32"
    assert not (tmp_path / "dtype-choice").exists()


def test_bad_arguments_are_value_errors(verifier_folder, tmp_path):
    with pytest.raises(ValueError, match="^verify_tokens: must be >= 1, got 0"):
        precision.choose_dtype(verifier_folder, "cpu", 1, 0, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="^repeats: must be >= 1, got 0"):
        precision.measure(verifier_folder, torch.device("cpu"), 4, repeats=0)
    with pytest.raises(ValueError, match="^verifier: path"):
        precision.choose_dtype(str(tmp_path / "missing"), "cpu", 1, 4, cache_dir=tmp_path)


def test_the_timed_verify_forward_leaves_the_cache_as_it_was():
    """After each timed forward of k + 1 tokens the cache holds the prompt again, so every
    repeat verifies at the same position; its logits match a forward without a cache."""
    model = tiny.llama(seed=3, vocab=61, dtype=torch.float64)
    prompt = torch.randint(0, 61, (1, precision.PROMPT_TOKENS), generator=torch.Generator())
    cached = precision._prefilled(model, prompt)
    block = torch.tensor([[5, 7, 11, 13]])  # [1, 4]
    for _ in range(3):
        assert precision._verify_once(cached, block, torch.device("cpu")) > 0
        assert cached.slots == precision.PROMPT_TOKENS
    positions = precision.PROMPT_TOKENS + torch.arange(4)[None]
    with torch.inference_mode():
        logits = cached.forward(block, torch.ones_like(block), positions)  # [1, 4, V]
        full = model(torch.cat([prompt, block], dim=1)).logits[:, -4:]  # [1, 4, V]
    torch.testing.assert_close(logits, full)
