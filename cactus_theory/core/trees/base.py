"""One node of a drafted tree, and the contract every tree (multi-draft) rule implements.

A **node** is one position of a drafted tree: the verifier's row q there (``target``), the
draft's row p there (``draft``), and the K children drafted below it, in the order a walk
tries them. Children are drafted in one of three ways (``Node.scheme``):

- ``"deterministic"``: a fixed tuple S = (x_1..x_K) of distinct tokens (the draft's top-K:
  EAGLE-2/3, SGLang, vLLM's ``propose_tree``);
- ``"with-replacement"``: K i.i.d. draws from p (SpecInfer, SpecTr);
- ``"without-replacement"``: K draws from p, each from p without the earlier children,
  renormalised (Sequoia, RSD);
- ``"hub"``: SpecHub's two drafts (Sun et al., EMNLP 2024) around the hub token
  a = argmax p: x_1 ~ p; x_2 = a when x_1 != a, else x_2 ~ p without a, renormalised.

The **proposal** of child i, π_i [V], is the law x_i was drawn from given x_1..x_{i−1}:
e_{x_i} (deterministic), p (with replacement), p with x_1..x_{i−1} removed and
renormalised (without replacement), or for the hub's second draft e_a (x_1 != a) or p
without a (x_1 = a). The probability of a drafted tuple is Π_i π_i(x_i). ``proposals``
builds them; a rule reads them instead of the scheme, so one definition serves every
scheme.

**The walk** (one node). A tree rule says, for a drafted tuple x = (x_1..x_K),

    a_i = P(accept child i | children 1..i−1 rejected)       ``sibling_accepts`` [..., K]
    r   = the law emitted when all K are rejected              ``final_residual``  [..., V]

so the node ends at child i with probability P_i = a_i Π_{j<i} (1 − a_j) (``end_probs``),
rejects every child with probability Π_j (1 − a_j), and emits, given x,

    e(· | x) = Σ_i P_i e_{x_i} + Π_j (1 − a_j) r                   (``conditional_law``).

The node's law is E_x[e(· | x)] over the drafted tuples (one tuple when deterministic), and
its acceptance E_x[1 − Π_j (1 − a_j)]: ``cactus_theory.core.trees.law``. A chain rule is
the case K = 1 drafted with replacement: a_1 = a_n and r = r^n, so its node law is
``law.output_law``.

**Decisions from uniforms** (numpy reference, torch sampler and decoder alike). One uniform
u per node picks the outcome by inverse CDF over (child 1, ..., child K, none):

    end at child i  iff  C_{i−1} <= u < C_i,  C_i = 1 − Π_{j<=i} (1 − a_j)   (C_0 = 0);
    reject all      iff  u >= C_K,

then a second uniform draws the emitted token from r by inverse CDF (or, after an accepted
child that is a leaf, the bonus token from the verifier's row at that child). For K = 1
this is the chain sampler's ``u < a_n``. It is also SGLang's tree kernel, which compares
one coin per node with the running sum of the siblings' target probabilities (its
``threshold_acc = 1`` case gives C_i = q(x_1) + ... + q(x_i)). EAGLE's
``evaluate_posterior`` draws one coin per sibling instead: the same law, other decisions.

Names: ``target`` is the verifier's q, ``draft`` is the draft's p (never bare letters).
"""

from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from cactus_theory.core import validate
from cactus_theory.core.arrays import namespace
from cactus_theory.core.rules.base import Tunable, one_hot, take_at

Array = np.ndarray

#: How a node's children are drafted (``Node.scheme``).
DETERMINISTIC = "deterministic"
WITH_REPLACEMENT = "with-replacement"
WITHOUT_REPLACEMENT = "without-replacement"
HUB = "hub"
SCHEMES = (DETERMINISTIC, WITH_REPLACEMENT, WITHOUT_REPLACEMENT, HUB)
#: The schemes whose children are drawn from the draft (``Node(k=...)``).
SAMPLED = (WITH_REPLACEMENT, WITHOUT_REPLACEMENT, HUB)

