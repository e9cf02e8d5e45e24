"""No silent wrong number for a rule the fast paths were not written for: every shortcut
reads what the rule declares, and an undeclared property means the exact general path.

Each case below was a wrong number with no error before rules declared their properties:
a branch rule whose γ reads the whole row (law 0.44 away from the enumerated law), a rule
that reads the vocabulary size (metered up to 0.128 nats off after packing), the trade-off
statistics' branch KL on flattened masses (4.27 nats off), a direct ``Rule`` subclass (no
law at all). Negative controls show that each fast path *would* be wrong for that rule.
"""

import numpy as np
import pytest
import torch
from rule_examples import EntropyGamma

from cactus_theory import divergences, law, rules
from cactus_theory.sampler import law as torch_law
from cactus_theory.testing import check_rule
from sims import tradeoff
from sims.pools import PairPool


class VocabularyTAS(rules.DecisionRule):
    """Accept n iff q_n >= 1/V (reads the vocabulary size); recover argmax q."""

    name = "test-vocabulary-tas"

    def accept_mask(self, target_probs):
        return target_probs >= 1.0 / target_probs.shape[-1]

    def recovery(self, target_probs):
        return rules.one_hot(np.argmax(target_probs, axis=-1), target_probs.shape[-1])


class DeclaresPacking(VocabularyTAS):
    """The same rule, falsely declaring that padding changes nothing (negative control)."""

    support_only = True


def rows(seed, size=12, count=20, concentration=0.4):
    generator = np.random.default_rng(seed)
    target = generator.dirichlet(np.full(size, concentration), size=count)
    draft = generator.dirichlet(np.full(size, concentration), size=count)
    return target, draft


def test_a_gamma_that_reads_the_row_has_one_law_everywhere():
    rule = EntropyGamma()
    target, draft = rows(0)
    for q, p in zip(target, draft, strict=True):
        np.testing.assert_allclose(
            law.output_law(rule, q, p), law.output_law_enumerated(rule, q, p), atol=1e-12
        )
    # The torch sampler reads γ from whole rows too (γ from q_n is not declared).
    tensors = [torch.as_tensor(part) for part in (target, draft)]
    np.testing.assert_allclose(
        torch_law.output_law(rule, *tensors).numpy(),
        law.output_law(rule, target, draft),
        atol=1e-12,
    )
    # Negative control: γ from each q_n alone (what a mass-only path computes) is another
    # law, far from this one.
    elementwise = np.vectorize(lambda mass: rule.raised_mass(np.array([mass]))[0])(target)
    wrong = law.branch_rule_law(np.minimum(elementwise, draft), target, draft)
    assert np.abs(wrong - law.output_law(rule, target, draft)).max() > 0.1


def test_the_meter_packs_rows_only_for_rules_that_declare_it():
    rule = VocabularyTAS()
    target, draft = rows(1, size=40, count=30, concentration=0.05)
    target[:, 20:] = 0.0  # the second half of the vocabulary is padding: p = q = 0
    draft[:, 20:] = 0.0
    target /= target.sum(-1, keepdims=True)
    draft /= draft.sum(-1, keepdims=True)
    emitted = law.output_law(rule, target, draft)
    expected = divergences.kl_rows(emitted / emitted.sum(-1, keepdims=True), target)
    metered, _ = torch_law.emitted_divergence(rule, torch.as_tensor(target), torch.as_tensor(draft))
    np.testing.assert_allclose(metered.numpy(), expected, rtol=1e-9)
    # Negative control: the same rule declaring support_only is packed (1/V doubles) and
    # metered wrong; the kit catches the false declaration.
    packed, _ = torch_law.emitted_divergence(
        DeclaresPacking(), torch.as_tensor(target), torch.as_tensor(draft)
    )
    assert np.abs(packed.numpy() - expected).max() > 0.01
    report = check_rule(DeclaresPacking(), only=["support-only"], examples=40)
    assert not report.passed and report.failures[0].name == "support-only"


def test_tradeoff_statistics_read_gamma_from_whole_rows():
    rule = EntropyGamma()
    target, draft = rows(2)
    ids = np.tile(np.arange(target.shape[-1]), (target.shape[0], 1))
    pool = PairPool("test", target, draft, ids, target.shape[-1])
    stats = tradeoff.row_stats(rule, pool)
    per_branch = law.branch_divergence(rule, target, draft)
    expected = np.max(np.where(draft > 0, per_branch, -np.inf), axis=-1)
    np.testing.assert_allclose(stats.branch_kl, expected, rtol=1e-12)
    np.testing.assert_allclose(stats.acceptance, law.acceptance(rule, target, draft), atol=1e-14)
    emitted = law.output_law(rule, target, draft)
    np.testing.assert_allclose(stats.emitted_kl, divergences.kl_rows(emitted, target), rtol=1e-9)


def test_a_direct_rule_subclass_has_an_exact_law():
    class Coin(rules.Rule):
        """Accept with probability 1/2 when q_n > 0; on rejection emit the next token."""

        name = "test-coin"

        def accept_probs(self, target_probs, draft_probs):
            return np.where((draft_probs > 0) & (target_probs > 0), 0.5, 0.0)

        def residuals_for(self, target_probs, draft_probs, tokens):
            return rules.one_hot((tokens + 1) % target_probs.shape[-1], target_probs.shape[-1])

    rule = Coin()
    target, draft = rows(3, size=6)
    for q, p in zip(target, draft, strict=True):
        np.testing.assert_allclose(
            law.output_law(rule, q, p), law.output_law_enumerated(rule, q, p), atol=1e-14
        )
    q, p = np.array([0.5, 0.5, 0.0]), np.array([0.2, 0.3, 0.5])
    # a = (1/2, 1/2, 0); the rejected mass of n moves to n + 1.
    np.testing.assert_allclose(law.output_law(rule, q, p), [0.6, 0.25, 0.15], atol=1e-15)
    with pytest.raises(ValueError, match="^rule: test-coin is a general rule"):
        law.branch_divergence(rule, q, p)
