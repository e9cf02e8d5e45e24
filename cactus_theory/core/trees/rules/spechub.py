"""SpecHub (Sun, Zhou, Chen & Sun, "SpecHub: Provable Acceleration to Multi-Draft
Speculative Decoding", EMNLP 2024; code: MasterGodzilla/Speculative_decoding_OT), two
drafts around the hub token a = argmax p.

Drafting (``trees.HUB``): x_1 ~ p; x_2 = a when x_1 != a, else x_2 ~ p without a. So the
pairs are (i, a) with probability P(i, a) = p_i and (a, i) with P(a, i) = p_a p_i/(1 − p_a)
(i != a): a sparse joint that always holds the hub.

Verification spends q in a fixed order (names: q the verifier, p the draft, i != a):

1. in (i, a), accept i with u_i = min(1, q_i/p_i); left: q'_i = (q_i − p_i)_+, and the
   pair's rejected mass P'(i, a) = (p_i − q_i)_+;
2. in (a, i), accept i with v_i = min(1, q'_i/P(a, i)); left q''_i = (q'_i − P(a, i))_+,
   P'(a, i) = (P(a, i) − q'_i)_+;
3. in (a, i) with i rejected, accept a with β_1 = min(1, q_a/M_1), M_1 = Σ_i P'(a, i);
   left q'_a = (q_a − M_1)_+;
4. in (i, a) with i rejected, accept a with β_2 = min(1, q'_a/M_2), M_2 = Σ_i P'(i, a);
   left q''_a = (q'_a − M_2)_+;
5. if everything was rejected, emit q'' (q''_i and q''_a) renormalised.

Each step accepts at most what is left of q at that token, and the rejected mass is
exactly Σ q'', so the node emits q (lossless). In the tree contract, children in drafted
order: (i, a) gives a_1 = u_i, a_2 = β_2; (a, i) tries i first, so its end
probabilities are P(a) = (1 − v_i) β_1 and P(i) = v_i, i.e. a_1 = (1 − v_i) β_1 and
a_2 = v_i/(1 − a_1). The law is SpecHub's; with one uniform per node the decisions are
ours (the paper's code draws one coin per try).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from cactus_theory.core.arrays import namespace
from cactus_theory.core.rules.base import one_hot, take_at
from cactus_theory.core.trees.base import HUB, TreeRule, hub_token

Array = np.ndarray


def _ratio(numerator, denominator):
    """min(1, numerator/denominator), 0 where the denominator is 0 (array API)."""
    xp = namespace(numerator, denominator)
    positive = denominator > 0
    safe = xp.where(positive, denominator, xp.ones_like(denominator))
    ones = xp.ones_like(numerator)
    return xp.where(positive, xp.minimum(numerator / safe, ones), xp.zeros_like(numerator))


def hub_terms(target_probs: Array, draft_probs: Array) -> dict[str, Array]:
    """Every quantity of the module docstring for rows of (q, p) [..., V]: per token
    ``u``, ``v``, ``left`` (q'' at i != a, q''_a at a) and per row ``beta_1``, ``beta_2``
    [..., 1] and the hub's one-hot ``hub`` [..., V]."""
    xp = namespace(target_probs, draft_probs)
    zero = xp.zeros_like(target_probs)
    hub = one_hot(hub_token(draft_probs), target_probs.shape[-1], like=target_probs)
    others = hub == 0
    hub_draft = xp.sum(hub * draft_probs, axis=-1, keepdims=True)  # p_a
    hub_target = xp.sum(hub * target_probs, axis=-1, keepdims=True)  # q_a
    rest = xp.sum(xp.where(others, draft_probs, zero), axis=-1, keepdims=True)  # 1 − p_a
    second = xp.where(
        others, hub_draft * draft_probs / xp.where(rest > 0, rest, xp.ones_like(rest)), zero
    )  # P(a, i)
    first = xp.where(others, draft_probs, zero)  # P(i, a)
    u = _ratio(target_probs, draft_probs)
    left_1 = xp.where(others, xp.maximum(target_probs - first, zero), zero)  # q'_i
    rejected_first = xp.where(others, xp.maximum(first - target_probs, zero), zero)  # P'(i, a)
    v = _ratio(left_1, second)
    left_2 = xp.maximum(left_1 - second, zero)  # q''_i
    rejected_second = xp.maximum(second - left_1, zero)  # P'(a, i)
    mass_1 = xp.sum(rejected_second, axis=-1, keepdims=True)  # M_1
    beta_1 = _ratio(hub_target, mass_1)
    hub_left = xp.maximum(hub_target - mass_1, xp.zeros_like(mass_1))  # q'_a
    mass_2 = xp.sum(rejected_first, axis=-1, keepdims=True)  # M_2
    beta_2 = _ratio(hub_left, mass_2)
    hub_final = xp.maximum(hub_left - mass_2, xp.zeros_like(mass_2))  # q''_a
    left = xp.where(others, left_2, hub * hub_final)
    return {"u": u, "v": v, "left": left, "beta_1": beta_1, "beta_2": beta_2, "hub": hub}


class SpecHub(TreeRule):
    """SpecHub's verification of its hub pairs (module docstring); lossless."""

    name: ClassVar[str] = "spechub"
    lossless: ClassVar[bool] = True
    lossless_at: ClassVar[Mapping[str, Any]] = {}
    schemes: ClassVar[tuple[str, ...]] = (HUB,)
    array_api: ClassVar[bool] = True
    support_only: ClassVar[bool] = True

    def sibling_accepts(self, target_probs, proposals, children):
        xp = namespace(target_probs)
        terms = hub_terms(target_probs, proposals[..., 0, :])
        first, second = children[..., 0], children[..., 1]
        first_is_hub = take_at(terms["hub"], first) > 0  # [..., 1]
        other = xp.where(first_is_hub, second[..., None], first[..., None])[..., 0]
        v = take_at(terms["v"], other)
        hub_first = (1.0 - v) * terms["beta_1"]
        hub_first_second = _ratio(v, 1.0 - hub_first)
        ones = xp.ones_like(v)
        hub_first_second = xp.where(hub_first < 1.0, hub_first_second, 0.0 * ones)
        one = xp.where(first_is_hub, hub_first, take_at(terms["u"], other))
        two = xp.where(first_is_hub, hub_first_second, terms["beta_2"] * ones)
        return xp.concat([one, two], axis=-1)

    def final_residual(self, target_probs, proposals, children):
        xp = namespace(target_probs)
        left = hub_terms(target_probs, proposals[..., 0, :])["left"]
        mass = xp.sum(left, axis=-1, keepdims=True)
        has_mass = mass > 0
        return xp.where(has_mass, left / xp.where(has_mass, mass, xp.ones_like(mass)), target_probs)

    def closed_form_law(self, target_probs, draft_probs, width, scheme):
        return target_probs

    def closed_form_acceptance(self, target_probs, draft_probs, width, scheme):
        xp = namespace(target_probs)
        return 1.0 - xp.sum(hub_terms(target_probs, draft_probs)["left"], axis=-1)
