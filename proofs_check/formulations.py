"""The constrained problems, stated in cvxpy and solved to interior-point precision.

Each problem is built once per vocabulary size with cvxpy ``Parameter``s (DPP), so a new
instance only re-solves (``compiled``: the parameter values go straight into the compiled
data, bit for bit what cvxpy builds); nothing here knows the closed forms it is used to
check.

1. Per-branch problem (the paper's), for a drafted token n placed at index 0:

       maximise h_0  subject to  D(h‖q) <= δ,  h >= 0,  Σ h = 1,

   for D in KL, reverse KL, Pearson χ², squared Hellinger, TV and Jensen–Shannon.
2. Output-law problem (the frontier):

       maximise Σ_x min(p_x, h_x)  subject to  KL(h‖q) <= δ,  h in the simplex.

3. Coupling LP: max Σ_x π_xx over couplings π >= 0 with row sums p (drafted) and column sums
   h (emitted). Its value is 1 − TV(p, h) = Σ min(p, h).
4. Cross-entropy problem (Prop. 4): maximise h_0 subject to −Σ h log q <= τ, an LP.

Exponential-cone problems use Clarabel with tight tolerances (``CONIC_OPTIONS``); LPs use
HiGHS (through scipy). A solve that ends in any status but optimal or optimal_inaccurate raises
``SolverError``, so a failed solve is never read as a number.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import numpy as np

from proofs_check.compiled import Compiled

Array = np.ndarray

#: Divergences with a cvxpy per-branch formulation (the names of ``cactus_theory.divergences``).
BRANCH_DIVERGENCES = ("kl", "reverse-kl", "chi2", "hellinger", "tv", "js")

#: Clarabel settings: interior-point gaps and feasibility to 1e-9.
CONIC_OPTIONS = {
    "tol_gap_abs": 1e-9,
    "tol_gap_rel": 1e-9,
    "tol_feas": 1e-9,
    "max_iter": 400,
}

#: LPs go to HiGHS through scipy (cvxpy's "SCIPY" solver), which is silent. HiGHS's presolve
#: declares couplings of near-one-hot rows (masses ~1e-8) infeasible, so it is off.
LP_SOLVER = ("SCIPY", {"scipy_options": {"method": "highs", "presolve": False}})


class SolverError(RuntimeError):
    """cvxpy did not reach an (approximately) optimal solution."""


@dataclass(frozen=True)
class Solution:
    """An optimal value, the optimal point, and cvxpy's status string."""

    value: float
    point: Array
    status: str


def _cp():
    import cvxpy  # imported here so that ``import proofs_check`` stays cheap

    return cvxpy


def _solve(problem, variable, solver: str, options: dict, values: list | None = None) -> Solution:
    """Solve ``problem`` (a ``Compiled`` one at parameter ``values``) and read its value,
    ``variable``'s value and the status; ``SolverError`` unless (near) optimal."""
    cp = _cp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "solution may be inaccurate" is read from status
        try:
            if isinstance(problem, Compiled):
                problem.solve(values)
            else:
                problem.solve(solver=solver, **options)
        except cp.error.SolverError as error:
            raise SolverError(f"{solver}: {error}") from None
    if isinstance(problem, Compiled):
        problem = problem.problem
    if problem.status not in ("optimal", "optimal_inaccurate"):
        raise SolverError(f"{solver}: status {problem.status}")
    return Solution(
        float(problem.value),
        np.asarray(variable.value, dtype=np.float64).copy(),
        str(problem.status),
    )


def clear_compiled() -> None:
    """Forget every compiled problem (the next solve builds and compiles afresh)."""
    for cached in (_branch_problem, _output_law_problem, _coupling_problem, _cross_entropy_problem):
        cached.cache_clear()


def _conic_solver() -> tuple[str, dict]:
    return "CLARABEL", dict(CONIC_OPTIONS)


def _lp_solver() -> tuple[str, dict]:
    return LP_SOLVER[0], {key: dict(value) for key, value in LP_SOLVER[1].items()}


def _drafted_term(name: str, raised, mass, root_mass, cost, offset, lift):
    """cvxpy expression of q_n f(h_n / q_n) for the drafted token (q_n may be 0).

    KL and reverse KL use c = −log q_n and q_n log q_n − q_n as parameters, so no cone
    sees the (possibly tiny) q_n itself: KL term = h log h + c h − h + q_n, reverse-KL term
    = −q_n log h + h + q_n log q_n − q_n.
    """
    cp = _cp()
    if name == "kl":
        return -cp.entr(raised) + cost * raised - raised + mass
    if name == "reverse-kl":
        return -mass * cp.log(raised) + raised + offset
    if name == "chi2":
        return cp.square(lift)  # h_n = q_n + √q_n z_n, so (h_n − q_n)²/q_n = z_n²
    if name == "hellinger":
        return 0.5 * (raised + mass) - cp.multiply(root_mass, cp.sqrt(raised))
    if name == "tv":
        return 0.5 * cp.abs(raised - mass)
    if name == "js":
        middle = 0.5 * (raised + mass)
        return 0.5 * cp.kl_div(raised, middle) + 0.5 * cp.kl_div(mass, middle)
    raise ValueError(f"divergence: no cvxpy formulation for {name!r}")


