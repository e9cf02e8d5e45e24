"""Sampling processors: equal to Hugging Face's warpers without ties, tie-robust with them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from cactus_theory.core import processors
from cactus_theory.core.processors import SamplingSettings


def hugging_face_probs(logits: np.ndarray, settings: SamplingSettings) -> np.ndarray:
    scores = torch.tensor(logits, dtype=torch.float64)
    ids = torch.zeros((scores.shape[0], 1), dtype=torch.long)
    scores = TemperatureLogitsWarper(settings.temperature)(ids, scores)
    if settings.top_k:
        scores = TopKLogitsWarper(settings.top_k)(ids, scores)
    if settings.top_p < 1.0:
        scores = TopPLogitsWarper(settings.top_p)(ids, scores)
    return torch.softmax(scores, dim=-1).numpy()


@given(
    st.integers(0, 2**31),
    st.integers(2, 60),
    st.sampled_from([0.3, 0.6, 1.0, 1.7]),
    st.sampled_from([None, 1, 3, 20]),
    st.sampled_from([1.0, 0.95, 0.5, 0.1]),
)
def test_matches_hugging_face_warpers_without_ties(seed, vocab, temperature, top_k, top_p):
    logits = np.random.default_rng(seed).normal(0, 3, size=(4, vocab))
    settings = SamplingSettings(temperature, top_k, top_p)
    ours = processors.process_logits(logits, settings)
    theirs = hugging_face_probs(logits, settings)
    assert np.array_equal(ours > 0, theirs > 0)
    assert np.allclose(ours, theirs, atol=1e-12)


def test_ties_at_the_boundary_are_all_kept():
    probs = np.array([0.4, 0.2, 0.2, 0.1, 0.1])
    assert processors.top_k_mask(probs, 2).tolist() == [True, True, True, False, False]
    assert processors.top_p_mask(probs, 0.5).tolist() == [True, True, True, False, False]
    assert processors.top_p_mask(probs, 0.4).tolist() == [True, False, False, False, False]
    assert processors.top_p_mask(probs, 0.41).tolist() == [True, True, True, False, False]
    out = processors.process_probs(probs, SamplingSettings(1.0, 2, 1.0))
    assert out.tolist() == pytest.approx([0.5, 0.25, 0.25, 0.0, 0.0])


def test_temperature_on_probabilities_equals_temperature_on_logits():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 10))
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    for settings in (processors.PAPER_SETTING, SamplingSettings(1.3, 5, 0.8)):
        assert np.allclose(
            processors.process_probs(probs, settings),
            processors.process_logits(logits, settings),
            atol=1e-14,
        )


def test_greedy_and_zeros():
    logits = np.array([[0.0, 2.0, 2.0, -np.inf]])
    assert processors.process_logits(logits, SamplingSettings(0.0)).tolist() == [[0, 1, 0, 0]]
    probs = processors.process_probs([0.0, 0.5, 0.5], SamplingSettings(0.5))
    assert probs[0] == 0.0 and probs.sum() == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -1.0}, "temperature: must be >= 0"),
        ({"top_k": -2}, "top_k: must be >= 1"),
        ({"top_p": 0.0}, "top_p: must be > 0"),
        ({"top_p": 1.5}, r"top_p: must lie in \(0, 1\]"),
    ],
)
def test_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingSettings(**kwargs)


def test_bad_logits():
    with pytest.raises(ValueError, match="logits: contains NaN"):
        processors.process_logits([0.0, np.nan])
    with pytest.raises(ValueError, match="logits: a row is entirely -inf"):
        processors.process_logits([-np.inf, -np.inf])
