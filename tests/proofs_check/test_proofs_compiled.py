"""``compiled.Compiled``: parameter values put straight into cvxpy's compiled data give bit
for bit the answers of ``Problem.solve``, and a problem whose data would differ stays on
cvxpy's path."""

import numpy as np
import pytest

from proofs_check import compiled, formulations, instances


def _rows(count: int, vocab: int, seed: int):
    """Rows from every family, adversarial ones included (zeros, masses near 1e-12)."""
    rng = np.random.default_rng(seed)
    targets, drafts = [], []
    for family in instances.FAMILIES:
        batch = instances.sample(family, rng, count, vocab)
        targets.append(batch.target)
        drafts.append(batch.draft)
    return np.concatenate(targets), np.concatenate(drafts)


def _plain(problem, parameters, values, variable, solver, options):
    """The same problem solved by cvxpy itself: (value, variable's value, status)."""
    import cvxpy as cp

    for parameter, value in zip(parameters, values, strict=True):
        parameter.value = value
    try:
        problem.solve(solver=solver, **compiled._copy(options))
    except cp.error.SolverError:
        return None
    return problem.value, np.asarray(variable.value).copy(), problem.status


def _fast(target, values):
    import cvxpy as cp

    try:
        target.compiled.solve(values)
    except cp.error.SolverError:
        return None
    return target.problem.value, None, target.problem.status


@pytest.mark.parametrize("divergence", formulations.BRANCH_DIVERGENCES)
def test_branch_problems_solve_bit_for_bit_as_cvxpy(divergence):
    ours = formulations._BranchProblem(divergence, 4)
    theirs = formulations._BranchProblem(divergence, 4)
    targets, _ = _rows(4, 4, 1)
    for index, target in enumerate(targets):
        delta = [1e-4, 0.01, 0.3, 2.0][index % 4]
        try:
            found = ours.solve(target, delta)
        except formulations.SolverError:
            found = None
        mass = float(target[0])
        values = [
            mass,
            float(np.sqrt(mass)),
            float(-np.log(mass)) if mass > 0 else 745.0,
            float(mass * np.log(mass) - mass) if mass > 0 else 0.0,
            target[1:],
            float(delta),
        ]
        solver, options = formulations._conic_solver()
        expected = _plain(
            theirs.problem, theirs.compiled.parameters, values, theirs.ratio, solver, options
        )
        if expected is None or expected[2] not in ("optimal", "optimal_inaccurate"):
            assert found is None
            continue
        assert found is not None
        assert found.status == expected[2]
        assert float(theirs.raised.value) == found.value
        np.testing.assert_array_equal(target[1:] * expected[1], found.point[1:])
    assert ours.compiled._state == "fast"


def test_output_law_and_lp_problems_solve_bit_for_bit_as_cvxpy():
    targets, drafts = _rows(3, 5, 2)
    law, law_plain = formulations._OutputLawProblem(5), formulations._OutputLawProblem(5)
    coupling = formulations._CouplingProblem(5)
    coupling_plain = formulations._CouplingProblem(5)
    for index, (target, draft) in enumerate(zip(targets, drafts, strict=True)):
        delta = [1e-3, 0.1, 1.5][index % 3]
        positive = target > 0
        values = [
            np.where(positive, -np.log(np.where(positive, target, 1.0)), 0.0),
            draft,
            (~positive).astype(np.float64),
            delta,
        ]
        solver, options = formulations._conic_solver()
        expected = _plain(
            law_plain.problem, law_plain.compiled.parameters, values, law_plain.h, solver, options
        )
        try:
            found = law.solve(target, draft, delta)
        except formulations.SolverError:
            found = None
        if expected is None or expected[2] not in ("optimal", "optimal_inaccurate"):
            assert found is None
        else:
            assert (found.value, found.status) == (expected[0], expected[2])
            np.testing.assert_array_equal(found.point, expected[1])
        adjusted = target * (draft.sum() / target.sum())
        solver, options = formulations._lp_solver()
        expected = _plain(
            coupling_plain.problem,
            coupling_plain.compiled.parameters,
            [draft, adjusted],
            coupling_plain.coupling,
            solver,
            options,
        )
        found = coupling.solve(draft, adjusted)
        assert (found.value, found.status) == (expected[0], expected[2])
        np.testing.assert_array_equal(found.point, expected[1])
    assert law.compiled._state == "fast" and coupling.compiled._state == "fast"


def test_data_that_differ_keep_the_problem_on_cvxpys_path(monkeypatch):
    """Negative control: perturbed data fail the bit-for-bit comparison."""
    original = compiled._FastData.apply_parameters

    def perturbed(self, vector):
        c, d, matrix, offsets = original(self, vector)
        return c, d, matrix, offsets + 1e-9

    monkeypatch.setattr(compiled._FastData, "apply_parameters", perturbed)
    problem, twin = formulations._OutputLawProblem(3), formulations._OutputLawProblem(3)
    target = np.array([0.5, 0.3, 0.2])
    values = [-np.log(target), np.array([0.2, 0.2, 0.6]), np.zeros(3), 0.1]
    solver, options = formulations._conic_solver()
    for _ in range(4):  # the same history as cvxpy's: its cached solver is updated alike
        found = problem.solve(target, values[1], 0.1)
        expected = _plain(twin.problem, twin.compiled.parameters, values, twin.h, solver, options)
        assert found.value == expected[0]
    assert problem.compiled._state == "cvxpy"


def test_a_value_cvxpy_refuses_is_refused():
    problem = formulations._CrossEntropyProblem(3)
    problem.solve(np.array([0.5, 0.3, 0.2]), 2.0)
    with pytest.raises(ValueError, match="nonnegative"):
        problem.compiled.solve([np.array([-1.0, 0.5, 0.2]), 2.0])