def _ratio_terms(name: str, ratio):
    """Elementwise f(t) for the other tokens, written in the ratio t = h_i/q_i."""
    cp = _cp()
    if name == "kl":
        return cp.kl_div(ratio, 1)  # t log t − t + 1
    if name == "reverse-kl":
        return cp.kl_div(1, ratio)  # −log t + t − 1
    if name == "chi2":
        return cp.square(ratio - 1)
    if name == "hellinger":
        return 0.5 * (ratio + 1) - cp.sqrt(ratio)  # ½(√t − 1)²
    if name == "tv":
        return 0.5 * cp.abs(ratio - 1)
    if name == "js":
        middle = 0.5 * (ratio + 1)
        return 0.5 * cp.kl_div(ratio, middle) + 0.5 * cp.kl_div(1, middle)
    raise ValueError(f"divergence: no cvxpy formulation for {name!r}")


class _BranchProblem:
    """maximise h_0 s.t. D(h‖q) <= δ on the simplex, for one vocabulary size and divergence.

    Written as D = q_0 f(h_0/q_0) + Σ_{i>0} q_i f(t_i) with h_i = q_i t_i for i > 0: the
    ratios t stay O(1) however small q_i is, which keeps the interior-point method
    accurate on rows with masses like 1e−12 (h_i itself would not be). Tokens with q_i = 0
    get h_i = 0, which never lowers the optimum (mass there only takes from h_0).
    """

    def __init__(self, name: str, vocab_size: int) -> None:
        cp = _cp()
        self.name = name
        self.mass = cp.Parameter(nonneg=True)  # q_0
        self.root_mass = cp.Parameter(nonneg=True)  # √q_0
        self.cost = cp.Parameter(nonneg=True)  # −log q_0 (capped at 745 when q_0 = 0)
        self.offset = cp.Parameter()  # q_0 log q_0 − q_0
        self.rest = cp.Parameter(vocab_size - 1, nonneg=True)  # q_i, i > 0
        self.delta = cp.Parameter(nonneg=True)
        self.ratio = cp.Variable(vocab_size - 1, nonneg=True)
        if name == "chi2":
            self.lift = cp.Variable()
            self.raised = self.mass + self.root_mass * self.lift
            extra = [self.raised >= 0]
        else:
            self.lift = None
            self.raised = cp.Variable(nonneg=True)
            extra = []
        divergence = _drafted_term(
            name, self.raised, self.mass, self.root_mass, self.cost, self.offset, self.lift
        )
        if vocab_size > 1:
            divergence = divergence + self.rest @ _ratio_terms(name, self.ratio)
            total = self.raised + self.rest @ self.ratio
        else:
            total = self.raised
        self.problem = cp.Problem(
            cp.Maximize(self.raised), [total == 1, divergence <= self.delta, *extra]
        )
        parameters = [self.mass, self.root_mass, self.cost, self.offset, self.rest, self.delta]
        self.compiled = Compiled(self.problem, parameters, *_conic_solver())

    def solve(self, target_probs: Array, delta: float) -> Solution:
        mass = float(target_probs[0])
        values = [
            mass,
            float(np.sqrt(mass)),
            float(-np.log(mass)) if mass > 0 else 745.0,
            float(mass * np.log(mass) - mass) if mass > 0 else 0.0,
            target_probs[1:],
            float(delta),
        ]
        solved = _solve(self.compiled, self.ratio, *_conic_solver(), values)
        raised = float(self.raised.value)
        point = np.concatenate([[raised], target_probs[1:] * np.asarray(solved.point)])
        return Solution(raised, point, solved.status)


@functools.cache
def _branch_problem(name: str, vocab_size: int) -> _BranchProblem:
    return _BranchProblem(name, vocab_size)


def solve_branch(target_probs: Array, token: int, delta: float, divergence: str) -> Solution:
    """Per-branch problem for drafted ``token``: max h_n s.t. D(h‖q) <= δ (cvxpy, Clarabel).

    The returned point is in the original token order.
    """
    target_probs = np.asarray(target_probs, dtype=np.float64)
    order = np.r_[token, np.delete(np.arange(target_probs.size), token)]
    solution = _branch_problem(divergence, target_probs.size).solve(target_probs[order], delta)
    point = np.empty_like(solution.point)
    point[order] = solution.point
    return Solution(solution.value, point, solution.status)


