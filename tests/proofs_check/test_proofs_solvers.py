"""cvxpy formulations, independent references and instance families (proofs_check)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cactus_theory import divergences, law, rules
from cactus_theory.core import gamma
from proofs_check import formulations, instances, reference, search
from proofs_check.checks_prop4 import cross_entropy_raised_mass

TARGET = np.array([0.5, 0.3, 0.15, 0.05])
DRAFT = np.array([0.1, 0.2, 0.3, 0.4])


def test_tv_branch_has_the_textbook_answer():
    # TV: raise q_n by δ (taken from the others), so γ = 0.3 + 0.1.
    solution = formulations.solve_branch(TARGET, 1, 0.1, "tv")
    assert solution.value == pytest.approx(0.4, abs=1e-8)
    assert solution.point.sum() == pytest.approx(1.0, abs=1e-8)


@pytest.mark.parametrize("divergence", formulations.BRANCH_DIVERGENCES)
@pytest.mark.parametrize("delta", [1e-3, 0.2])
def test_branch_optimum_matches_the_scalar_reduction(divergence, delta):
    solution = formulations.solve_branch(TARGET, 3, delta, divergence)
    exact = float(reference.bisect_raised_mass(TARGET[3], delta, divergence))
    assert solution.value == pytest.approx(exact, abs=1e-6)
    assert float(gamma.exact_raised_mass(TARGET[3], delta, divergence)) == pytest.approx(
        exact, abs=1e-13
    )


def test_branch_point_is_back_in_the_original_token_order():
    solution = formulations.solve_branch(TARGET, 2, 0.05, "kl")
    shaped = reference.structured_targets(TARGET, np.asarray(2), np.asarray(solution.value))
    np.testing.assert_allclose(solution.point, shaped, atol=1e-5)


def test_output_law_problem_matches_frontier():
    solution = formulations.solve_output_law(TARGET, DRAFT, 0.05)
    frontier = rules.make("frontier", delta=0.05)
    assert solution.value == pytest.approx(law.acceptance(frontier, TARGET, DRAFT), abs=1e-6)


def test_coupling_lp_is_one_minus_tv():
    solution = formulations.solve_coupling(DRAFT, TARGET)
    assert solution.value == pytest.approx(1 - divergences.tv(DRAFT, TARGET), abs=1e-9)


def test_cross_entropy_lp_matches_its_closed_form():
    budget = 1.5
    closed = cross_entropy_raised_mass(TARGET, np.asarray(budget))
    for token in range(4):
        solution = formulations.solve_cross_entropy(TARGET, token, budget)
        assert solution.value == pytest.approx(closed[token], abs=1e-9)


def test_infeasible_problem_raises_solver_error_not_a_number():
    # Cross-entropy budget below min −log q: no distribution qualifies.
    with pytest.raises(formulations.SolverError):
        formulations.solve_cross_entropy(TARGET, 0, 0.1)


def test_unknown_divergence_is_a_value_error():
    with pytest.raises(ValueError, match="^divergence"):
        formulations.solve_branch(TARGET, 0, 0.1, "renyi")


@settings(max_examples=60, deadline=None)
@given(
    draft=hnp.arrays(np.float64, 5, elements=st.floats(0, 1)),
    adjusted=hnp.arrays(np.float64, 5, elements=st.floats(0, 1)),
)
def test_generalised_sps_emits_its_target(draft, adjusted):
    if draft.sum() == 0 or adjusted.sum() == 0:
        return
    draft, adjusted = draft / draft.sum(), adjusted / adjusted.sum()
    every = np.broadcast_to(adjusted, (5, 5))
    emitted, acceptance = reference.gsps_law(every, draft)
    np.testing.assert_allclose(emitted, adjusted, atol=1e-12)
    assert acceptance == pytest.approx(np.minimum(draft, adjusted).sum(), abs=1e-12)


@pytest.mark.parametrize(
    "spec", ["cactus:delta=0.3", "cactus-exact:delta=0.05,divergence=js", "tas"]
)
def test_enumerated_law_matches_the_core_law(spec):
    rule = rules.parse(spec)
    batch = instances.sample("dirichlet-1", np.random.default_rng(3), 40, 6)
    emitted, acceptance = reference.enumerated_law(rule, batch.target, batch.draft)
    np.testing.assert_allclose(emitted, law.output_law(rule, batch.target, batch.draft), atol=1e-13)
    np.testing.assert_allclose(
        acceptance, law.acceptance(rule, batch.target, batch.draft), atol=1e-13
    )


def test_bisection_reference_matches_the_closed_forms():
    q = np.linspace(0.001, 0.999, 101)
    np.testing.assert_allclose(
        reference.bisect_raised_mass(q, 0.1, "tv"), np.minimum(1, q + 0.1), atol=2e-16
    )
    np.testing.assert_allclose(
        reference.bisect_raised_mass(q, 0.1, "chi2"),
        np.minimum(1, q + np.sqrt(0.1 * q * (1 - q))),
        atol=4e-16,
    )


@pytest.mark.parametrize("family", instances.FAMILIES)
@pytest.mark.parametrize("vocab_size", [1, 2, 7])
def test_families_are_valid_and_reproducible(family, vocab_size):
    first = instances.sample(family, np.random.default_rng(11), 64, vocab_size)
    again = instances.sample(family, np.random.default_rng(11), 64, vocab_size)
    for rows in (first.target, first.draft):
        assert np.all(rows >= 0) and np.all(np.isfinite(rows))
        np.testing.assert_allclose(rows.sum(axis=-1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(first.target, again.target)
    np.testing.assert_array_equal(first.draft, again.draft)


def test_bad_family_and_vocabulary_are_value_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="^family"):
        instances.sample("gaussian", rng, 3, 4)
    with pytest.raises(ValueError, match="^vocab_size"):
        instances.sample("zipf", rng, 3, 0)


def test_pair_search_finds_a_known_maximum():
    """max over pairs of p_0 − q_0 is 1 (p = e_0, q = e_1); the search gets close."""

    def objective(target, draft):
        return draft[:, 0] - target[:, 0]

    found = search.maximise_over_pairs(
        objective, 3, np.random.default_rng(0), random_pairs=200, population=20, generations=10
    )
    assert found.value > 0.999
    assert found.evaluations >= 200
    assert found.value == pytest.approx(objective(found.target[None], found.draft[None])[0])