#: ``decide``'s outcome when every child is rejected is K (one past the last child).


@dataclass(frozen=True, init=False)
class Node:
    """One node: ``target`` q [V], ``draft`` p [V], and its children.

    ``Node(target=q, draft=p, children=[3, 1])``: deterministic children, tried in this
    order (distinct token ids in [0, V)).
    ``Node(target=q, draft=p, k=2, replacement=False)``: k children sampled from p, with or
    without replacement; ``scheme="hub"`` (k = 2) drafts SpecHub's pair instead.
    """

    target: Array
    draft: Array
    children: tuple[int, ...] | None
    k: int
    scheme: str

    def __init__(
        self,
        *,
        target: object,
        draft: object,
        children: Sequence[int] | None = None,
        k: int | None = None,
        replacement: bool = True,
        scheme: str | None = None,
    ) -> None:
        target_probs, draft_probs = validate.pair(target, draft)
        if target_probs.ndim != 1:
            raise ValueError(f"target: expected one row [V], got shape {target_probs.shape}")
        if children is None:
            if k is None:
                raise ValueError("children: give the drafted children, or k to sample them")
            width = validate.positive_int("k", k)
            if scheme is None:
                scheme = WITH_REPLACEMENT if replacement else WITHOUT_REPLACEMENT
            elif scheme not in SAMPLED:
                raise ValueError(f"scheme: sampled children use one of {SAMPLED}, got {scheme!r}")
            if scheme == HUB and width != 2:
                raise ValueError(f"k: SpecHub's hub scheme drafts 2 children, got {width}")
            distinct = scheme != WITH_REPLACEMENT
            if distinct and width > int(np.count_nonzero(draft_probs)):
                raise ValueError(
                    f"k: {width} distinct children ({scheme}) need as many tokens with "
                    f"draft > 0 (this draft has {int(np.count_nonzero(draft_probs))})"
                )
            drafted = None
        else:
            if scheme not in (None, DETERMINISTIC):
                raise ValueError(f"scheme: given children are deterministic, got {scheme!r}")
            drafted = tuple(_child(child, draft_probs) for child in children)
            if not drafted:
                raise ValueError("children: a node needs at least one child")
            if len(set(drafted)) != len(drafted):
                raise ValueError(f"children: deterministic children must differ, got {drafted}")
            if k is not None and k != len(drafted):
                raise ValueError(f"k: {k} does not match the {len(drafted)} children given")
            width, scheme = len(drafted), DETERMINISTIC
        object.__setattr__(self, "target", target_probs)
        object.__setattr__(self, "draft", draft_probs)
        object.__setattr__(self, "children", drafted)
        object.__setattr__(self, "k", width)
        object.__setattr__(self, "scheme", scheme)

    @property
    def vocab_size(self) -> int:
        return int(self.target.shape[-1])

    def __repr__(self) -> str:
        drafted = f"children={list(self.children)}" if self.children else f"k={self.k}"
        return f"Node(V={self.vocab_size}, {drafted}, scheme={self.scheme!r})"


def _child(child: object, draft_probs: Array) -> int:
    """A deterministic child: a token id in [0, V) (its draft probability may be 0: the
    draft's top-K need not be where p > 0 after truncation, and the walk never reads p)."""
    if isinstance(child, bool) or not isinstance(child, numbers.Integral):
        raise ValueError(f"children: must be integer token ids, got {child!r}")
    vocab = draft_probs.shape[-1]
    if not 0 <= int(child) < vocab:
        raise ValueError(f"children: token id {int(child)} is out of range [0, {vocab})")
    return int(child)


def hub_token(draft_probs: Array) -> Array:
    """[...]: SpecHub's hub a = argmax p (the first index on ties)."""
    xp = namespace(draft_probs)
    return xp.argmax(draft_probs, axis=-1)


