"""Prop. 4 against cvxpy: TAS (typical acceptance) as a cross-entropy problem. Its
decisions match the problem's feasibility (the LP solved by cvxpy, ``formulations``);
its law differs from generalised SpS run against the problem's optimum.
"""

from __future__ import annotations

import numpy as np

from cactus_theory import law, rules
from cactus_theory.core.rules import baselines
from proofs_check import formulations, instances, reference
from proofs_check.claims import ROUNDING, SOLVER_TOLERANCE, Context, Worst, instance_dict, row

Array = np.ndarray


def cross_entropy_budget(target_probs: Array, epsilon: float, alpha: float) -> Array:
    """τ(q) = max(log(1/ε), H(q) + log(1/α)): the cross-entropy budget TAS implies."""
    return np.maximum(-np.log(epsilon), baselines.entropy(target_probs) - np.log(alpha))


def cross_entropy_raised_mass(target_probs: Array, budget: Array) -> Array:
    """γ_CE[..., n] = min(1, (τ − c_min)/(c_n − c_min)), c = −log q: the LP's optimum.

    max h_n s.t. Σ h c ≤ τ puts h_n = γ_CE and the rest on argmin c = argmax q (n = argmax
    q gives 1). c_n = +inf (q_n = 0) gives 0.
    """
    with np.errstate(divide="ignore"):
        cost = -np.log(target_probs)
    lowest = cost.min(axis=-1, keepdims=True)
    room = budget[..., None] - lowest
    with np.errstate(divide="ignore", invalid="ignore"):
        raised = np.where(cost <= budget[..., None], 1.0, room / (cost - lowest))
    return np.clip(np.where(np.isfinite(cost), raised, 0.0), 0.0, 1.0)


def cross_entropy_targets(target_probs: Array, raised: Array) -> Array:
    """[..., V, V]: h^n = γ_CE,n e_n + (1 − γ_CE,n) e_argmax q."""
    vocab_size = target_probs.shape[-1]
    eye = np.eye(vocab_size)
    peak = eye[np.argmax(target_probs, axis=-1)]  # [..., V]
    return raised[..., None] * eye + (1.0 - raised[..., None]) * peak[..., None, :]


class _Prop4Tally:
    """What the Prop 4 check accumulates over its batches."""

    def __init__(self) -> None:
        self.decisions = Worst()  # TAS's accept decision against CE feasibility of e_n
        self.laws = Worst()  # |law of GSpS against the CE optimum − TAS's law|
        self.lp = Worst()  # |cvxpy LP − closed-form γ_CE|
        self.boundary = 0  # decision mismatches within rounding of the threshold
        self.recovery_mismatch = 0
        self.failures = 0
        self.lp_done = 0


def check_prop4(context: Context) -> dict:
    """TAS vs the cross-entropy problem: equal decisions, different laws."""
    rng = context.rng("prop4")
    total = context.count(2000, 20_000)
    lp_total = context.count(20, 10_000)
    tally = _Prop4Tally()
    with context.bar(total + lp_total, "prop4 (TAS)") as bar:
        for batch in instances.batches(rng, total, (2, 3, 4, 8, 32), chunk=250):
            count = batch.target.shape[0]
            if count % 2:
                epsilon, alpha = 0.09, 0.3  # vLLM's defaults
            else:
                epsilon = float(rng.uniform(0.01, 0.3))
                alpha = float(np.sqrt(epsilon) if rng.random() < 0.5 else rng.uniform(0.05, 1.0))
            solved = _prop4_on_batch(tally, batch, epsilon, alpha)
            bar.update(count)
            _prop4_lp(tally, rng, batch.target, *solved, lp_total, bar)
    return {"rows": _prop4_rows(tally)}


