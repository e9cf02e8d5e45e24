"""Properties every rule must satisfy, proved on every hypothesis example (V from 2 to 64)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cactus_theory import divergences, law, rules
from cactus_theory.core import validate
from cactus_theory.testing.strategies import budgets, pairs, pairs_with_token, positive_budgets

DIVERGENCES = ("kl", "reverse-kl", "chi2", "hellinger", "tv", "js")


def all_rules(delta: float = 0.5) -> list[rules.Rule]:
    return [
        rules.make("sps"),
        rules.make("cactus", delta=delta),
        *[rules.make("cactus-exact", delta=delta, divergence=name) for name in DIVERGENCES],
        rules.make("frontier", delta=delta),
        rules.make("interp", alpha=0.3),
        rules.make("tas"),
        rules.make("tas", epsilon=0.3, alpha=0.5),
        rules.make("topk", k=3),
        rules.make("greedy"),
    ]


@given(pairs(), budgets)
def test_output_laws_are_distributions(pair, delta):
    target, draft = pair
    for rule in all_rules(delta):
        out = law.output_law(rule, target, draft)
        assert np.all(out >= 0), rule
        assert abs(out.sum() - 1.0) < 1e-12, rule
        accepted = law.acceptance(rule, target, draft)
        assert -1e-15 <= accepted <= 1.0 + 1e-12, rule


@given(pairs_with_token())
def test_zero_budget_is_sps_bit_for_bit(case):
    target, draft, token = case
    sps = rules.make("sps")
    zero_budget = [
        rules.make("cactus", delta=0.0),
        rules.make("frontier", delta=0.0),
        *[rules.make("cactus-exact", delta=0.0, divergence=name) for name in DIVERGENCES],
    ]
    for rule in zero_budget:
        assert np.array_equal(rule.accept_probs(target, draft), sps.accept_probs(target, draft))
        assert rule.accept_prob(target=target, draft=draft, token=token) == sps.accept_prob(
            target=target, draft=draft, token=token
        )
        assert np.array_equal(
            rule.residual(target=target, draft=draft, token=token),
            sps.residual(target=target, draft=draft, token=token),
        )
        assert np.array_equal(
            rule.adjusted_target(target=target, draft=draft, token=token),
            sps.adjusted_target(target=target, draft=draft, token=token),
        )
        assert np.allclose(law.output_law(rule, target, draft), target, rtol=0, atol=1e-15)


@given(pairs())
def test_sps_emits_target_exactly_with_acceptance_one_minus_tv(pair):
    target, draft = pair
    sps = rules.make("sps")
    assert np.allclose(law.output_law(sps, target, draft), target, rtol=0, atol=1e-15)
    assert law.acceptance(sps, target, draft) == pytest.approx(
        1.0 - divergences.tv(draft, target), abs=1e-14
    )
    assert np.allclose(law.output_law_enumerated(sps, target, draft), target, atol=1e-14)


@given(pairs(), st.lists(budgets, min_size=2, max_size=4))
def test_acceptance_is_non_decreasing_in_budget(pair, budget_list):
    target, draft = pair
    ordered = sorted(budget_list)
    families = [
        lambda d: rules.make("cactus", delta=d),
        lambda d: rules.make("frontier", delta=d),
        *[
            lambda d, n=name: rules.make("cactus-exact", delta=d, divergence=n)
            for name in DIVERGENCES
        ],
    ]
    for family in families:
        values = [law.acceptance(family(delta), target, draft) for delta in ordered]
        assert all(b >= a - 1e-12 for a, b in zip(values, values[1:], strict=False)), (
            family(1.0),
            values,
        )
        # Per token too: each branch's acceptance can only grow with the budget.
        probs = [family(delta).accept_probs(target, draft) for delta in ordered]
        assert all(np.all(b >= a - 1e-12) for a, b in zip(probs, probs[1:], strict=False))


@given(pairs(max_vocab=24), positive_budgets, st.sampled_from(DIVERGENCES))
def test_cactus_exact_keeps_every_branch_within_budget(pair, delta, divergence):
    target, draft = pair
    rule = rules.make("cactus-exact", delta=delta, divergence=divergence)
    branches = law.adjusted_targets(rule, target, draft)  # row n: the h when n is drafted
    for token, adjusted in enumerate(branches):
        assert abs(adjusted.sum() - 1.0) < 1e-12
        spent = divergences.rows(divergence, adjusted, target)
        assert spent <= delta * (1 + 1e-9) + 1e-15, (token, spent, delta)
        # and h raises the drafted token while keeping the rest proportional to q
        assert adjusted[token] >= target[token]
    # The exact one-dimensional reduction gives the same per-branch divergence.
    reduced = law.branch_divergence(rule, target, draft, divergence)
    full = np.array([divergences.rows(divergence, h, target) for h in branches])
    assert np.allclose(reduced, full, rtol=1e-7, atol=1e-12)


@given(pairs(), positive_budgets)
def test_frontier_emitted_law_within_budget(pair, delta):
    target, draft = pair
    rule = rules.make("frontier", delta=delta)
    emitted = law.output_law(rule, target, draft)
    assert divergences.kl(emitted, target) <= delta * (1 + 1e-9) + 1e-15
    assert np.allclose(emitted, rule.target_law(target, draft), atol=1e-15)


@given(pairs(), budgets)
def test_frontier_accepts_at_least_any_rule_with_emitted_law_within_budget(pair, delta):
    """Maximal coupling: any scheme with emitted law μ accepts at most Σ min(p, μ)."""
    target, draft = pair
    for rule in all_rules(delta):
        spent = law.emitted_divergence(rule, target, draft)
        if not np.isfinite(spent):
            continue
        frontier = rules.make("frontier", delta=max(spent, 0.0))
        assert (
            law.acceptance(frontier, target, draft) >= law.acceptance(rule, target, draft) - 1e-9
        ), (
            rule,
            spent,
        )


@given(pairs(), st.floats(0.0, 1.0))
def test_interp_acceptance(pair, alpha):
    target, draft = pair
    rule = rules.make("interp", alpha=alpha)
    expected = alpha + (1 - alpha) * (1 - divergences.tv(draft, target))
    assert law.acceptance(rule, target, draft) == pytest.approx(expected, abs=1e-14)
    mix = alpha * draft + (1 - alpha) * target
    assert np.allclose(law.output_law(rule, target, draft), mix, atol=1e-15)


@given(pairs(max_vocab=12), budgets)
def test_fast_law_equals_enumeration(pair, delta):
    target, draft = pair
    for rule in all_rules(delta):
        fast = law.output_law(rule, target, draft)
        reference = law.output_law_enumerated(rule, target, draft)
        assert np.allclose(fast, reference, rtol=0, atol=1e-12), rule


@given(st.lists(pairs(min_vocab=6, max_vocab=6), min_size=1, max_size=5), budgets)
def test_batched_law_equals_row_by_row(batch, delta):
    target = np.stack([t for t, _ in batch])
    draft = np.stack([d for _, d in batch])
    for rule in all_rules(delta):
        together = law.output_law(rule, target, draft)
        accepted = law.acceptance(rule, target, draft)
        for row in range(len(batch)):
            assert np.allclose(
                together[row], law.output_law(rule, target[row], draft[row]), atol=1e-14
            )
            assert accepted[row] == pytest.approx(
                law.acceptance(rule, target[row], draft[row]), abs=1e-14
            )


@given(pairs_with_token(), budgets)
def test_residuals_are_distributions_supported_where_h_exceeds_p(case, delta):
    target, draft = validate.pair(*case[:2])
    token = case[2]
    for rule in all_rules(delta):
        residual = rule.residual(target=target, draft=draft, token=token)
        assert np.all(residual >= 0) and abs(residual.sum() - 1.0) < 1e-12, rule
        if rule.family != "decision":
            adjusted = rule.adjusted_target(target=target, draft=draft, token=token)
            if np.maximum(adjusted - draft, 0).sum() > 0:
                assert np.all(residual[adjusted <= draft] == 0), rule
            else:  # h = p: rejection is impossible and the residual falls back to h
                assert np.array_equal(residual, adjusted)
        accept = rule.accept_prob(target=target, draft=draft, token=token)
        assert 0.0 <= accept <= 1.0
