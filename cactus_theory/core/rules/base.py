"""The four shapes an acceptance rule can take, what each rule declares about itself, and
generalised speculative sampling.

Generalised SpS with target h (Leviathan et al. with h in place of the verifier's q):

    accept the drafted n with probability  a_n = min(1, h_n / p_n);
    on rejection sample from               r = (h − p)_+ / Σ (h − p)_+.

A rule decides acceptance with a uniform u in [0, 1): accept iff u < a_n (so a_n = 1 always
accepts and a_n = 0 never does). The torch sampler uses the same comparison.

Families (each has its own exact law in ``cactus_theory.law``):

- ``TargetRule`` (``target_law``): h does not depend on n (sps, interp, frontier). The
  emitted law is h.
- ``BranchRule`` (``raised_mass`` or ``raised_masses``): h depends on n only through
  γ_n = h_n, with the rest proportional to q: h^n_i = q_i (1 − γ_n)/(1 − q_n) for i ≠ n
  (cactus, cactus-exact). γ may depend on the whole row (its entropy, its size):
  ``raised_masses(target_probs, draft_probs)`` gives γ_n for every n of each row.
- ``DecisionRule`` (``accept_mask``, ``recovery``): acceptance is a deterministic function
  of (q, n) and rejection emits a fixed recovery law (tas, topk, greedy).
- the general family, a direct subclass of ``Rule`` (``accept_probs``, ``residuals_for``):
  a_n and the recovery law r^n may both depend on (q, p, n) (SGLang's threshold rule:
  r^n is q without n). Its exact law is Σ_n p_n (a_n e_n + (1 − a_n) r^n) by batched
  enumeration over the drafted tokens.

**Declared properties.** A fast path may assume something about a rule only when the rule
declares it (class attributes, or properties where they depend on the parameters);
undeclared means the exact general path. The defaults are the safe ones:

- ``support_only`` (False): tokens with p = q = 0 (vocabulary padding, what top-k/top-p
  removed) change nothing: such a token is never accepted or emitted and the other tokens'
  decisions and laws are the same without it, so rows may be packed to their support;
- ``lossless_at`` (None): parameter values at which the rule is exactly SpS for every
  (q, p) (``{}``: the rule is lossless at any parameters);
- ``tunable`` (None): the parameter acceptance moves monotonically with (``Tunable``),
  used to match acceptance and to spend a KL budget;
- ``greedy_consistent`` (False): with a one-hot target (temperature 0) the emitted token
  is the target's argmax whatever the draft;
- ``array_api`` (False): the rule's own methods are written against the array API
  (``cactus_theory.core.arrays``), so the torch sampler runs them on tensors as they are;
- ``BranchRule.gamma_from_mass`` (False): γ_n depends on q_n alone (elementwise
  ``raised_mass``), so the sampler may compute it from the drafted masses only.

``exact_family(rule)`` says which closed form applies: a family subclass that overrides the
family's derived methods (``accept_probs``, ``residuals_for``, ``targets_for``) is computed
by the general path, so its own methods are what the law sums.

Names: ``target`` is the verifier's q, ``draft`` is the draft's p (never bare letters).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from cactus_theory.core import validate
from cactus_theory.core.arrays import device, namespace
from cactus_theory.core.rules import contract

Array = np.ndarray


# --- generalised speculative sampling: the two formulas every SpS-like rule shares ---------
# Written against the array API (numpy rows or torch tensors), with safe denominators instead
# of division warnings.


def gsps_accept(adjusted_mass: Array, draft_mass: Array) -> Array:
    """a = min(1, h_n / p_n), elementwise; 0 where p_n = 0 (such a token is never drafted)."""
    xp = namespace(adjusted_mass, draft_mass)
    drafted = draft_mass > 0
    ratio = adjusted_mass / xp.where(drafted, draft_mass, xp.ones_like(draft_mass))
    return xp.minimum(xp.where(drafted, ratio, xp.zeros_like(ratio)), xp.ones_like(ratio))


def gsps_residual(adjusted: Array, draft_probs: Array) -> Array:
    """r = (h − p)_+ / Σ (h − p)_+ over the last axis.

    When Σ (h − p)_+ = 0 we have h = p, rejection has probability 0, and r is defined as h
    (the same fallback the torch sampler uses, so it always has a valid law to sample).
    """
    xp = namespace(adjusted, draft_probs)
    excess = xp.maximum(adjusted - draft_probs, xp.zeros_like(adjusted))
    mass = xp.sum(excess, axis=-1, keepdims=True)
    has_mass = mass > 0
    return xp.where(has_mass, excess / xp.where(has_mass, mass, xp.ones_like(mass)), adjusted)


def one_hot(index: Array, vocab_size: int, like: Array | None = None) -> Array:
    """Rows e_index over a vocabulary of ``vocab_size`` (index may be batched), float64 numpy,
    or of ``like``'s namespace, dtype and device when given."""
    if like is None:
        index = np.asarray(index)
        return (np.arange(vocab_size) == index[..., None]).astype(np.float64)
    xp = namespace(like)
    columns = xp.arange(vocab_size, device=device(like))
    return xp.astype(columns == index[..., None], like.dtype)