def proposals(draft_probs: Array, children: Array, scheme: str) -> Array:
    """[..., K, V]: π_i, the law child i was drafted from given the earlier children.

    ``draft_probs`` [..., V], ``children`` [..., K] (integer ids); array API (numpy or
    torch). Without replacement, a row whose earlier children hold all of p's mass gets an
    all-zero proposal (such a child cannot be drafted).
    """
    xp = namespace(draft_probs)
    width = children.shape[-1]
    vocab = draft_probs.shape[-1]
    if scheme == DETERMINISTIC:
        return one_hot(children, vocab, like=draft_probs)  # [..., K, V]
    shape = (*draft_probs.shape[:-1], width, vocab)
    if scheme == WITH_REPLACEMENT:
        return xp.broadcast_to(draft_probs[..., None, :], shape)
    if scheme == HUB:
        return _hub_proposals(draft_probs, children)
    if scheme != WITHOUT_REPLACEMENT:
        raise ValueError(f"scheme: expected one of {', '.join(SCHEMES)}, got {scheme!r}")
    drafted = one_hot(children, vocab, like=draft_probs)  # [..., K, V]
    earlier = xp.cumulative_sum(drafted, axis=-2) - drafted  # [..., K, V] x_j, j < i
    kept = xp.where(earlier > 0, xp.zeros_like(drafted), draft_probs[..., None, :])
    mass = xp.sum(kept, axis=-1, keepdims=True)
    return kept / xp.where(mass > 0, mass, xp.ones_like(mass))


def _hub_proposals(draft_probs: Array, children: Array) -> Array:
    """[..., 2, V]: π_1 = p; π_2 = e_a when x_1 != a, else p without a renormalised."""
    xp = namespace(draft_probs)
    if children.shape[-1] != 2:
        raise ValueError(f"children: the hub scheme drafts 2 children, got {children.shape[-1]}")
    vocab = draft_probs.shape[-1]
    hub = one_hot(hub_token(draft_probs), vocab, like=draft_probs)  # [..., V] e_a
    without = xp.where(hub > 0, xp.zeros_like(draft_probs), draft_probs)
    mass = xp.sum(without, axis=-1, keepdims=True)
    without = without / xp.where(mass > 0, mass, xp.ones_like(mass))
    first_is_hub = take_at(hub, children[..., 0]) > 0  # [..., 1]
    second = xp.where(first_is_hub, without, hub)
    return xp.stack([draft_probs, second], axis=-2)


def end_probs(accepts: Array) -> Array:
    """[..., K+1]: P(end at child i) = a_i Π_{j<i} (1 − a_j) for i < K, then
    P(reject all) = Π_j (1 − a_j), from sequential acceptances ``accepts`` [..., K]."""
    xp = namespace(accepts)
    survive = xp.cumulative_prod(1.0 - accepts, axis=-1)  # [..., K] Π_{j<=i} (1 − a_j)
    before = xp.concat([xp.ones_like(survive[..., :1]), survive[..., :-1]], axis=-1)
    return xp.concat([accepts * before, survive[..., -1:]], axis=-1)


def decide(accepts: Array, uniforms: Array) -> Array:
    """[...]: the outcome of each node from one uniform in [0, 1) (module docstring):
    the first child i with u < C_i, or K when u >= C_K (every child rejected)."""
    xp = namespace(accepts)
    survive = xp.cumulative_prod(1.0 - accepts, axis=-1)  # [..., K]
    cumulative = 1.0 - survive  # [..., K] C_i
    return xp.sum(xp.astype(cumulative <= uniforms[..., None], xp.int64), axis=-1)


