"""The sampler's emitted token follows the exact numpy law (chi-square, N = 200,000).

For one (target, draft) pair the first emitted token (the accepted draft, or the residual
draw) has law ``law.output_law(rule, target, draft)``. We sample N blocks with k = 1 through
``sampler.verify`` (drafts drawn from the draft row) and run Pearson's chi-square test at
significance ALPHA = 1e-3 with fixed seeds. Two negative controls must be caught: the same
samples against the verifier's q (what a lossless rule would emit), and a broken sampler
that uses the SpS residual (q − p)_+ instead of the rule's residual.
"""

import numpy as np
import pytest
import torch
from scipy import stats

from cactus_theory import law, rules, sampler
from cactus_theory.sampler import emit, verify_step
from cactus_theory.sampler import rules as torch_rules

ALPHA = 1e-3
SAMPLES = 200_000
TARGET = np.array([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
DRAFT = np.array([0.05, 0.10, 0.15, 0.05, 0.45, 0.20])
BONUS = np.array([0.05, 0.05, 0.10, 0.20, 0.25, 0.35])


def emitted_tokens(rule, seed, samples=SAMPLES):
    """First and second tokens of N verify blocks with k = 1 (drafts drawn from DRAFT)."""
    generator = torch.Generator().manual_seed(seed)
    target = torch.tensor(np.stack([TARGET, BONUS]))[None].expand(samples, 2, -1)
    draft = torch.tensor(DRAFT)[None, None].expand(samples, 1, -1)
    drafted = torch.multinomial(torch.tensor(DRAFT), samples, replacement=True, generator=generator)
    tokens, accepted = sampler.verify(target, draft, drafted[:, None], rule, generator=generator)
    return tokens.numpy(), accepted.numpy()


def chi_square_p_value(tokens, probabilities):
    """Pearson chi-square p-value, pooling cells with expected count < 5 into one."""
    counts = np.bincount(tokens, minlength=len(probabilities)).astype(float)
    expected = probabilities * len(tokens)
    if np.any(counts[expected == 0] > 0):
        return 0.0
    small = expected < 5
    observed = np.append(counts[~small & (expected > 0)], counts[small].sum())
    wanted = np.append(expected[~small & (expected > 0)], expected[small].sum())
    keep = wanted > 0
    return stats.chisquare(
        observed[keep], wanted[keep] * observed.sum() / wanted[keep].sum()
    ).pvalue


LAW_SPECS = [
    "cactus:delta=0.1",
    "cactus-exact:delta=0.1",
    "frontier:delta=0.3",
    "pareto:spread=1.0",
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("spec", LAW_SPECS)
def test_emitted_law_matches_the_exact_law(spec):
    rule = rules.parse(spec)
    exact = law.output_law(rule, TARGET, DRAFT)
    assert 0.5 < law.acceptance(rule, TARGET, DRAFT) < 0.8  # both branches are exercised
    tokens, accepted = emitted_tokens(rule, seed=11)
    assert chi_square_p_value(tokens[:, 0], exact) > ALPHA
    # After an acceptance the bonus token is drawn from the verifier's next row, unchanged.
    assert chi_square_p_value(tokens[accepted == 1, 1], BONUS) > ALPHA
    # The acceptance rate matches the exact acceptance (normal approximation, 4 sigma).
    rate = law.acceptance(rule, TARGET, DRAFT)
    assert abs(accepted.mean() - rate) < 4 * np.sqrt(rate * (1 - rate) / SAMPLES)
    # Negative control 1: these rules do not emit q, and the test must see it.
    assert chi_square_p_value(tokens[:, 0], TARGET) < ALPHA


@pytest.mark.parametrize(
    "spec", ["sps", "cactus:delta=0.5", "cactus-exact:delta=0.5", "frontier:delta=0.3"]
)
def test_two_level_emission_matches_the_exact_law(spec, monkeypatch):
    """The row-by-row emission with the two-level inverse CDF (forced: blocks of 4 tokens
    over V = 6, one full block and a short one) emits the same law."""
    monkeypatch.setattr(emit, "BLOCK", 4)
    monkeypatch.setattr(emit, "TWO_LEVEL_MIN_VOCAB", 0)
    rule = rules.parse(spec)
    samples = 40_000
    tokens, accepted = emitted_tokens(rule, seed=14, samples=samples)
    assert chi_square_p_value(tokens[:, 0], law.output_law(rule, TARGET, DRAFT)) > ALPHA
    assert chi_square_p_value(tokens[accepted == 1, 1], BONUS) > ALPHA
    assert chi_square_p_value(tokens[:, 0], TARGET) < ALPHA or spec == "sps"


class _SpSResidual(torch_rules.TorchRule):
    """A broken rule: the rule's acceptance, but SpS's residual (q − p)_+."""

    def __init__(self, inner):
        super().__init__(inner.rule)
        self.inner = inner
        self.reads_rows = inner.reads_rows

    def accept(self, *args):
        return self.inner.accept(*args)

    def residual(self, target_row, draft_row, draft_id, state):
        return torch_rules.gsps_residual(target_row, draft_row)


@pytest.mark.parametrize("spec", LAW_SPECS)
def test_negative_control_broken_residual_is_caught(spec, monkeypatch):
    rule = rules.parse(spec)
    original = torch_rules.for_rule
    monkeypatch.setattr(verify_step, "for_rule", lambda value: _SpSResidual(original(value)))
    tokens, _ = emitted_tokens(rule, seed=12)
    assert chi_square_p_value(tokens[:, 0], law.output_law(rule, TARGET, DRAFT)) < ALPHA


def test_sps_is_lossless():
    tokens, _ = emitted_tokens(rules.parse("sps"), seed=13, samples=100_000)
    assert chi_square_p_value(tokens[:, 0], TARGET) > ALPHA
