"""Monte Carlo decoding agrees with the exact laws and block formulas.

Statistical checks use fixed seeds and a two-sided level of 0.1% (|z| <= 3.29, G-test
p >= 0.001); each has a negative control that the same check must reject.
"""

import json

import numpy as np
import pytest
from scipy import stats

from cactus_theory import law, rules
from cactus_theory.core import block
from sims import montecarlo, realtext, synthetic, tradeoff

Z_LIMIT = 3.29  # two-sided 0.1%


@pytest.fixture(scope="module")
def pool():
    return synthetic.dirichlet_pool(0.5, vocab_size=20, num_pairs=300, seed=1)


@pytest.fixture(scope="module")
def models():
    return realtext.TextModels.from_corpus()


def _z(result: montecarlo.DecodeResult, predicted: float) -> float:
    return (result.al - predicted) / result.al_se


@pytest.mark.parametrize(
    "spec", ["sps", "cactus:delta=0.5", "cactus-exact:delta=0.5", "frontier:delta=0.2", "tas"]
)
def test_iid_accepted_length_matches_the_block_formula(pool, spec):
    rule = rules.parse(spec)
    k = 4
    result = montecarlo.simulate_pool(rule, pool, montecarlo.DecodeSettings(k, 300, 60), seed=11)
    alpha = float(law.acceptance_rows(rule, pool.target_probs, pool.draft_probs).mean())
    predicted = block.expected_accepted(alpha, k)
    assert result.al_predicted == pytest.approx(predicted, rel=1e-12)
    assert abs(_z(result, predicted)) <= Z_LIMIT
    assert result.tokens_per_call == pytest.approx(result.al + 1.0)
    # Every position is accepted with probability alpha (binomial z per position).
    for reached, accepted in zip(result.position_reached, result.position_accepted, strict=True):
        z = (accepted - reached * alpha) / np.sqrt(reached * alpha * (1 - alpha))
        assert abs(z) <= Z_LIMIT
    # Negative control: the prediction of a nearby but different setting is rejected.
    if spec != "tas":
        wrong = block.expected_accepted(alpha - 0.04 if alpha > 0.5 else alpha + 0.04, k)
        assert abs(_z(result, wrong)) > Z_LIMIT


def test_iid_divergences_are_the_pool_means(pool):
    rule = rules.make("frontier", delta=0.2)
    result = montecarlo.simulate_pool(rule, pool, montecarlo.DecodeSettings(3, 100, 30), seed=2)
    stats_ = tradeoff.row_stats(rule, pool)
    # Contexts are drawn uniformly, so the visited mean estimates the pool mean.
    spread = stats_.emitted_kl.std() / np.sqrt(result.steps)
    assert abs(result.kl_per_context - stats_.emitted_kl.mean()) <= 5 * spread + 1e-12
    assert result.kl_per_token <= result.kl_per_context  # bonus tokens add 0
    assert result.sequence_kl[-1] == pytest.approx(30 * result.kl_per_token, rel=1e-9)


def test_same_seed_same_result_and_other_seed_differs(pool):
    rule = rules.make("cactus", delta=0.5)
    settings = montecarlo.DecodeSettings(3, 20, 20)

    def run(seed):  # JSON text, so that NaN compares equal to NaN
        return json.dumps(montecarlo.simulate_pool(rule, pool, settings, seed=seed).as_dict())

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_text_acceptance_matches_the_exact_acceptance_of_visited_contexts(models):
    """Σ 1[accepted] − Σ a(context) over visited contexts is a martingale: z-test."""
    rule = rules.make("cactus", delta=1.0)
    result = montecarlo.simulate_text(rule, models, montecarlo.DecodeSettings(4, 96, 12), seed=3)
    reached = sum(result.position_reached)
    accepted = sum(result.position_accepted)
    expected = reached * result.acceptance_exact
    z = (accepted - expected) / np.sqrt(result.acceptance_exact_var)
    assert abs(z) <= Z_LIMIT
    biased = reached * (result.acceptance_exact + 0.06)  # negative control
    assert abs((accepted - biased) / np.sqrt(result.acceptance_exact_var)) > Z_LIMIT
    assert result.kl_per_context > 0 and np.isfinite(result.nll_per_token)


