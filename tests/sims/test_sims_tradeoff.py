"""Exact pool statistics and acceptance matching."""

import numpy as np
import pytest

from cactus_theory import divergences, law, rules
from sims import synthetic, tradeoff


@pytest.fixture(scope="module")
def pool():
    return synthetic.dirichlet_pool(0.5, vocab_size=20, num_pairs=200, seed=7)


@pytest.mark.parametrize(
    "spec", ["sps", "cactus:delta=0.4", "cactus-exact:delta=0.4", "frontier:delta=0.2", "tas"]
)
def test_row_stats_equal_the_law_module(pool, spec):
    rule = rules.parse(spec)
    stats = tradeoff.row_stats(rule, pool)
    expected_law = law.output_law_rows(rule, pool.target_probs, pool.draft_probs)
    np.testing.assert_allclose(
        stats.acceptance,
        law.acceptance_rows(rule, pool.target_probs, pool.draft_probs),
        atol=1e-14,
    )
    np.testing.assert_allclose(
        stats.emitted_kl, divergences.kl_rows(expected_law, pool.target_probs), atol=1e-12
    )


def test_branch_budgets(pool):
    exact = tradeoff.row_stats(rules.make("cactus-exact", delta=0.3), pool)
    assert np.all(exact.branch_kl <= 0.3 + 1e-12)
    frontier = tradeoff.row_stats(rules.make("frontier", delta=0.3), pool)
    assert np.all(frontier.emitted_kl <= 0.3 + 1e-9)
    assert np.all(np.isnan(tradeoff.row_stats(rules.make("tas"), pool).branch_kl))


@pytest.mark.parametrize("name", ["cactus-exact", "frontier", "pareto", "interp"])
def test_match_acceptance_hits_the_goal(pool, name):
    goal = float(
        tradeoff.summary(tradeoff.row_stats(rules.make("cactus", delta=0.5), pool))["acceptance"]
    )
    rule, value = tradeoff.match_acceptance(name, pool, goal)
    reached = tradeoff.summary(tradeoff.row_stats(rule, pool))["acceptance"]
    assert reached == pytest.approx(goal, abs=1e-8)
    assert value > 0


def test_match_acceptance_rejects_unreachable_goals(pool):
    with pytest.raises(ValueError, match="^goal"):
        tradeoff.match_acceptance("frontier", pool, 0.01)
    with pytest.raises(ValueError, match="^name"):
        tradeoff.match_acceptance("tas", pool, 0.5)