def _prop4_on_batch(tally: _Prop4Tally, batch, epsilon: float, alpha: float):
    """TAS against the cross-entropy problem on a batch: decisions, recovery and laws;
    (budget τ [N], γ_CE [N, V], TAS's accept mask [N, V], near the threshold [N, V])."""
    vocab_size = batch.target.shape[1]
    tas = rules.make("tas", epsilon=epsilon, alpha=alpha)
    target, draft = batch.target, batch.draft
    budget = cross_entropy_budget(target, epsilon, alpha)
    with np.errstate(divide="ignore"):
        cost = -np.log(target)
    feasible = cost <= budget[:, None]  # e_n is feasible for the CE problem
    accepted = tas.accept_mask(target)
    near = np.abs(cost - budget[:, None]) <= ROUNDING * np.maximum(1.0, budget[:, None])
    tally.boundary += int(np.sum(near & (feasible != accepted)))
    wrong = (feasible != accepted) & ~near
    tally.decisions.update(
        wrong.any(axis=-1).astype(float),
        wrong.any(axis=-1),
        vocab_size,
        lambda i, t=target, e=epsilon, a=alpha: instance_dict(t[i], epsilon=e, alpha=a),
    )
    tally.recovery_mismatch += int(
        np.sum(np.argmin(cost, axis=-1) != np.argmax(tas.recovery(target), axis=-1))
    )
    raised = cross_entropy_raised_mass(target, budget)
    ce_law, _ = reference.gsps_law(cross_entropy_targets(target, raised), draft)
    tas_law = law.output_law_rows(tas, target, draft)
    difference = np.abs(ce_law - tas_law).max(axis=-1)
    tally.laws.update(
        difference,
        difference > 1e-9,
        vocab_size,
        lambda i, t=target, d=draft, e=epsilon, a=alpha, c=ce_law, s=tas_law: instance_dict(
            t[i], d[i], epsilon=e, alpha=a, tas_law=s[i], gsps_cross_entropy_law=c[i]
        ),
    )
    return budget, raised, accepted, near


def _prop4_lp(tally: _Prop4Tally, rng, target, budget, raised, accepted, near, lp_total, bar):
    """cvxpy's LP on some rows with q > 0 (the cost −log q must be finite)."""
    vocab_size = target.shape[1]
    for index in np.flatnonzero(np.all(target > 1e-12, axis=-1))[:4]:
        if tally.lp_done >= lp_total or vocab_size > 8:
            break
        token = int(rng.integers(vocab_size))
        try:
            solution = formulations.solve_cross_entropy(target[index], token, float(budget[index]))
        except formulations.SolverError:
            tally.failures += 1
            continue
        tally.lp_done += 1
        closed = float(raised[index, token])
        agree = (solution.value >= 1 - SOLVER_TOLERANCE) == bool(accepted[index, token])
        error = abs(solution.value - closed)
        tally.lp.update(
            [error],
            [error > SOLVER_TOLERANCE or (not agree and not near[index, token])],
            vocab_size,
            lambda _, t=target[index], n=token, s=solution.value, c=closed: instance_dict(
                t, token=n, lp=s, closed_form=c
            ),
        )
        bar.update()


def _prop4_rows(tally: _Prop4Tally) -> list[dict]:
    """The rows prop4 (decision sense) and prop4.gsps (law sense)."""
    decision_row = row(
        "prop4",
        "Prop 4 (decision sense): TAS accepts n iff the point mass e_n is feasible for "
        "max h_n s.t. cross-entropy −Σ h log q ≤ τ(q), τ(q) = max(log 1/ε, H(q) + log 1/α), "
        "and on rejection emits argmax q, the cross-entropy minimiser (LP checked by cvxpy).",
        "paper",
        tally.decisions.holds and tally.lp.holds and tally.recovery_mismatch == 0,
        tally.decisions.count + tally.lp.count,
        {
            "decision mismatches off the boundary": tally.decisions.violations,
            "mismatches within 1e-12 of the threshold": tally.boundary,
            "max |LP − closed-form γ_CE|": tally.lp.value,
            "solver_failures": tally.failures,
        },
        tally.decisions.counterexample or tally.lp.counterexample,
    )
    law_row = row(
        "prop4.gsps",
        "Prop 4 (law sense): running generalised SpS against the cross-entropy optimum "
        "h^n = γ_CE e_n + (1−γ_CE) e_argmax q emits the same law as TAS.",
        "paper",
        tally.laws.holds,
        tally.laws.count,
        {"max |law difference|": tally.laws.value, "instances that differ": tally.laws.violations},
        tally.laws.counterexample,
    )
    return [decision_row, law_row]
