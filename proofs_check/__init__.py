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
    quick: bool = True, seed: int = 0, progress: bool = True, cache_dir: str | None = None
) -> dict:
    """Every claim's verdict and the measured curves, as a JSON-serialisable dict.

    ``{"claims": [{"id", "statement", "owner", "verdict", "instances", "worst_case",
    "counterexample"}, ...], "curves": {"gamma": {...}, "branch_overshoot": {...}}, ...}``.
    ``quick`` runs small instance counts (tens of seconds); the full run has at least 10⁴
    instances per claim and caches finished checks under ``cache_dir`` (default
    ``$CACTUS_CACHE`` or ``~/.cache/cactus-theory``) so an interrupted run resumes.
    """
    from proofs_check import runner

    return runner.run(quick=quick, seed=seed, progress=progress, cache_dir=cache_dir)


def to_markdown(result: dict) -> str:
    """The claims table, the overshoot formula with its derivation, and the Γ(δ) summary."""
    from proofs_check import report

    return report.to_markdown(result)
