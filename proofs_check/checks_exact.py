"""Checks against cvxpy: the coupling LP, the per-branch problems, the frontier (Prop. 4
is in ``checks_prop4``).

Each instance is solved by cvxpy (``formulations``) and by the fast code in cactus_theory,
and, where a scalar problem is involved, by plain bisection (``reference``). A solve that
cvxpy cannot finish is counted in ``solver_failures`` and left out of the verdict.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cactus_theory import divergences, rules
from cactus_theory.core import gamma
from proofs_check import formulations, instances, reference
from proofs_check.claims import (
    ROUNDING,
    SOLVER_TOLERANCE,
    Context,
    Worst,
    budget_tolerance,
    instance_dict,
    row,
)

Array = np.ndarray

BRANCH_DIVERGENCES = formulations.BRANCH_DIVERGENCES
#: Vocabulary sizes for cvxpy instances (small: the point is exactness, not scale).
EXACT_VOCABS_QUICK = (3, 5)
EXACT_VOCABS_FULL = (2, 3, 4, 6, 8)

#: Strictly convex f: the per-branch optimum is unique (TV's is not).
STRICTLY_CONVEX = ("kl", "reverse-kl", "chi2", "hellinger", "js")

DIVERGENCE_TEXT = {
    "kl": "KL",
    "reverse-kl": "reverse KL",
    "chi2": "Pearson χ²",
    "hellinger": "squared Hellinger",
    "tv": "TV",
    "js": "Jensen–Shannon",
}


def _vocabs(context: Context) -> tuple[int, ...]:
    return EXACT_VOCABS_QUICK if context.quick else EXACT_VOCABS_FULL


#: Smallest budget given to cvxpy. Its feasibility tolerance (~1e-9 in the budget) moves γ
#: by about 1e-9 · dγ/dδ ~ 1e-9 √(q_n/(2δ)), under 1e-7 for δ >= 1e-4; smaller budgets are
#: covered against bisection (``ours.gamma.*`` rows at δ, ``ours.cactus-exact.branch``).
CVXPY_SMALLEST_DELTA = 1e-4


def _instances(context: Context, name: str, total: int):
    """(rng, batches) of small instances for cvxpy (one δ per chunk of 16)."""
    rng = context.rng(name)
    stream = instances.batches(
        rng,
        total,
        _vocabs(context),
        chunk=16,
        one_delta=True,
        smallest_delta=CVXPY_SMALLEST_DELTA,
    )
    return rng, stream


# --- Thm 1, optimality: the coupling LP -----------------------------------------------------


def check_thm1_coupling(context: Context) -> dict:
    """max over couplings of P(emitted = drafted) equals Σ min(p, h) = 1 − TV(p, h)."""
    total = context.count(30, 10_000)
    rng, stream = _instances(context, "thm1-coupling", total)
    gap = Worst()
    coupling_error = 0.0
    failures = 0
    with context.bar(total, "thm1 coupling LP") as bar:
        for batch in stream:
            adjusted_rows = instances.sample("dirichlet-1", rng, len(batch), batch.target.shape[1])
            for index in range(len(batch)):
                draft = batch.draft[index]
                # Half the targets are the rules' own h (sps: q), half arbitrary.
                adjusted = batch.target[index] if index % 2 else adjusted_rows.target[index]
                overlap = float(np.minimum(draft, adjusted).sum())
                tv_form = 1.0 - float(divergences.tv_rows(draft, adjusted))
                # The generalised-SpS coupling attains it: marginals (p, h), diagonal Σ min.
                plan = _gsps_coupling(adjusted, draft)
                coupling_error = max(
                    coupling_error,
                    float(np.abs(plan.sum(axis=1) - draft).max()),
                    float(np.abs(plan.sum(axis=0) - adjusted).max()),
                    abs(float(np.trace(plan)) - overlap),
                    abs(overlap - tv_form),
                )
                try:
                    solution = formulations.solve_coupling(draft, adjusted)
                except formulations.SolverError:
                    failures += 1
                    continue
                error = abs(solution.value - overlap)
                gap.update(
                    [error],
                    [error > SOLVER_TOLERANCE],
                    draft.size,
                    lambda _, d=draft, h=adjusted, v=solution.value: instance_dict(
                        h, d, lp_value=v, overlap=float(np.minimum(d, h).sum())
                    ),
                )
                bar.update()
    holds = gap.holds and coupling_error <= ROUNDING
    return {
        "rows": [
            row(
                "thm1.optimal",
                "Thm 1 (optimality): over all couplings of drafted ~ p and emitted ~ h, "
                "P(emitted = drafted) is at most Σ min(p, h) = 1 − TV(p, h), and generalised "
                "SpS attains it (coupling LP solved by HiGHS).",
                "paper",
                holds,
                gap.count,
                {
                    "max |LP − Σ min(p,h)|": gap.value,
                    "gsps coupling error": coupling_error,
                    "solver_failures": failures,
                },
                gap.counterexample,
            )
        ]
    }


def _gsps_coupling(adjusted: Array, draft: Array) -> Array:
    """π[n, x] = p_n (a_n 1{x = n} + (1 − a_n) r_x) for generalised SpS against h."""
    with np.errstate(divide="ignore", invalid="ignore"):
        accept = np.where(draft > 0, np.minimum(1.0, adjusted / draft), 0.0)
    excess = np.maximum(adjusted - draft, 0.0)
    residual = excess / excess.sum() if excess.sum() > 0 else adjusted
    return np.diag(draft * accept) + np.outer(draft * (1.0 - accept), residual)


# --- Thm 2 and our γ* solvers: the per-branch problem ----------------------------------------


def branch_check(divergence: str) -> Callable[[Context], dict]:
    """The check for one divergence: rows thm2.<divergence> and ours.gamma.<divergence>."""

    def check(context: Context) -> dict:
        return _check_branch(context, divergence)

    check.__name__ = f"check_branch_{divergence.replace('-', '_')}"
    return check


def _renormalised(point: Array, support: Array | None = None) -> Array:
    """A solver's point clipped at 0 (and to ``support``) and rescaled onto the simplex."""
    point = np.maximum(point, 0.0)
    if support is not None:
        point = np.where(support, point, 0.0)
    return point / point.sum()


