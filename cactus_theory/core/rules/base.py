"""The three shapes an acceptance rule can take, and generalised speculative sampling.

Generalised SpS with target h (Leviathan et al. with h in place of the verifier's q):

    accept the drafted n with probability  a_n = min(1, h_n / p_n);
    on rejection sample from               r = (h − p)_+ / Σ (h − p)_+.

A rule decides acceptance with a uniform u in [0, 1): accept iff u < a_n (so a_n = 1 always
accepts and a_n = 0 never does). The torch sampler uses the same comparison.

Families (each has its own exact law in ``cactus_theory.law``):

- ``TargetRule``: h does not depend on n (sps, interp, frontier). The emitted law is h.
- ``BranchRule``: h depends on n only through γ_n = h_n, with the rest proportional to q:
  h^n_i = q_i (1 − γ_n)/(1 − q_n) for i ≠ n (cactus, cactus-exact).
- ``DecisionRule``: acceptance is a deterministic function of (q, n) and rejection emits a
  fixed recovery law (tas, topk, greedy).

Names: ``target`` is the verifier's q, ``draft`` is the draft's p (never bare letters).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from cactus_theory.core import validate

Array = np.ndarray


# --- generalised speculative sampling: the two formulas every SpS-like rule shares ---------


def gsps_accept(adjusted_mass: Array, draft_mass: Array) -> Array:
    """a = min(1, h_n / p_n), elementwise; 0 where p_n = 0 (such a token is never drafted)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(draft_mass > 0, adjusted_mass / np.where(draft_mass > 0, draft_mass, 1), 0)
    return np.minimum(1.0, ratio)


def gsps_residual(adjusted: Array, draft_probs: Array) -> Array:
    """r = (h − p)_+ / Σ (h − p)_+ over the last axis.

    When Σ (h − p)_+ = 0 we have h = p, rejection has probability 0, and r is defined as h
    (the same fallback the torch sampler uses, so it always has a valid law to sample).
    """
    excess = np.maximum(adjusted - draft_probs, 0.0)
    mass = excess.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mass > 0, excess / np.where(mass > 0, mass, 1.0), adjusted)


def one_hot(index: Array, vocab_size: int) -> Array:
    """Rows e_index over a vocabulary of ``vocab_size`` (index may be batched)."""
    index = np.asarray(index)
    return (np.arange(vocab_size) == index[..., None]).astype(np.float64)


# --- rule families -----------------------------------------------------------------------


class Rule(ABC):
    """An acceptance rule. Public methods validate; ``*_probs``/vectorised ones do not."""

    name: ClassVar[str]
    family: ClassVar[str]

    def params(self) -> dict[str, Any]:
        """The rule's parameters, as accepted by ``rules.make(name, **params)``."""
        return {}

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
    def targets_for(self, target_probs: Array, draft_probs: Array, tokens: Array) -> Array:
        """[..., V]: the h this rule targets when ``tokens [...]`` are drafted, row by row."""

    @abstractmethod
    def residuals_for(self, target_probs: Array, draft_probs: Array, tokens: Array) -> Array:
        """[..., V]: the law sampled on rejection of ``tokens [...]``, row by row."""

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
    """

    family: ClassVar[str] = "branch"

    @abstractmethod
    def raised_mass(self, target_mass: Array, cap: Array | None = None) -> Array:
        """γ_n for each value of q_n (elementwise, no validation); min(γ_n, cap) with a cap.

        The acceptance min(1, γ_n/p_n) and every rejected branch (γ_n < p_n) need only
        min(γ_n, p_n), which lets root-based rules skip the roots of accepted branches.
        """

    def accept_probs(self, target_probs: Array, draft_probs: Array) -> Array:
        return gsps_accept(self.raised_mass(target_probs, cap=draft_probs), draft_probs)

    def targets_for(self, target_probs: Array, draft_probs: Array, tokens: Array) -> Array:
        index = np.asarray(tokens)[..., None]
        target_mass = np.take_along_axis(target_probs, index, axis=-1)
        raised = self.raised_mass(target_mass)
        scale = branch_scale(raised, target_mass)
        adjusted = target_probs * scale
        np.put_along_axis(adjusted, index, raised, axis=-1)
        return adjusted

    def residuals_for(self, target_probs: Array, draft_probs: Array, tokens: Array) -> Array:
        return gsps_residual(self.targets_for(target_probs, draft_probs, tokens), draft_probs)


def branch_scale(raised: Array, target_mass: Array) -> Array:
    """s_n = (1 − γ_n)/(1 − q_n), the factor on q_i (i ≠ n); 1 when q_n = 1 (then h = q)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(target_mass < 1.0, (1.0 - raised) / (1.0 - target_mass), 1.0)


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
        return np.where(draft_probs > 0, self.accept_mask(target_probs), False).astype(np.float64)

    def targets_for(self, target_probs: Array, draft_probs: Array, tokens: Array) -> Array:
        """The conditional law of the emitted token given the draft: e_n or the recovery."""
        index = np.asarray(tokens)[..., None]
        accepted = np.take_along_axis(self.accept_mask(target_probs), index, axis=-1)
        drafted = one_hot(np.asarray(tokens), target_probs.shape[-1])
        return np.where(accepted, drafted, self.recovery(target_probs))

    def residuals_for(self, target_probs: Array, draft_probs: Array, tokens: Array) -> Array:
        return self.recovery(target_probs)