def take_at(values: Array, tokens: Array) -> Array:
    """values[..., tokens[...]] -> [..., 1] (the value at each row's token)."""
    xp = namespace(values)
    return xp.take_along_axis(values, tokens[..., None], axis=-1)


# --- what a rule declares ------------------------------------------------------------------


@dataclass(frozen=True)
class Tunable:
    """The parameter a rule's acceptance moves monotonically with, over [low, high].

    ``increasing``: mean acceptance is non-decreasing in the parameter (False: non-increasing).
    ``log``: search the parameter on a log scale (budgets spanning decades, such as δ).
    """

    parameter: str
    low: float
    high: float
    log: bool = False
    increasing: bool = True


# --- rule families -----------------------------------------------------------------------


class Rule(ABC):
    """An acceptance rule. Public methods validate; ``*_probs``/vectorised ones do not.

    A direct subclass is the general family: it defines ``name``, ``params`` (if it has
    parameters), ``accept_probs`` and ``residuals_for``.
    """

    name: ClassVar[str]
    family: ClassVar[str] = "general"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Check what the subclass's own methods return (``contract``)."""
        super().__init_subclass__(**kwargs)
        contract.install(cls)

    # Declared properties (module docstring); the safe defaults.
    support_only: ClassVar[bool] = False
    lossless_at: ClassVar[Mapping[str, Any] | None] = None
    tunable: ClassVar[Tunable | None] = None
    greedy_consistent: ClassVar[bool] = False
    array_api: ClassVar[bool] = False

    def params(self) -> dict[str, Any]:
        """The rule's parameters, as accepted by ``rules.make(name, **params)``."""
        return {}

    def with_params(self, **changes: Any) -> Rule:
        """The same rule with some parameters changed, e.g. ``rule.with_params(delta=0.1)``."""
        unknown = sorted(set(changes) - set(self.params()))
        if unknown:
            raise ValueError(f"{unknown[0]}: not a parameter of rule {self.name!r}")
        return type(self)(**{**self.params(), **changes})

    def __repr__(self) -> str:
        inner = ", ".join(f"{key}={value!r}" for key, value in self.params().items())
        return f"{type(self).__name__}({inner})"

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self) and other.params() == self.params()  # type: ignore[attr-defined]
        )

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.params().items()))))

    @property
    def label(self) -> str:
        """A short human label, e.g. ``cactus(δ=0.5)``."""
        return self.name if not self.params() else f"{self.name}({self._param_text()})"

    def _param_text(self) -> str:
        symbols = {"delta": "δ", "alpha": "α", "epsilon": "ε", "k": "k", "spread": "κ"}
        return ", ".join(f"{symbols.get(key, key)}={value}" for key, value in self.params().items())

    # -- vectorised internals on validated float64 rows [..., V] --------------------------

    @abstractmethod
    def accept_probs(self, target_probs: Array, draft_probs: Array) -> Array:
        """[..., V]: P(accept | drafted token = n) for every n (0 where p_n = 0)."""

    @abstractmethod
    def residuals_for(self, target_probs: Array, draft_probs: Array, tokens: Array) -> Array:
        """[..., V]: the law sampled on rejection of ``tokens [...]``, row by row (inputs may
        be read-only broadcast views: do not write into them)."""

    def targets_for(self, target_probs: Array, draft_probs: Array, tokens: Array) -> Array:
        """[..., V]: the h this rule targets when ``tokens [...]`` are drafted, row by row.

        For the general family (no target in the SpS sense) this is the conditional law of
        the emitted token given the draft: a_n e_n + (1 − a_n) r^n.
        """
        accept = take_at(self.accept_probs(target_probs, draft_probs), tokens)  # [..., 1]
        residual = self.residuals_for(target_probs, draft_probs, tokens)  # [..., V]
        drafted = one_hot(tokens, target_probs.shape[-1], like=residual)
        return accept * drafted + (1.0 - accept) * residual

    # -- public per-token API --------------------------------------------------------------

    def _checked(self, target: object, draft: object, token: object) -> tuple[Array, Array, Array]:
        target_probs, draft_probs = validate.pair(target, draft)
        if target_probs.ndim != 1:
            raise ValueError(f"target: expected one row [V], got shape {target_probs.shape}")
        return target_probs, draft_probs, np.asarray(validate.token("token", token, draft_probs))

    def accept_prob(self, *, target: object, draft: object, token: object) -> float:
        """P(accept the drafted ``token``) given verifier ``target`` (q) and ``draft`` (p)."""
        target_probs, draft_probs, index = self._checked(target, draft, token)
        return float(self.accept_probs(target_probs, draft_probs)[index])

    def residual(self, *, target: object, draft: object, token: object) -> Array:
        """[V]: the law the rule samples from when it rejects the drafted ``token``."""
        return self.residuals_for(*self._checked(target, draft, token))

    def adjusted_target(self, *, target: object, draft: object, token: object) -> Array:
        """[V]: the distribution h this rule targets when ``token`` is drafted."""
        return self.targets_for(*self._checked(target, draft, token))


