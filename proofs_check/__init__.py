"""proofs_check: exact verdicts on every claim about constrained-acceptance speculative sampling.

cvxpy solves the constrained problems exactly on small vocabularies; the fast code in
cactus_theory (closed forms, roots, the frontier solver, exact laws) is held against those
solutions and against independent numpy references; scipy searches for worst cases.

>>> import proofs_check
>>> result = proofs_check.run(quick=True, progress=False)      # doctest: +SKIP
>>> print(proofs_check.to_markdown(result))                    # doctest: +SKIP

Importing this package is cheap: numpy, scipy and cvxpy load only when a check runs.
Modules: ``formulations`` (cvxpy problems), ``instances`` (families), ``reference``
(independent numpy references), ``search`` (worst-case search), ``overshoot`` (the closed
form's overshoot and Cor. 6, derived), ``claims`` and ``checks_*`` (the verdicts),
``runner`` (caching, progress), ``report`` (table, JSON, markdown), ``cli`` and ``bench``.
"""

from __future__ import annotations

__all__ = ["run", "to_markdown"]


def run(
    quick: bool = True,
    seed: int = 0,
    progress: bool = True,
    cache_dir: str | None = None,
    only: tuple[str, ...] | None = None,
) -> dict:
    """Every claim's verdict and the measured curves, as a JSON-serialisable dict.

    ``{"claims": [{"id", "statement", "owner", "verdict", "instances", "worst_case",
    "counterexample"}, ...], "curves": {"gamma": {...}, "branch_overshoot": {...}},
    "mode", "seed", "fingerprint", "guarantees_hold"}``.

    ``curves["gamma"]``: ``delta`` (list), ``rules`` ({"cactus", "cactus-exact", "frontier"}:
    measured sup of KL(emitted‖q) per δ, over ``vocab_sizes``), ``by_vocab`` ({"V": {rule:
    [...]}}), ``construction`` ({"V": {rule: [...]}}: the closed-form lower bound
    log(1/(M a)) ≈ √(2(V−2)δ)) and ``unbounded_family`` (the same at V up to 1001).
    ``curves["branch_overshoot"]``: ``delta``, ``measured`` and ``analytic`` (sup over q_n of
    KL(h‖q)/δ for the paper's closed form, = log(1+2δ)/δ), ``argmax_target_mass``,
    ``delta_critical``.
    ``quick`` runs small instance counts (tens of seconds); the full run has at least 10⁴
    instances per claim and caches finished checks under ``cache_dir`` (default
    ``$CACTUS_CACHE`` or ``~/.cache/cactus-theory``) so an interrupted run resumes.
    ``only`` restricts the run to the named checks (``proofs_check.claims.checks()``).
    """
    from proofs_check import runner

    return runner.run(quick=quick, seed=seed, progress=progress, cache_dir=cache_dir, only=only)


def to_markdown(result: dict) -> str:
    """The claims table, the overshoot formula with its derivation, and the Γ(δ) summary."""
    from proofs_check import report

    return report.to_markdown(result)