#: How much a solver's point may beat our solution at the divergence it actually spends.
CERTIFICATE_SLACK = 1e-9

COMPARISON = (
    "Each cvxpy point is held against the exact solution at the divergence that point "
    "actually spends (its own rounding of the budget): it may not beat it by more than "
    f"{CERTIFICATE_SLACK:g}, and, unless cvxpy flags it optimal_inaccurate (Clarabel's "
    f"reduced tolerances), it must come within {SOLVER_TOLERANCE:g} of it."
)


class _BranchTally:
    """What the per-branch check of one divergence accumulates over its batches."""

    def __init__(self) -> None:
        self.reduction = Worst()  # |cvxpy h_n − bisection γ*(spent)|
        self.certificate = Worst()  # cvxpy h_n − bisection γ*(spent)
        self.exactness = Worst()  # |our γ*(δ) − bisection γ*(δ)|
        self.excess = Worst()  # (D(structured h‖q) − δ)/tolerance on full rows
        self.raw = 0.0  # |our γ*(δ) − cvxpy's optimal value| (info: cvxpy's budget rounding)
        self.structure = 0.0  # |cvxpy argmax − structured h| (info: argmax accuracy)
        self.failures = 0
        self.over_budget = 0
        self.inaccurate = 0


class _Chunk:
    """One chunk of the per-branch check: its rows, drafted tokens and budget, cvxpy's
    solutions (``_cvxpy_branches``) and the divergence each cvxpy point spends."""

    def __init__(self, batch, tokens: Array, delta: float, found, divergence: str) -> None:
        self.batch, self.tokens, self.delta, self.found = batch, tokens, delta, found
        self.q_n = batch.target[np.arange(batch.target.shape[0]), tokens]
        self.spent = None
        if found is not None:
            solved, _, _, points = found
            with np.errstate(divide="ignore", invalid="ignore"):
                spent = divergences.rows(divergence, points, batch.target[solved])
            self.spent = np.maximum(spent, 0.0)


def _bisected(parts: list[tuple[Array, Array]], divergence: str) -> list[Array]:
    """``reference.bisect_raised_mass`` of every (q_n, δ) part, in one call over all of
    them (each entry is bisected on its own: the same numbers as part by part)."""
    if not parts:
        return []
    masses = np.concatenate([mass for mass, _ in parts])
    budgets = np.concatenate([np.broadcast_to(budget, mass.shape) for mass, budget in parts])
    found = reference.bisect_raised_mass(masses, budgets, divergence)
    return np.split(found, np.cumsum([mass.size for mass, _ in parts])[:-1])