class TargetRule(Rule):
    """Generalised SpS with an h that does not depend on the drafted token."""

    family: ClassVar[str] = "target"

    @abstractmethod
    def target_law(self, target_probs: Array, draft_probs: Array) -> Array:
        """[..., V]: the h this rule verifies against (no validation)."""

    def accept_probs(self, target_probs: Array, draft_probs: Array) -> Array:
        return gsps_accept(self.target_law(target_probs, draft_probs), draft_probs)

    def targets_for(self, target_probs: Array, draft_probs: Array, tokens: Array) -> Array:
        return self.target_law(target_probs, draft_probs)

    def residuals_for(self, target_probs: Array, draft_probs: Array, tokens: Array) -> Array:
        return gsps_residual(self.target_law(target_probs, draft_probs), draft_probs)


class BranchRule(Rule):
    """Generalised SpS whose h raises the drafted token to γ_n and scales the rest of q.

    h^n_n = γ_n,  h^n_i = q_i (1 − γ_n)/(1 − q_n) for i ≠ n   (h^n = q = e_n when q_n = 1).

    Define one of:

    - ``raised_mass(target_mass, cap=None)``: γ_n from q_n alone, elementwise (declare
      ``gamma_from_mass = True`` to let the sampler compute it from the drafted masses);
    - ``raised_masses(target_probs, draft_probs, cap=None)``: γ_n for every n of each row
      [..., V], for a γ that reads the whole row (its entropy, its size, the draft).

    Every method of the family reads γ through ``raised_masses`` on whole rows, so both
    definitions are exact everywhere.
    """

    family: ClassVar[str] = "branch"
    gamma_from_mass: ClassVar[bool] = False

    def raised_mass(self, target_mass: Array, cap: Array | None = None) -> Array:
        """γ_n for each value of q_n (elementwise, no validation); min(γ_n, cap) with a cap.

        The acceptance min(1, γ_n/p_n) and every rejected branch (γ_n < p_n) need only
        min(γ_n, p_n), which lets root-based rules skip the roots of accepted branches.
        """
        raise NotImplementedError(
            f"rule {self.name!r}: a branch rule defines raised_mass (γ from q_n) or "
            "raised_masses (γ from the whole row)"
        )

    def raised_masses(
        self, target_probs: Array, draft_probs: Array, cap: Array | None = None
    ) -> Array:
        """[..., V]: γ_n for every drafted n of each row; min(γ_n, cap) with a cap.

        The default applies ``raised_mass`` to every entry of the row.
        """
        return self.raised_mass(target_probs, cap=cap)

    def accept_probs(self, target_probs: Array, draft_probs: Array) -> Array:
        return gsps_accept(
            self.raised_masses(target_probs, draft_probs, cap=draft_probs), draft_probs
        )

    def targets_for(self, target_probs: Array, draft_probs: Array, tokens: Array) -> Array:
        xp = namespace(target_probs, draft_probs)
        target_mass = take_at(target_probs, tokens)  # [..., 1] q_n
        if gamma_is_elementwise(self):  # declared: γ_n from q_n alone
            raised = self.raised_mass(target_mass)  # [..., 1] γ_n
        else:
            raised = take_at(self.raised_masses(target_probs, draft_probs), tokens)  # [..., 1]
        adjusted = target_probs * branch_scale(raised, target_mass)  # s_n q
        at_token = one_hot(tokens, target_probs.shape[-1], like=adjusted) > 0
        return xp.where(at_token, raised, adjusted)

    def residuals_for(self, target_probs: Array, draft_probs: Array, tokens: Array) -> Array:
        return gsps_residual(self.targets_for(target_probs, draft_probs, tokens), draft_probs)


