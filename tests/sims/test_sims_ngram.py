"""Interpolated Kneser–Ney: exact values against a plain dictionary implementation."""

from collections import Counter, defaultdict

import numpy as np
import pytest

from sims import ngram

VOCAB = 7


def _reference_kn(stream: list[int], order: int, vocab: int):
    """Interpolated KN written the slow, obvious way (dicts, loops), for comparison."""
    grams = {
        m: Counter(tuple(stream[i : i + m]) for i in range(len(stream) - m + 1))
        for m in range(1, order + 1)
    }
    counts = {order: dict(grams[order])}
    for m in range(1, order):
        left = defaultdict(set)
        for gram in grams[m + 1]:
            left[gram[1:]].add(gram[0])
        counts[m] = {gram: float(len(firsts)) for gram, firsts in left.items()}

    def discount(values):
        n1 = sum(1 for v in values if v == 1)
        n2 = sum(1 for v in values if v == 2)
        return 0.5 if n1 == 0 or n2 == 0 else min(0.9, max(0.1, n1 / (n1 + 2 * n2)))

    discounts = {m: discount(list(counts[m].values())) for m in counts}

    def prob(history: tuple, token: int, m: int) -> float:
        if m == 1:
            table = counts[1]
            total = sum(table.values())
            d = discounts[1]
            return max(table.get((token,), 0) - d, 0) / total + d * len(table) / total / vocab
        context = history[len(history) - (m - 1) :]
        table = counts[m]
        followers = {gram[-1]: c for gram, c in table.items() if gram[:-1] == context}
        lower = prob(history, token, m - 1)
        if not followers:
            return lower
        total = sum(followers.values())
        d = discounts[m]
        return max(followers.get(token, 0) - d, 0) / total + d * len(followers) / total * lower

    return prob


@pytest.fixture(scope="module")
def stream():
    rng = np.random.default_rng(3)
    # A structured stream: a noisy cycle, so that higher orders matter.
    base = np.arange(400) % VOCAB
    noise = rng.integers(0, VOCAB, 400)
    return np.where(rng.random(400) < 0.3, noise, base).astype(np.int64)


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_matches_the_dictionary_reference(stream, order):
    model = ngram.NGramModel.fit(stream, order, VOCAB)
    reference = _reference_kn(stream.tolist(), order, VOCAB)
    histories = np.array(
        [[a, b, c][3 - (order - 1) :] for a in range(VOCAB) for b in (0, 3) for c in (1, 5)],
        dtype=np.int64,
    )
    histories = histories.reshape(len(histories), order - 1)
    probs = model.probs(histories)
    expected = np.array([[reference(tuple(h), w, order) for w in range(VOCAB)] for h in histories])
    np.testing.assert_allclose(probs, expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(probs > 0)


def test_token_probs_equal_the_dense_rows(stream):
    model = ngram.NGramModel.fit(stream, 4, VOCAB)
    rng = np.random.default_rng(0)
    histories = rng.integers(0, VOCAB, (50, 3))
    tokens = rng.integers(0, VOCAB, 50)
    dense = model.probs(histories)[np.arange(50), tokens]
    np.testing.assert_allclose(model.token_probs(histories, tokens), dense, rtol=1e-13)


def test_cache_round_trip(stream, tmp_path, monkeypatch):
    monkeypatch.setenv("CACTUS_CACHE", str(tmp_path))
    first = ngram.cached_model(stream, 3, VOCAB)
    assert len(list(tmp_path.glob("ngram-3-*.npz"))) == 1
    again = ngram.cached_model(stream, 3, VOCAB)
    histories = np.array([[1, 2], [6, 6], [0, 4]])
    np.testing.assert_array_equal(first.probs(histories), again.probs(histories))


@pytest.mark.parametrize(
    ("tokens", "order", "vocab", "argument"),
    [
        (np.array([], dtype=np.int64), 2, VOCAB, "tokens"),
        (np.array([0, 1, 9]), 2, VOCAB, "tokens"),
        (np.array([0.5, 1.0]), 2, VOCAB, "tokens"),
        (np.array([0, 1, 2]), 0, VOCAB, "order"),
        (np.array([0, 1, 2]), 2, 1, "vocab_size"),
        (np.array([0, 1]), 3, VOCAB, "tokens"),
    ],
)
def test_bad_input_is_named(tokens, order, vocab, argument):
    with pytest.raises(ValueError, match=f"^{argument}"):
        ngram.NGramModel.fit(tokens, order, vocab)


def test_bad_histories_are_named(stream):
    model = ngram.NGramModel.fit(stream, 3, VOCAB)
    with pytest.raises(ValueError, match="^histories"):
        model.probs(np.array([[1, 2, 3]]))
    with pytest.raises(ValueError, match="^histories"):
        model.probs(np.array([[1, VOCAB]]))
    with pytest.raises(ValueError, match="^tokens"):
        model.token_probs(np.array([[1, 2]]), np.array([VOCAB]))
