"""Sibling by sibling: a chain rule applied to each child in turn, against the residual the
previous sibling left (recursive rejection sampling and its relatives).

For a chain rule R (``rules.Rule``: a_n = ``accept_probs``, r^n = ``residuals_for``) and a
starting target t_1 (the verifier's q, or a tilt of it), child i is verified against

    a_i     = R.accept_probs(t_i, π_i)[x_i]        (π_i: the proposal child i came from)
    t_{i+1} = R.residuals_for(t_i, π_i, x_i)        (the law R samples on rejecting x_i),

and the law emitted when every child is rejected is t_{K+1}. Each step is one chain verify
step of R on (t_i, π_i), so when R is lossless the node emits t_1 exactly, for any drafted
tuple (given the earlier children, x_i ~ π_i is what a chain step assumes; with one-hot
proposals it holds for any x_i). ``sibling_walk`` is this loop, written against the array
API; the rules below are its instances:

- ``rrs``: R = SpS (a = min(1, t_i(x_i)/π_i(x_i)), t_{i+1} = norm((t_i − π_i)_+)):
  recursive rejection sampling, SpecInfer (with replacement) and Sequoia / RSD (without:
  π_i is p without the earlier children). Lossless. With replacement its acceptance is
  1 − Π_i TV(t_i, p) (t_i does not depend on the children), ``rrs_acceptance``.
- ``walk``: R = SpS with one-hot proposals π_i = e_{x_i}: accept child i with probability
  q'(x_i), q' = q with the rejected siblings removed and renormalised; if all fail, sample
  q without S. EAGLE-2/3 ``evaluate_posterior`` with ``qx = 1`` (one coin per sibling), and
  SGLang's ``TreeSpeculativeSamplingTargetOnly`` at thresholds (1, 1) (one coin per node,
  same law). Lossless for any children; acceptance q(S) for distinct children.
- ``lift:SPEC``: any chain rule, lifted (``LiftedRule``). At K = 1 with replacement the node
  law is ``law.output_law`` of the chain rule: tree rules and chain rules share one law.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from cactus_theory.core.arrays import namespace
from cactus_theory.core.rules.base import Rule, gsps_residual, one_hot, take_at
from cactus_theory.core.rules.sps import SpS
from cactus_theory.core.trees.base import WITH_REPLACEMENT, TreeRule

Array = np.ndarray


def sibling_walk(chain: Rule, start: Array, proposal_rows: Array, children: Array):
    """(accepts [..., K], residual [..., V]): the loop of the module docstring for the chain
    rule ``chain`` from the starting target ``start`` [..., V], with proposals
    [..., K, V] and children [..., K] (array API when ``chain`` declares it)."""
    xp = namespace(start)
    target = start
    accepts = []
    for index in range(children.shape[-1]):
        proposal = proposal_rows[..., index, :]  # [..., V]
        drafted = children[..., index]  # [...]
        accept = take_at(chain.accept_probs(target, proposal), drafted)  # [..., 1]
        accepts.append(accept)
        target = chain.residuals_for(target, proposal, drafted)  # [..., V]
    return xp.concat(accepts, axis=-1), target


def one_hot_proposals(children: Array, like: Array) -> Array:
    """[..., K, V]: π_i = e_{x_i} (the walk's proposals, whatever drafted the children)."""
    return one_hot(children, like.shape[-1], like=like)


_SPS = SpS()


class RecursiveRejection(TreeRule):
    """Recursive rejection sampling: SpS sibling by sibling against the residual
    (SpecInfer with replacement; Sequoia / RSD without). Lossless; acceptance
    1 − Π_i TV(t_i, p) with replacement."""

    name: ClassVar[str] = "rrs"
    lossless: ClassVar[bool] = True
    lossless_at: ClassVar[Mapping[str, Any]] = {}
    array_api: ClassVar[bool] = True
    support_only: ClassVar[bool] = True

    def sibling_accepts(self, target_probs, proposals, children):
        return sibling_walk(_SPS, target_probs, proposals, children)[0]

    def final_residual(self, target_probs, proposals, children):
        return sibling_walk(_SPS, target_probs, proposals, children)[1]

    def closed_form_law(self, target_probs, draft_probs, width, scheme):
        return target_probs  # lossless

    def closed_form_acceptance(self, target_probs, draft_probs, width, scheme):
        if scheme != WITH_REPLACEMENT:
            return None
        return rrs_acceptance(target_probs, draft_probs, width)


def rrs_acceptance(target_probs: Array, draft_probs: Array, width: int) -> Array:
    """[...]: 1 − Π_{i=1..K} TV(t_i, p) with t_1 = q, t_{i+1} = norm((t_i − p)_+): the
    acceptance of recursive rejection sampling with K children drawn i.i.d. from p (step i
    rejects with probability Σ (t_i − p)_+ = TV(t_i, p) whatever the children)."""
    xp = namespace(target_probs, draft_probs)
    target = target_probs
    survive = xp.ones_like(target_probs[..., 0])
    for _ in range(width):
        rejected = xp.sum(xp.maximum(target - draft_probs, xp.zeros_like(target)), axis=-1)
        survive = survive * xp.minimum(rejected, xp.ones_like(rejected))
        target = gsps_residual(target, draft_probs)
    return 1.0 - survive


class Walk(TreeRule):
    """The lossless walk: accept child i with probability q'(x_i) (q' = q without the
    rejected siblings, renormalised); else sample q without the children (EAGLE-2/3
    ``evaluate_posterior`` with qx = 1; SGLang's tree kernel at thresholds 1/1)."""

    name: ClassVar[str] = "walk"
    lossless: ClassVar[bool] = True
    lossless_at: ClassVar[Mapping[str, Any]] = {}
    array_api: ClassVar[bool] = True
    support_only: ClassVar[bool] = True

    def sibling_accepts(self, target_probs, proposals, children):
        hot = one_hot_proposals(children, target_probs)
        return sibling_walk(_SPS, target_probs, hot, children)[0]

    def final_residual(self, target_probs, proposals, children):
        hot = one_hot_proposals(children, target_probs)
        return sibling_walk(_SPS, target_probs, hot, children)[1]

    def closed_form_law(self, target_probs, draft_probs, width, scheme):
        return target_probs  # lossless for any children

    def closed_form_acceptance(self, target_probs, draft_probs, width, scheme):
        return None  # q(S) depends on the children: ``law.node_acceptance`` enumerates


class LiftedRule(TreeRule):
    """A chain rule applied sibling by sibling (module docstring): ``lift:SPEC``.

    ``rule``: a chain rule or its spec (``"cactus:delta=0.5"``). Its declared properties
    carry over: lossless when the chain rule is lossless at any parameters, array API and
    support-only when it is.
    """

    name: ClassVar[str] = "lift"
    #: ``trees.parse("lift:SPEC")``: the rest of the spec is the chain rule's spec.
    spec_rest: ClassVar[str] = "rule"

    def __init__(self, rule: str = "sps") -> None:
        from cactus_theory.core.rules import registry

        if isinstance(rule, Rule):
            self.chain = rule
        elif isinstance(rule, str):
            self.chain = registry.parse(rule)
        else:
            raise ValueError(f"rule: expected a chain rule or its spec, got {rule!r}")
        self.spec = registry.spec_of(self.chain)

    def params(self) -> dict[str, Any]:
        return {"rule": self.spec}

    @property
    def label(self) -> str:
        return f"lift({self.chain.label})"

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.chain.lossless_at == {}

    @property
    def array_api(self) -> bool:  # type: ignore[override]
        return bool(self.chain.array_api)

    @property
    def support_only(self) -> bool:  # type: ignore[override]
        return bool(self.chain.support_only)

    def sibling_accepts(self, target_probs, proposals, children):
        return sibling_walk(self.chain, target_probs, proposals, children)[0]

    def final_residual(self, target_probs, proposals, children):
        return sibling_walk(self.chain, target_probs, proposals, children)[1]


def lift(rule: Rule | str) -> LiftedRule:
    """The tree rule that applies the chain rule ``rule`` (or spec) sibling by sibling."""
    return LiftedRule(rule)