def _tally_ours(tally: _BranchTally, chunk: _Chunk, exact: Array, divergence: str) -> Array:
    """Our γ* against bisection (``exact``), and our branch h within δ on full rows;
    returns our γ* [N] for the cvxpy comparison."""
    batch, tokens, delta, q_n = chunk.batch, chunk.tokens, chunk.delta, chunk.q_n
    vocab_size = batch.target.shape[1]
    rule = rules.make("cactus-exact", delta=delta, divergence=divergence)
    ours = rule.raised_mass(q_n)
    error = np.abs(ours - exact)
    tally.exactness.update(
        error,
        error > ROUNDING,
        vocab_size,
        lambda i, t=batch.target, n=tokens, o=ours, e=exact, dl=delta: instance_dict(
            t[i], token=n[i], delta=dl, ours=o[i], bisection=e[i]
        ),
    )
    adjusted = rule.targets_for(batch.target, batch.draft, tokens)
    value = divergences.rows(divergence, adjusted, batch.target)
    over = (value - delta) / budget_tolerance(delta)
    tally.excess.update(
        over,
        over > 1.0,
        vocab_size,
        lambda i, t=batch.target, n=tokens, v=value, dl=delta: instance_dict(
            t[i], token=n[i], delta=dl, divergence_value=v[i]
        ),
    )
    return ours


def _cvxpy_branches(tally: _BranchTally, batch, tokens: Array, delta: float, divergence, bar):
    """cvxpy's per-branch optimum of every row: (solved rows, optimal flags, values [S],
    points [S, V] renormalised), or None when no row was solved."""
    solved, values, points, accurate = [], [], [], []
    for index in range(batch.target.shape[0]):
        try:
            solution = formulations.solve_branch(
                batch.target[index], int(tokens[index]), delta, divergence
            )
        except formulations.SolverError:
            tally.failures += 1
            continue
        solved.append(index)
        accurate.append(solution.status == "optimal")
        values.append(solution.value)
        support = batch.target[index] > 0 if divergence in ("kl", "chi2") else None
        points.append(_renormalised(solution.point, support))
        bar.update()
    if not solved:
        return None
    return np.array(solved), np.array(accurate), np.array(values), np.stack(points)


def _tally_cvxpy(
    tally: _BranchTally, chunk: _Chunk, divergence: str, ours: Array, exact: Array, best: Array
) -> None:
    """Each cvxpy point against the exact γ* at the divergence it spends (``best``, by
    bisection; ``COMPARISON``)."""
    solved, accurate, values, points = chunk.found
    batch, tokens, delta = chunk.batch, chunk.tokens, chunk.delta
    q_n, spent = chunk.q_n, chunk.spent
    vocab_size = batch.target.shape[1]
    tally.inaccurate += int(np.sum(~accurate))
    target = batch.target[solved]
    tally.over_budget += int(np.sum(spent > delta * (1 + CERTIFICATE_SLACK) + 1e-15))
    raised = points[np.arange(solved.size), tokens[solved]]
    tally.raw = max(tally.raw, float(np.max(np.abs(ours[solved] - values))))

    def describe(i, t=target, n=tokens[solved], v=values, u=spent, b=best, dl=delta):
        return instance_dict(
            t[i], token=n[i], delta=dl, cvxpy=v[i], cvxpy_spent=u[i], exact_at_spent=b[i]
        )

    tally.certificate.update(raised - best, raised - best > CERTIFICATE_SLACK, vocab_size, describe)
    gap = np.where(accurate, np.abs(raised - best), np.nan)
    tally.reduction.update(gap, gap > SOLVER_TOLERANCE, vocab_size, describe)
    if divergence in STRICTLY_CONVEX:
        # Compared only where the optimum is unique and the objective can tell it
        # apart: 0 < q_n < 1 and a lift γ* − q_n above cvxpy's tolerance.
        lift = exact[solved] - q_n[solved]
        inside = (q_n[solved] > 0.0) & (q_n[solved] < 1.0) & (lift > SOLVER_TOLERANCE)
        shaped = reference.structured_targets(target, tokens[solved], values)
        # Structured h at the cvxpy optimum against cvxpy's own argmax (info only).
        if np.any(inside):
            tally.structure = max(tally.structure, float(np.abs(shaped - points)[inside].max()))