def branch_scale(raised: Array, target_mass: Array) -> Array:
    """s_n = (1 − γ_n)/(1 − q_n), the factor on q_i (i ≠ n); 1 when q_n = 1 (then h = q)."""
    xp = namespace(raised, target_mass)
    below_one = target_mass < 1.0
    spread = xp.where(below_one, 1.0 - target_mass, xp.ones_like(target_mass))
    return xp.where(below_one, (1.0 - raised) / spread, xp.ones_like(target_mass))


class DecisionRule(Rule):
    """Deterministic acceptance with a recovery law that does not depend on the draft."""

    family: ClassVar[str] = "decision"

    @abstractmethod
    def accept_mask(self, target_probs: Array) -> Array:
        """[..., V] bool: whether drafted token n is accepted (no validation)."""

    @abstractmethod
    def recovery(self, target_probs: Array) -> Array:
        """[..., V]: the law emitted on rejection (no validation)."""

    def accept_probs(self, target_probs: Array, draft_probs: Array) -> Array:
        xp = namespace(target_probs, draft_probs)
        accepted = (draft_probs > 0) & self.accept_mask(target_probs)
        return xp.astype(accepted, draft_probs.dtype)

    def targets_for(self, target_probs: Array, draft_probs: Array, tokens: Array) -> Array:
        """The conditional law of the emitted token given the draft: e_n or the recovery."""
        xp = namespace(target_probs, draft_probs)
        accepted = take_at(self.accept_mask(target_probs), tokens)  # [..., 1]
        drafted = one_hot(tokens, target_probs.shape[-1], like=target_probs)
        return xp.where(accepted, drafted, self.recovery(target_probs))

    def residuals_for(self, target_probs: Array, draft_probs: Array, tokens: Array) -> Array:
        return self.recovery(target_probs)


#: The family classes and the methods each derives from its own contract.
_DERIVED = ("accept_probs", "residuals_for", "targets_for")


def exact_family(rule: Rule) -> str:
    """The family whose closed-form law applies to ``rule``: "target", "branch",
    "decision", or "general" (the batched enumeration) for direct ``Rule`` subclasses and
    for family subclasses that override a derived method (then their own methods are the
    definition, and only the general path sums them)."""
    cls = type(rule)
    for family in (TargetRule, BranchRule, DecisionRule):
        if isinstance(rule, family):
            intact = all(getattr(cls, name) is getattr(family, name) for name in _DERIVED)
            return family.family if intact else "general"
    return "general"


def gamma_is_elementwise(rule: Rule) -> bool:
    """True when the sampler may compute γ_n from q_n alone: a branch rule in its closed
    form that declares ``gamma_from_mass`` and keeps the default ``raised_masses``."""
    return (
        exact_family(rule) == "branch"
        and bool(getattr(rule, "gamma_from_mass", False))
        and type(rule).raised_masses is BranchRule.raised_masses
    )