class TreeRule(ABC):
    """A verification scheme for one node with K drafted children (module docstring).

    Define ``name``, ``params`` (if any), ``sibling_accepts`` and ``final_residual``,
    written against the array API (``namespace``) when declaring ``array_api``.

    Declared properties (safe defaults; a fast path may assume only what is declared):

    - ``lossless`` (False): the node's law is q for every (q, p, scheme it supports);
    - ``lossless_at`` (None): parameter values at which the rule is lossless (``{}``: at
      any parameters), as for chain rules;
    - ``schemes`` (all four): the drafting schemes the rule is defined for;
    - ``array_api`` (False): the methods run unchanged on torch tensors;
    - ``support_only`` (False): tokens with p = q = 0 change nothing (rows may be packed to
      their support);
    - ``tunable`` (None): the parameter acceptance moves monotonically with
      (``rules.Tunable``), for sweeps of the trade-off.

    A rule may also give closed forms for its node law and acceptance
    (``closed_form_law``, ``closed_form_acceptance``: None where it has none); the law
    engine uses them only through ``core.trees.law.node_law(..., exact="closed-form")``
    and the kit checks them against the enumeration.
    """

    name: ClassVar[str]
    lossless: ClassVar[bool] = False
    lossless_at: ClassVar[Mapping[str, Any] | None] = None
    schemes: ClassVar[tuple[str, ...]] = SCHEMES
    array_api: ClassVar[bool] = False
    support_only: ClassVar[bool] = False
    tunable: ClassVar[Tunable | None] = None

    def params(self) -> dict[str, Any]:
        """The rule's parameters, as accepted by ``trees.make(name, **params)``."""
        return {}

    def __repr__(self) -> str:
        inner = ", ".join(f"{key}={value!r}" for key, value in self.params().items())
        return f"{type(self).__name__}({inner})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.params() == self.params()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.params().items()))))

    @property
    def label(self) -> str:
        inner = ", ".join(f"{key}={value}" for key, value in self.params().items())
        return self.name if not inner else f"{self.name}({inner})"

    @abstractmethod
    def sibling_accepts(self, target_probs: Array, proposals: Array, children: Array) -> Array:
        """[..., K]: a_i = P(accept child i | children 1..i−1 rejected), in [0, 1].

        ``target_probs`` [..., V] (q at the node), ``proposals`` [..., K, V] (π_i),
        ``children`` [..., K] (drafted ids). Inputs may be read-only views.
        """

    @abstractmethod
    def final_residual(self, target_probs: Array, proposals: Array, children: Array) -> Array:
        """[..., V]: the law emitted when every child is rejected (a law wherever that
        event has positive probability)."""

    def with_params(self, **changes: Any) -> TreeRule:
        """The same rule with some parameters changed, e.g. ``rule.with_params(delta=0.1)``."""
        unknown = sorted(set(changes) - set(self.params()))
        if unknown:
            raise ValueError(f"{unknown[0]}: not a parameter of tree rule {self.name!r}")
        return type(self)(**{**self.params(), **changes})

    def closed_form_law(
        self, target_probs: Array, draft_probs: Array, width: int, scheme: str
    ) -> Array | None:
        """[..., V]: the node law in closed form for rows of (q, p), K = ``width`` children
        drafted by ``scheme``, or None (no closed form: the law engine enumerates)."""
        return None

    def closed_form_acceptance(
        self, target_probs: Array, draft_probs: Array, width: int, scheme: str
    ) -> Array | None:
        """[...]: the node acceptance in closed form, or None (module docstring)."""
        return None


def conditional_law(rule: TreeRule, target_probs: Array, proposal_rows: Array, children: Array):
    """[..., V]: e(· | x) = Σ_i P_i e_{x_i} + P(reject all) r, for drafted tuples ``children``
    [..., K] with proposals [..., K, V] (no validation; array API)."""
    xp = namespace(target_probs)
    ends = end_probs(rule.sibling_accepts(target_probs, proposal_rows, children))  # [..., K+1]
    vocab = target_probs.shape[-1]
    accepted = xp.sum(ends[..., :-1, None] * one_hot(children, vocab, like=target_probs), axis=-2)
    residual = rule.final_residual(target_probs, proposal_rows, children)  # [..., V]
    return accepted + ends[..., -1:] * residual