def _check_branch(context: Context, divergence: str) -> dict:
    """Thm 2 and our γ* against cvxpy's per-branch optimum (see ``COMPARISON``). cvxpy
    solves chunk by chunk; the bisections of every chunk then run in two calls
    (``_bisected``) and the tallies take the chunks in order."""
    total = context.count(25, 10_000)
    rng, stream = _instances(context, f"branch-{divergence}", total)
    tally = _BranchTally()
    chunks = []
    with context.bar(total, f"per-branch {divergence}") as bar:
        for batch in stream:
            delta = float(batch.delta[0])
            tokens = rng.integers(batch.target.shape[1], size=batch.target.shape[0])
            tokens[::4] = 0  # the adversarial family places its special mass at index 0
            found = _cvxpy_branches(tally, batch, tokens, delta, divergence, bar)
            chunks.append(_Chunk(batch, tokens, delta, found, divergence))
    exact = _bisected([(chunk.q_n, np.asarray(chunk.delta)) for chunk in chunks], divergence)
    solved = [chunk for chunk in chunks if chunk.found is not None]
    best = iter(_bisected([(c.q_n[c.found[0]], c.spent) for c in solved], divergence))
    for chunk, exact_n in zip(chunks, exact, strict=True):
        ours = _tally_ours(tally, chunk, exact_n, divergence)
        if chunk.found is not None:
            _tally_cvxpy(tally, chunk, divergence, ours, exact_n, next(best))
    return {"rows": _branch_rows(tally, divergence)}


def _branch_rows(tally: _BranchTally, divergence: str) -> list[dict]:
    """The rows thm2.<divergence> and ours.gamma.<divergence> from the tally."""
    reduction, certificate, exactness, excess = (
        tally.reduction,
        tally.certificate,
        tally.exactness,
        tally.excess,
    )
    text = DIVERGENCE_TEXT[divergence]
    unique = "unique" if divergence in STRICTLY_CONVEX else "not unique: TV is not strictly convex"
    common = {
        "max cvxpy-point advantage": certificate.value,
        "cvxpy points over budget": tally.over_budget,
        "optimal_inaccurate (certificate only)": tally.inaccurate,
        "solver_failures": tally.failures,
    }
    thm2 = row(
        f"thm2.{divergence}",
        f"Thm 2 ({text}): max h_n s.t. D(h‖q) ≤ δ is solved by raising n to γ* — the largest γ "
        "with D((γ,1−γ)‖(q_n,1−q_n)) ≤ δ — and scaling the rest of q by (1−γ*)/(1−q_n) "
        f"(cvxpy with δ ≥ {CVXPY_SMALLEST_DELTA:g} vs bisection of the scalar problem; "
        f"optimiser {unique}).",
        "paper",
        reduction.holds and certificate.holds and excess.holds,
        reduction.count,
        {
            "max |cvxpy − scalar γ*|": reduction.value,
            "max |cvxpy argmax − structured h|": tally.structure,
            **common,
        },
        reduction.counterexample or certificate.counterexample or excess.counterexample,
    )
    solved_by = "closed form" if divergence in gamma.CLOSED_FORM else "feasible-side root"
    ours_row = row(
        f"ours.gamma.{divergence}",
        f"cactus-exact (divergence={divergence}) computes γ* by its {solved_by}: it equals "
        f"plain bisection within {ROUNDING:g}, matches cvxpy within {SOLVER_TOLERANCE:g} "
        f"(δ ≥ {CVXPY_SMALLEST_DELTA:g}), no "
        "cvxpy point beats it at its own divergence, and its branch h has D(h‖q) ≤ δ on "
        "full rows.",
        "ours",
        exactness.holds and reduction.holds and certificate.holds and excess.holds,
        exactness.count,
        {
            "max |ours − bisection|": exactness.value,
            "max |cvxpy − γ*| at cvxpy's spent divergence": reduction.value,
            "max |ours − cvxpy value| at δ": tally.raw,
            "max (D − δ)/tolerance": excess.value,
            **common,
        },
        exactness.counterexample
        or reduction.counterexample
        or certificate.counterexample
        or excess.counterexample,
    )
    return [thm2, ours_row]


# --- our frontier against the output-law problem -------------------------------------------


