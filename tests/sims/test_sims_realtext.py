"""The real-text source: valid processed distributions in held-out contexts."""

import numpy as np
import pytest

from cactus_theory.core import processors
from sims import realtext, rows


@pytest.fixture(scope="module")
def models():
    return realtext.TextModels.from_corpus()


def test_heldout_pool_rows_are_the_processed_model_rows(models):
    pool = realtext.heldout_pool(models, num_contexts=120, seed=3)
    assert pool.contexts.shape == (120, models.history_length)
    for probs in (pool.target_probs, pool.draft_probs):
        assert np.all(probs >= 0)
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-12)
    real = pool.ids < models.vocab_size
    assert np.all(pool.ids[real] >= 0)
    assert np.all(pool.target_probs[~real] == 0) and np.all(pool.draft_probs[~real] == 0)
    # Against the full 4096-token rows through the reference processors.
    verifier = processors.process_probs(
        models.verifier.probs(pool.contexts[:, -(models.settings.verifier_order - 1) :]),
        processors.PAPER_SETTING,
    )
    draft_history = models.settings.draft_order - 1
    draft = processors.process_probs(
        models.draft.probs(pool.contexts[:, -draft_history:]), processors.PAPER_SETTING
    )
    np.testing.assert_allclose(
        rows.CompactRows(pool.ids, pool.target_probs, models.vocab_size).dense(),
        verifier,
        atol=1e-14,
    )
    np.testing.assert_allclose(
        rows.CompactRows(pool.ids, pool.draft_probs, models.vocab_size).dense(),
        draft,
        atol=1e-14,
    )
    assert (pool.target_probs > 0).sum(axis=1).max() <= 20  # top-k 20 after processing


def test_plain_setting_keeps_full_support():
    plain = realtext.TextModels.from_corpus(
        realtext.TextSettings(sampling=processors.PLAIN_SETTING)
    )
    pool = realtext.heldout_pool(plain, num_contexts=5, seed=1)
    assert pool.target_probs.shape[1] == plain.vocab_size
    assert np.all(pool.target_probs > 0) and np.all(pool.draft_probs > 0)


def test_tokens_render_as_text(models):
    assert models.token_text(0) == "<|endoftext|>"
    window = models.heldout[100:140]
    assert models.decode(window) == models.tokenizer.decode([int(t) for t in window])
    assert models.decode(window)  # real text, not empty


def test_bad_settings_are_named(models):
    with pytest.raises(ValueError, match="^num_contexts"):
        realtext.heldout_pool(models, num_contexts=0)
    with pytest.raises(ValueError, match="^histories"):
        models.verifier_rows(np.zeros((2, 1), dtype=np.int64))
    with pytest.raises(ValueError, match="^sampling"):
        realtext.TextSettings(sampling="paper")
