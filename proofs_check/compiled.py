"""One cvxpy problem solved many times: parameter values go straight into its compiled data.

cvxpy compiles a DPP problem once into an affine map from the parameters to the solver's
data (``ParamConeProg``), but every ``Problem.solve`` still validates each parameter's new
value and rebuilds the data through scipy.sparse (``apply_parameters``), which on the
claims' small problems costs several times the solve itself. ``Compiled`` keeps all of
cvxpy's solving chain (the solver interface, its cached solver, the inversion and the
unpacking into the problem's variables) and replaces only that step: with the parameter
vector x (values in cvxpy's column order, then 1),

    data values = reduced_mat @ x,      A = its first columns,      b = its last column,

in the sparsity pattern cvxpy cached (``ReducedMat.problem_data_index``): the same
products, without the sparse bookkeeping. The objective's c and offset come from cvxpy's
own function (computed once when no parameter enters them).

The first solve is cvxpy's own ``Problem.solve``; the data of the next ``COMPARED`` values
are then built both ways and compared bit for bit (matrix values, indices, pointers, b and
c).
A problem whose data differ, or that cvxpy compiles into a form this does not cover (a
quadratic objective, variable bounds, parameters transformed by a reduction), is solved
by ``Problem.solve`` every time: the fast path never changes a number.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import sparse

Array = np.ndarray

#: Solves whose data are built both ways and compared before the fast path is trusted.
COMPARED = 5


class Compiled:
    """``problem`` (a DPP cvxpy problem whose parameters are ``parameters``) solved by
    ``solver`` with ``options`` (module docstring). ``solve(values)`` sets the problem's
    variables, ``value`` and ``status`` as ``problem.solve`` would."""

    def __init__(self, problem, parameters: list, solver: str, options: dict) -> None:
        self.problem = problem
        self.parameters = list(parameters)
        self.solver = solver
        self.options = options
        self._fast: _FastData | None = None
        self._state = "first"  # "first" -> "compare" (COMPARED solves) -> "fast" or "cvxpy"
        self._compared = 0

    def solve(self, values: list) -> None:
        """Solve at parameter values ``values`` (one per parameter, in order, set on the
        parameters as cvxpy sets them: validated, and read by any expression's ``value``);
        raises what ``Problem.solve`` raises (``cvxpy.error.SolverError``)."""
        for parameter, value in zip(self.parameters, values, strict=True):
            _assign(parameter, value)
        if self._state in ("first", "cvxpy"):
            self.problem.solve(solver=self.solver, **_copy(self.options))
            if self._state == "first":
                self._state = "compare"
            return
        fast = self._fast or self._prepare()
        if not fast.usable:
            self._state = "cvxpy"
            self.problem.solve(solver=self.solver, **_copy(self.options))
            return
        vector = self._vector()
        if self._state == "compare":
            if not self._agrees(vector):
                self._state = "cvxpy"
                self.problem.solve(solver=self.solver, **_copy(self.options))
                return
            self._compared += 1
            if self._compared >= COMPARED:
                self._state = "fast"
        self._solve_fast(vector)

    def _vector(self) -> Array:
        """The parameter vector of cvxpy's compiled problem: each parameter's value
        flattened in Fortran order at its column, the constant 1 last."""
        fast = self._fast
        vector = np.zeros(fast.size)
        vector[fast.constant] = 1.0
        for parameter, (start, stop) in zip(self.parameters, fast.columns, strict=True):
            vector[start:stop] = np.asarray(parameter.value, dtype=np.float64).flatten(order="F")
        return vector

    def _prepare(self) -> _FastData:
        data, chain, inverse = self.problem.get_problem_data(
            self.solver, solver_opts=_copy(self.options)
        )
        self._fast = _FastData(self.problem, self.parameters, data, chain, inverse)
        return self._fast

    def _agrees(self, vector: Array) -> bool:
        """Whether our data for the parameters' values equal cvxpy's, bit for bit."""
        fast = self._fast
        theirs, _, _ = self.problem.get_problem_data(self.solver, solver_opts=_copy(self.options))
        ours, _ = fast.solver_data(vector)
        return _same_data(theirs, ours)

    def _solve_fast(self, vector: Array) -> None:
        fast = self._fast
        data, inverse = fast.solver_data(vector)
        options = _copy(self.options)
        solution = fast.chain.solve_via_data(self.problem, data, True, False, options)
        self.problem.unpack_results(solution, fast.chain, inverse)


class _FastData:
    """What the fast path needs from cvxpy's compiled problem, and whether it applies."""

    def __init__(self, problem, parameters: list, data: dict, chain, inverse: list) -> None:
        from cvxpy import settings
        from cvxpy.reductions.solvers.solver_inverse_data import SolverInverseData

        self.chain = chain
        self.inverse = inverse
        self._inverse_type = SolverInverseData
        program = data.get(settings.PARAM_PROB)
        self.program = program
        known = {p.id for p in parameters} | {_constant_id()}
        self.usable = (
            program is not None
            and getattr(program, "P", None) is None
            and getattr(program, "lb_tensor", None) is None
            and getattr(program, "ub_tensor", None) is None
            and getattr(program, "reduced_A", None) is not None
            and set(getattr(program, "param_id_to_col", {0: 0})) <= known
            and _constant_id() in program.param_id_to_col
        )
        if not self.usable:
            return
        self.size = program.total_param_size + 1
        self.constant = program.param_id_to_col[_constant_id()]
        self.columns = [
            (program.param_id_to_col[p.id], program.param_id_to_col[p.id] + p.size)
            if p.id in program.param_id_to_col
            else (0, 0)
            for p in parameters
        ]
        program.reduced_A.cache(keep_zeros=False)
        self.reduced = program.reduced_A.reduced_mat
        indices, indptr, shape = program.reduced_A.problem_data_index
        self.split = int(indptr[-2])
        self.indices, self.indptr = indices, indptr
        self.shape = (int(shape[0]), int(shape[1]) - 1)
        self.objective_fixed = program.q[:, :-1].count_nonzero() == 0
        self._objective: tuple[Array, Any] | None = None

    def _objective_for(self, vector: Array) -> tuple[Array, Any]:
        if self._objective is not None:
            return self._objective
        from cvxpy.cvxcore.python import canonInterface

        q, offset = canonInterface.get_matrix_from_tensor(
            self.program.q, vector, self.program.x.size, with_offset=True
        )
        found = (q.toarray().flatten(), offset)
        if self.objective_fixed:
            self._objective = found
        return found

    def apply_parameters(self, vector: Array) -> tuple[Array, Any, Any, Array]:
        """(c, d, A, b) as ``ParamConeProg.apply_parameters()`` returns them."""
        values = self.reduced @ vector
        matrix = sparse.csc_array(
            (values[: self.split], self.indices[: self.split], self.indptr[:-1]),
            shape=self.shape,
        )
        offsets = np.zeros(self.shape[0])
        np.add.at(offsets, self.indices[self.split :], values[self.split :])
        c, d = self._objective_for(vector)
        return c, d, matrix, np.atleast_1d(offsets)

    def solver_data(self, vector: Array) -> tuple[dict, list]:
        """(solver data, inverse data) as ``Problem.get_problem_data`` gives them."""
        program = _Applied(self.program, self.apply_parameters(vector))
        solver = self.chain.solver
        data, solver_inverse = solver.apply(program)
        inverse = self.inverse[:-1] + [
            self._inverse_type(solver_inverse, solver, self.inverse[-1].solver_options)
        ]
        return data, inverse


class _Applied:
    """cvxpy's compiled problem with its parameters already applied (``apply_parameters``
    returns the given data); everything else is the compiled problem's."""

    def __init__(self, program, applied: tuple) -> None:
        self._program = program
        self._applied = applied

    def __getattr__(self, name: str):
        return getattr(self._program, name)

    def apply_parameters(self, *args, **kwargs):
        if args or kwargs:
            raise RuntimeError("compiled: apply_parameters with arguments is not covered")
        return self._applied


def _assign(parameter, value) -> None:
    """``parameter.value = value`` without cvxpy's general validation where the value
    plainly satisfies it (the right shape, no NaN, >= 0 for a nonnegative parameter, no
    other attribute); anything else goes through cvxpy's setter, which raises as before."""
    import cvxpy.interface as intf

    converted = intf.convert(value)
    array = np.asarray(converted, dtype=np.float64)
    attributes = {name for name, held in parameter.attributes.items() if held}
    plain = (
        attributes <= {"nonneg"}
        and array.shape == parameter.shape
        and not np.isnan(array).any()
        and ("nonneg" not in attributes or array.size == 0 or array.min() >= 0.0)
    )
    if plain:
        parameter.save_value(converted)
    else:
        parameter.value = value


def _constant_id() -> int:
    from cvxpy.lin_ops import lin_op

    return lin_op.CONSTANT_ID


def _copy(options: dict) -> dict:
    """The options, nested dicts copied (cvxpy's SCIPY interface pops from them)."""
    return {key: dict(item) if isinstance(item, dict) else item for key, item in options.items()}


def _same_data(theirs: dict, ours: dict) -> bool:
    """Whether two solver data dicts hold the same arrays, bit for bit."""
    if set(theirs) != set(ours):
        return False
    for key, value in theirs.items():
        other = ours[key]
        if sparse.issparse(value) or sparse.issparse(other):
            if not (sparse.issparse(value) and sparse.issparse(other)):
                return False
            value, other = sparse.csc_array(value), sparse.csc_array(other)
            parts = [(value.data, other.data), (value.indices, other.indices)]
            parts.append((value.indptr, other.indptr))
            if value.shape != other.shape or not all(_same(a, b) for a, b in parts):
                return False
        elif isinstance(value, np.ndarray) or isinstance(other, np.ndarray):
            if not _same(np.asarray(value), np.asarray(other)):
                return False
    return True


def _same(first: Array, second: Array) -> bool:
    return first.shape == second.shape and first.tobytes() == second.tobytes()