def _g_test(counts: np.ndarray, probs: np.ndarray) -> float:
    """G-test p-value, pooling bins with expected count < 5 (0 if an impossible bin is hit)."""
    if np.any((probs <= 0) & (counts > 0)):
        return 0.0
    expected = probs * counts.sum()
    small = expected < 5
    observed = np.append(counts[~small], counts[small].sum())
    wanted = np.append(expected[~small], expected[small].sum())
    keep = wanted > 0
    return stats.power_divergence(observed[keep], wanted[keep], lambda_="log-likelihood").pvalue


def _distinctive_prompt(models, rule):
    """A held-out context where the rule's first-token law is far from q (for power)."""
    histories = models.prompts(200, np.random.default_rng(9))
    aligned = models.pairs(histories)
    emitted = law.output_law_rows(rule, aligned.target_probs, aligned.draft_probs)
    gap = 0.5 * np.abs(emitted - aligned.target_probs).sum(axis=1)
    row = int(np.argmax(gap))
    return histories[row], aligned, row, emitted[row]


@pytest.mark.parametrize("spec", ["cactus:delta=1.0", "tas"])
def test_text_first_token_follows_the_exact_emitted_law(models, spec):
    rule = rules.parse(spec)
    prompt, aligned, row, emitted = _distinctive_prompt(models, rule)
    count = 3000
    prompts = np.repeat(prompt[None, :], count, axis=0)
    result, sequences = montecarlo.run_text(
        rule, models, montecarlo.DecodeSettings(3, count, 1), seed=4, prompts=prompts
    )
    np.testing.assert_array_equal(sequences[:, : prompt.size], prompts)
    first = sequences[:, prompt.size]
    assert np.all((first >= 0) & (first < models.vocab_size))
    ids = aligned.ids[row]
    column = {int(token): j for j, token in enumerate(ids) if token < models.vocab_size}
    assert all(int(token) in column for token in first)  # never outside q ∪ p
    counts = np.bincount([column[int(t)] for t in first], minlength=ids.size).astype(float)
    assert _g_test(counts, emitted) >= 1e-3
    # Negative control: the verifier's own q is not what these rules emit here.
    assert _g_test(counts, aligned.target_probs[row]) < 1e-3


def test_text_sps_first_token_follows_q(models):
    rule = rules.make("sps")
    prompt, aligned, row, _ = _distinctive_prompt(models, rules.make("cactus", delta=1.0))
    prompts = np.repeat(prompt[None, :], 3000, axis=0)
    _, sequences = montecarlo.run_text(
        rule, models, montecarlo.DecodeSettings(2, 3000, 1), seed=8, prompts=prompts
    )
    ids = aligned.ids[row]
    column = {int(token): j for j, token in enumerate(ids) if token < models.vocab_size}
    counts = np.bincount([column[int(t)] for t in sequences[:, prompt.size]], minlength=ids.size)
    assert _g_test(counts.astype(float), aligned.target_probs[row]) >= 1e-3
    assert _g_test(counts.astype(float), aligned.draft_probs[row]) < 1e-3  # negative control


def test_text_decoding_is_seeded(models):
    rule = rules.make("frontier", delta=0.5)
    settings = montecarlo.DecodeSettings(3, 8, 6)
    first = montecarlo.run_text(rule, models, settings, seed=1)
    again = montecarlo.run_text(rule, models, settings, seed=1)
    assert json.dumps(first[0].as_dict()) == json.dumps(again[0].as_dict())
    np.testing.assert_array_equal(first[1], again[1])
    assert not np.array_equal(first[1], montecarlo.run_text(rule, models, settings, seed=2)[1])


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: montecarlo.DecodeSettings(0, 4, 4), "k"),
        (lambda: montecarlo.DecodeSettings(2, 0, 4), "num_sequences"),
        (lambda: montecarlo.DecodeSettings(2, 4, 0), "length"),
        (lambda: montecarlo.DecodeSettings(2.5, 4, 4), "k"),
    ],
)
def test_bad_decode_settings_are_named(make, argument):
    with pytest.raises(ValueError, match=f"^{argument}"):
        make()


def test_bad_rule_and_prompts_are_named(pool, models):
    settings = montecarlo.DecodeSettings(2, 4, 4)
    with pytest.raises(ValueError, match="^rule"):
        montecarlo.simulate_pool("cactus", pool, settings)
    with pytest.raises(ValueError, match="^prompts"):
        montecarlo.simulate_text(
            rules.make("sps"), models, settings, prompts=np.zeros((4, 1), dtype=np.int64)
        )
