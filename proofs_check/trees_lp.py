"""Multi-draft verification in cvxpy: the coupling LP for α* and the constrained frontier.

For a node with drafted tuples x (probability P(x), enumerated by ``trees.tuple_law``) a
verifier is a coupling π(x, y) >= 0 of the tuples and the emitted token, Σ_y π(x, y) =
P(x); it emits e(y) = Σ_x π(x, y) and accepts Σ_{x, y ∈ x} π(x, y).

1. ``optimal_acceptance_lp``: max acceptance with e = q (lossless): α* (an LP, HiGHS).
2. ``frontier_lp``: max acceptance with KL(e ‖ q) <= δ (exponential cone, Clarabel) or
   TV(e, q) <= δ (an LP): α*_{K,δ}, the constrained frontier.

Only the pairs (x, y ∈ x) can accept, so π splits into an accepted part on those pairs and
a free remainder per tuple: the variables are a(x, y) for y ∈ x and a law for the rest,
which keeps the problems small (V <= 6, K <= 3: at most 216 tuples). The numpy core calls
``optimal_acceptance_lp`` by name (``trees.optimal_acceptance(node, method="lp")``); it is
here because cvxpy is.
"""

from __future__ import annotations

import numpy as np

from cactus_theory.core import divergences
from cactus_theory.core.trees import Node, tuple_law
from proofs_check.formulations import CONIC_OPTIONS, SolverError, _cp, _solve

Array = np.ndarray

#: The LP's largest instances (tuples are enumerated).
MAX_VOCAB, MAX_WIDTH = 8, 4
#: HiGHS (through scipy) at feasibility tolerances of 1e-10: at its default 1e-7 a node with
#: masses near 1e-8 reads α* = 1 where it is 1 − 4e-8.
TIGHT_LP = (
    "SCIPY",
    {
        "scipy_options": {
            "method": "highs",
            "presolve": False,
            "primal_feasibility_tolerance": 1e-10,
            "dual_feasibility_tolerance": 1e-10,
        }
    },
)


def _coupling(node: Node):
    """(cvxpy problem pieces): accepted mass per (tuple, drafted token) pair, the rest per
    (tuple, token), the emitted law and the acceptance expression."""
    cp = _cp()
    if node.vocab_size > MAX_VOCAB or node.k > MAX_WIDTH:
        raise ValueError(
            f"node: the coupling LP takes V <= {MAX_VOCAB}, K <= {MAX_WIDTH} "
            f"(got V = {node.vocab_size}, K = {node.k})"
        )
    tuples, chance = tuple_law(node)
    vocab = node.vocab_size
    member = np.zeros((tuples.shape[0], vocab))
    member[np.arange(tuples.shape[0])[:, None], tuples] = 1.0
    accepted = cp.Variable((tuples.shape[0], vocab), nonneg=True)
    rest = cp.Variable((tuples.shape[0], vocab), nonneg=True)
    constraints = [
        cp.sum(accepted + rest, axis=1) == chance,
        cp.multiply(accepted, 1.0 - member) == 0,
    ]
    emitted = cp.sum(accepted + rest, axis=0)
    return accepted, emitted, constraints, cp.sum(accepted)


def optimal_acceptance_lp(node: Node) -> float:
    """α*: the largest acceptance of a coupling whose emitted law is q (an LP)."""
    cp = _cp()
    accepted, emitted, constraints, acceptance = _coupling(node)
    problem = cp.Problem(cp.Maximize(acceptance), [*constraints, emitted == node.target])
    solver, options = TIGHT_LP
    return _solve(problem, accepted, solver, dict(options)).value


def frontier_lp(node: Node, delta: float, divergence: str = "kl") -> tuple[float, Array]:
    """(α*_{K,δ}, the emitted law e): the largest acceptance of a coupling with
    KL(e ‖ q) <= δ (``divergence="kl"``, Clarabel) or TV(e, q) <= δ (``"tv"``, HiGHS).
    Tokens with q = 0 receive nothing under KL (it would be infinite). The solution is
    checked (e a law, its divergence within δ, to ``FEASIBILITY``); KL tries the budget in
    the ratio e/q first, then in e itself; a solution failing both is a ``SolverError``."""
    if divergence not in ("kl", "tv"):
        raise ValueError(f"divergence: the frontier LP takes 'kl' or 'tv', got {divergence!r}")
    forms = ("ratio", "direct") if divergence == "kl" else ("tv",)
    failures = []
    for form in forms:
        try:
            value, emitted = _frontier(node, delta, form)
        except SolverError as error:
            failures.append(str(error))
            continue
        spent = float(divergences.rows(divergence, emitted / emitted.sum(), node.target))
        if abs(emitted.sum() - 1.0) <= FEASIBILITY and spent <= delta + FEASIBILITY:
            return value, emitted
        failures.append(f"{form}: infeasible answer (Σe = {emitted.sum():.9g}, D = {spent:.9g})")
    raise SolverError("frontier LP: " + "; ".join(failures))


#: How far a solver's emitted law may be from a law within δ and still be read.
FEASIBILITY = 1e-6


def _frontier(node: Node, delta: float, form: str) -> tuple[float, Array]:
    cp = _cp()
    accepted, emitted, constraints, acceptance = _coupling(node)
    target = node.target
    support = target > 0
    if form == "ratio":  # KL(e‖q) = Σ q kl_div(e/q, 1): the ratio stays O(1)
        ratio = cp.Variable(int(support.sum()), nonneg=True)
        budget = [
            emitted[np.flatnonzero(support)] == cp.multiply(target[support], ratio),
            target[support] @ cp.kl_div(ratio, 1) <= delta,
        ]
    elif form == "direct":
        budget = [cp.sum(cp.kl_div(emitted[np.flatnonzero(support)], target[support])) <= delta]
    else:
        budget = [0.5 * cp.sum(cp.abs(emitted - target)) <= delta]
    if form != "tv" and not support.all():
        budget.append(emitted[np.flatnonzero(~support)] == 0)
    solver, options = ("CLARABEL", dict(CONIC_OPTIONS)) if form != "tv" else TIGHT_LP
    problem = cp.Problem(cp.Maximize(acceptance), [*constraints, *budget])
    solution = _solve(problem, accepted, solver, dict(options))
    if emitted.value is None:
        raise SolverError(f"{solver}: no emitted law")
    law = np.maximum(np.asarray(emitted.value, dtype=np.float64), 0.0)
    if form != "tv":
        law = np.where(support, law, 0.0)  # constrained to 0 there; solver noise removed
    return solution.value, law
