"""What a rule's own methods must return, checked on every call, in one place.

=================  ===========================================================  ===========
method             must return (q = target, p = draft, n = drafted token)        checked by
=================  ===========================================================  ===========
``accept_probs``   a_n in [0, 1], finite                                         acceptances
``raised_mass``    γ_n in [0, 1], finite (branch rules; ``raised_masses`` too)   acceptances
``residuals_for``  laws r^n: finite, >= 0, summing to 1                          laws
``target_law``     the law h (target rules)                                      laws
``recovery``       the law emitted on rejection (decision rules)                 laws
``targets_for``    the law h^n                                                   laws
=================  ===========================================================  ===========

Every ``Rule`` subclass that defines one of these methods (built-in or a user's) has it
wrapped at class creation (``install``, from ``Rule.__init_subclass__``; the families'
derived methods, correct by construction from the checked ones, are not), so every caller
gets the check: the exact laws (``law.output_law``, ``acceptance``, ``emitted_divergence``,
``output_law_enumerated``, ...), the per-token API (``rule.accept_prob``,
``rule.residual``), the numpy verify step and the torch sampler's generic adapter. A value
that breaks the contract is a ``ValueError`` naming the rule (its spec) and the method,
never a clipped or renormalised number. The check is two reductions over what the method
just computed (a min and a max, or a min and the row sums), a small fraction of its cost.

Tolerances (float rounding of correct formulas passes):

- an acceptance or a γ may lie ``ACCEPT_ATOL`` (1e-9) outside [0, 1]; it is returned
  clipped to [0, 1];
- a law's rows may sum to 1 within ``law_tolerance(dtype)``: ``LAW_RTOL`` (1e-9) for
  float64, √ε of the dtype for lower precision (float32: 3.5e-4); entries may be down to
  minus that tolerance. Laws are returned as they are: ``law.general_rule_law`` divides
  each residual by its sum and the torch sampler draws by inverse CDF scaled to the row's
  total, so a row within tolerance emits the law it is a rounding of.

``culprit(error)`` finds the rule method an exception came from (for one-line errors).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from cactus_theory.core.arrays import is_numpy, namespace

#: How far outside [0, 1] an acceptance (or γ) may lie from rounding; it is then clipped.
ACCEPT_ATOL = 1e-9
#: |Σ law − 1| allowed on a float64 law (lower precision: √ε of its dtype).
LAW_RTOL = 1e-9


def law_tolerance(dtype: Any, xp: Any = None) -> float:
    """The allowed |Σ − 1| (and negative entry) of a law in ``dtype``: ``LAW_RTOL`` for
    float64 (and non-float dtypes), √ε for lower-precision floats. ``xp``: the array
    namespace the dtype belongs to (numpy when None; a torch dtype needs torch's)."""
    try:
        eps = float((xp or namespace(np.zeros(0))).finfo(dtype).eps)
    except (TypeError, ValueError):
        return LAW_RTOL
    return max(LAW_RTOL, math.sqrt(eps)) if eps > np.finfo(np.float64).eps else LAW_RTOL


def who(rule: Any) -> str:
    """The rule as a spec (``'cactus:delta=0.5'``), for messages."""
    from cactus_theory.core.rules.registry import spec_of

    try:
        return repr(spec_of(rule))
    except Exception:  # params() itself broken: the name is still worth saying
        return repr(getattr(rule, "name", type(rule).__name__))


def _array(values: Any) -> Any:
    """A method's result as an array (numpy, or the tensor it is)."""
    if is_numpy(values) or hasattr(values, "__array_namespace__") or hasattr(values, "dtype"):
        return values
    return np.asarray(values, dtype=np.float64)


def check_acceptances(rule: Any, method: str, values: Any) -> Any:
    """``values`` (probabilities: a_n or γ_n) in [0, 1] within ``ACCEPT_ATOL``, returned
    clipped to [0, 1]; else ValueError naming ``rule`` and ``method``."""
    values = _array(values)
    if math.prod(values.shape) == 0:
        return values
    xp = namespace(values)
    low, high = float(xp.min(values)), float(xp.max(values))
    if low >= -ACCEPT_ATOL and high <= 1.0 + ACCEPT_ATOL:
        if low >= 0.0 and high <= 1.0:
            return values
        return xp.clip(values, 0.0, 1.0)
    if math.isnan(low) or math.isnan(high):
        found = "NaN"
    else:
        found = f"{high:.12g}" if high > 1.0 + ACCEPT_ATOL else f"{low:.12g}"
    raise ValueError(
        f"rule {who(rule)}: {method} returned {found}, outside [0, 1] (a probability; "
        f"tolerance {ACCEPT_ATOL:g})"
    )


def check_laws(rule: Any, method: str, values: Any) -> Any:
    """Every row [..., V] of ``values`` a law (finite, >= −tol, |Σ − 1| <= tol, tol =
    ``law_tolerance``), returned as it is; else ValueError naming ``rule`` and ``method``."""
    values = _array(values)
    if math.prod(values.shape) == 0:
        return values
    xp = namespace(values)
    tolerance = law_tolerance(values.dtype, xp)
    with np.errstate(invalid="ignore"):  # inf − inf: reported below as NaN or inf
        sums = xp.sum(values, axis=-1)
        off = xp.abs(sums - 1.0)
    low, worst = float(xp.min(values)), float(xp.max(off))
    if low >= -tolerance and worst <= tolerance:
        return values
    if not (math.isfinite(low) and math.isfinite(worst)):
        found = "NaN or inf entries"
    elif low < -tolerance:
        found = f"a negative entry {low:.6g}"
    else:
        index = int(xp.argmax(xp.reshape(off, (-1,))))
        found = f"a row that sums to {float(xp.reshape(sums, (-1,))[index]):.12g}"
    raise ValueError(
        f"rule {who(rule)}: {method} returned {found}; it must return a law (finite, "
        f">= 0, each row summing to 1 within {tolerance:g})"
    )


#: The methods a rule defines, and what checks what they return.
CONTRACT: dict[str, Callable[[Any, str, Any], Any]] = {
    "accept_probs": check_acceptances,
    "raised_mass": check_acceptances,
    "raised_masses": check_acceptances,
    "residuals_for": check_laws,
    "target_law": check_laws,
    "recovery": check_laws,
    "targets_for": check_laws,
}


#: The family classes' own methods derive from the ones a rule defines (a_n = min(1, h_n/p_n)
#: from a checked h or γ, r = (h − p)_+ / Σ from a checked h, ...): correct by construction,
#: so they run unwrapped and a value is checked once, where the rule produced it.
DERIVED_IN = "cactus_theory.core.rules.base"


def install(cls: type) -> None:
    """Wrap each ``CONTRACT`` method ``cls`` defines itself so that what it returns is
    checked (abstract methods, methods already wrapped and the family classes' derived
    methods are left alone)."""
    if cls.__module__ == DERIVED_IN:
        return
    for name, check in CONTRACT.items():
        method = cls.__dict__.get(name)
        if not callable(method) or getattr(method, "__isabstractmethod__", False):
            continue
        if getattr(method, "_contract_checked", False):
            continue

        def checked(self, *args, _method=method, _name=name, _check=check, **kwargs):
            return _check(self, _name, _method(self, *args, **kwargs))

        functools.update_wrapper(checked, method)
        checked._contract_checked = True  # type: ignore[attr-defined]
        setattr(cls, name, checked)


def culprit(error: BaseException) -> tuple[Any, str] | None:
    """(rule, method) of the innermost rule method the traceback of ``error`` passes
    through (a frame whose ``self`` is a ``Rule``), or None when no rule was involved."""
    from cactus_theory.core.rules.base import Rule

    found = None
    trace = error.__traceback__
    while trace is not None:
        frame = trace.tb_frame
        owner = frame.f_locals.get("self")
        if isinstance(owner, Rule) and frame.f_code.co_name != "checked":
            found = (owner, frame.f_code.co_name)
        trace = trace.tb_next
    return found