class _OutputLawProblem:
    """maximise Σ min(p, h) s.t. KL(h‖q) <= δ, h in the simplex.

    KL is written Σ h log h + Σ c h with c = −log q a parameter (h = 0 where q = 0), so
    no cone sees a tiny q itself; Σ kl_div(h, q) loses accuracy when some q_x is ~1e−15.
    """

    def __init__(self, vocab_size: int) -> None:
        cp = _cp()
        self.h = cp.Variable(vocab_size, nonneg=True)
        self.cost = cp.Parameter(vocab_size, nonneg=True)
        self.p = cp.Parameter(vocab_size, nonneg=True)
        self.off_support = cp.Parameter(vocab_size, nonneg=True)
        self.delta = cp.Parameter(nonneg=True)
        self.problem = cp.Problem(
            cp.Maximize(cp.sum(cp.minimum(self.p, self.h))),
            [
                cp.sum(self.h) == 1,
                cp.sum(-cp.entr(self.h)) + self.cost @ self.h <= self.delta,
                cp.multiply(self.off_support, self.h) == 0,
            ],
        )
        parameters = [self.cost, self.p, self.off_support, self.delta]
        self.compiled = Compiled(self.problem, parameters, *_conic_solver())

    def solve(self, target_probs: Array, draft_probs: Array, delta: float) -> Solution:
        positive = target_probs > 0
        values = [
            np.where(positive, -np.log(np.where(positive, target_probs, 1.0)), 0.0),
            draft_probs,
            (~positive).astype(np.float64),
            float(delta),
        ]
        return _solve(self.compiled, self.h, *_conic_solver(), values)


@functools.cache
def _output_law_problem(vocab_size: int) -> _OutputLawProblem:
    return _OutputLawProblem(vocab_size)


def solve_output_law(target_probs: Array, draft_probs: Array, delta: float) -> Solution:
    """Output-law problem: max Σ min(p, h) s.t. KL(h‖q) <= δ (cvxpy, Clarabel)."""
    target_probs = np.asarray(target_probs, dtype=np.float64)
    return _output_law_problem(target_probs.size).solve(
        target_probs, np.asarray(draft_probs, dtype=np.float64), delta
    )


class _CouplingProblem:
    """max trace(π) over couplings π >= 0 with π 1 = p and πᵀ 1 = h (an LP)."""

    def __init__(self, vocab_size: int) -> None:
        cp = _cp()
        self.coupling = cp.Variable((vocab_size, vocab_size), nonneg=True)
        self.p = cp.Parameter(vocab_size, nonneg=True)
        self.h = cp.Parameter(vocab_size, nonneg=True)
        self.problem = cp.Problem(
            cp.Maximize(cp.trace(self.coupling)),
            [cp.sum(self.coupling, axis=1) == self.p, cp.sum(self.coupling, axis=0) == self.h],
        )
        self.compiled = Compiled(self.problem, [self.p, self.h], *_lp_solver())

    def solve(self, draft_probs: Array, adjusted: Array) -> Solution:
        return _solve(self.compiled, self.coupling, *_lp_solver(), [draft_probs, adjusted])


@functools.cache
def _coupling_problem(vocab_size: int) -> _CouplingProblem:
    return _CouplingProblem(vocab_size)


def solve_coupling(draft_probs: Array, adjusted: Array) -> Solution:
    """Coupling LP: the largest P(emitted = drafted) with drafted ~ p and emitted ~ h.

    ``adjusted`` is rescaled to the draft's total so both marginals have the same mass
    exactly (an LP with marginals that differ by 1e-16 is infeasible).
    """
    draft_probs = np.asarray(draft_probs, dtype=np.float64)
    adjusted = np.asarray(adjusted, dtype=np.float64)
    adjusted = adjusted * (draft_probs.sum() / adjusted.sum())
    return _coupling_problem(draft_probs.size).solve(draft_probs, adjusted)


class _CrossEntropyProblem:
    """maximise h_0 s.t. −Σ h log q <= τ, h in the simplex (an LP; q > 0)."""

    def __init__(self, vocab_size: int) -> None:
        cp = _cp()
        self.h = cp.Variable(vocab_size, nonneg=True)
        self.cost = cp.Parameter(vocab_size, nonneg=True)
        self.budget = cp.Parameter(nonneg=True)
        self.problem = cp.Problem(
            cp.Maximize(self.h[0]),
            [cp.sum(self.h) == 1, self.cost @ self.h <= self.budget],
        )
        self.compiled = Compiled(self.problem, [self.cost, self.budget], *_lp_solver())

    def solve(self, target_probs: Array, budget: float) -> Solution:
        values = [-np.log(target_probs), float(budget)]
        return _solve(self.compiled, self.h, *_lp_solver(), values)


@functools.cache
def _cross_entropy_problem(vocab_size: int) -> _CrossEntropyProblem:
    return _CrossEntropyProblem(vocab_size)


def solve_cross_entropy(target_probs: Array, token: int, budget: float) -> Solution:
    """Prop. 4's problem: max h_n s.t. cross-entropy −Σ h log q <= τ (cvxpy, HiGHS)."""
    target_probs = np.asarray(target_probs, dtype=np.float64)
    order = np.r_[token, np.delete(np.arange(target_probs.size), token)]
    solution = _cross_entropy_problem(target_probs.size).solve(target_probs[order], budget)
    point = np.empty_like(solution.point)
    point[order] = solution.point
    return Solution(solution.value, point, solution.status)