class _FrontierTally:
    """What the frontier-optimality check accumulates over its instances."""

    def __init__(self) -> None:
        self.gap = Worst()  # |cvxpy's acceptance − frontier's at the KL cvxpy spends|
        self.certificate = Worst()  # cvxpy's acceptance − frontier's at that KL
        self.budget = Worst()  # (KL(h_frontier‖q) − δ)/tolerance
        self.raw = 0.0  # |Δacceptance| at δ (info: cvxpy's own budget rounding)
        self.failures = 0
        self.over_budget = 0
        self.inaccurate = 0


def check_frontier_optimal(context: Context) -> dict:
    """frontier's acceptance equals cvxpy's max Σ min(p, h) s.t. KL(h‖q) ≤ δ (see COMPARISON)."""
    total = context.count(25, 10_000)
    _, stream = _instances(context, "frontier-optimal", total)
    tally = _FrontierTally()
    with context.bar(total, "frontier vs cvxpy") as bar:
        for batch in stream:
            vocab_size = batch.target.shape[1]
            for index in range(len(batch)):
                target, draft = batch.target[index], batch.draft[index]
                delta = float(batch.delta[index])
                if _frontier_against_cvxpy(tally, target, draft, delta, vocab_size):
                    bar.update()
    return {
        "rows": [
            row(
                "ours.frontier.optimal",
                "frontier has the largest acceptance of any rule whose emitted law is within δ: "
                "Σ min(p, h_frontier) equals cvxpy's max Σ min(p, h) s.t. KL(h‖q) ≤ δ "
                f"(within {SOLVER_TOLERANCE:g} at the KL cvxpy's point spends; δ ≥ "
                f"{CVXPY_SMALLEST_DELTA:g}), and no cvxpy "
                "point beats frontier at that KL.",
                "ours",
                tally.gap.holds and tally.certificate.holds and tally.budget.holds,
                tally.certificate.count,
                {
                    "max |Δacceptance|": tally.gap.value,
                    "max |Δacceptance| at δ (cvxpy's own value)": tally.raw,
                    "max cvxpy-point advantage": tally.certificate.value,
                    "max (KL − δ)/tolerance": tally.budget.value,
                    "cvxpy points over budget": tally.over_budget,
                    "optimal_inaccurate (certificate only)": tally.inaccurate,
                    "solver_failures": tally.failures,
                },
                tally.gap.counterexample
                or tally.certificate.counterexample
                or tally.budget.counterexample,
            )
        ]
    }


def _frontier_against_cvxpy(
    tally: _FrontierTally, target: Array, draft: Array, delta: float, vocab_size: int
) -> bool:
    """frontier within δ, and against cvxpy's optimum at the KL cvxpy's point spends
    (``COMPARISON``); False when cvxpy failed."""
    adjusted = rules.make("frontier", delta=delta).target_law(target, draft)
    acceptance = float(np.minimum(draft, adjusted).sum())
    kl = float(divergences.kl_rows(adjusted, target))
    over = kl - delta
    tally.budget.update(
        [over / float(budget_tolerance(delta))],
        [over > budget_tolerance(delta)],
        vocab_size,
        lambda _, t=target, d=draft, dl=delta, k=kl: instance_dict(t, d, delta=dl, kl=k),
    )
    try:
        solution = formulations.solve_output_law(target, draft, delta)
    except formulations.SolverError:
        tally.failures += 1
        return False
    tally.raw = max(tally.raw, abs(acceptance - solution.value))
    accurate = solution.status == "optimal"
    tally.inaccurate += int(not accurate)
    point = _renormalised(solution.point, target > 0)
    spent = max(0.0, float(divergences.kl_rows(point, target)))
    tally.over_budget += int(spent > delta * (1 + CERTIFICATE_SLACK) + 1e-15)
    best = rules.make("frontier", delta=spent).target_law(target, draft)
    reached = float(np.minimum(draft, point).sum())
    optimum = float(np.minimum(draft, best).sum())

    def describe(_, t=target, d=draft, dl=delta, s=solution, u=spent, o=optimum):
        return instance_dict(t, d, delta=dl, cvxpy=s.value, cvxpy_spent=u, frontier_at_spent=o)

    advantage = reached - optimum
    tally.certificate.update([advantage], [advantage > CERTIFICATE_SLACK], vocab_size, describe)
    error = abs(advantage) if accurate else np.nan
    tally.gap.update([error], [error > SOLVER_TOLERANCE], vocab_size, describe)
    return True
