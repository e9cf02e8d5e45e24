"""The exact law of the emitted token at one verification position (no sampling).

Enumerate the drafted token n ~ p and add the two branches:

    out = Σ_n p_n [ a_n e_n + (1 − a_n) r^n ],

with a_n the acceptance probability and r^n the residual law of the rule for draft n.
``output_law_enumerated`` does exactly this with the public per-token API (O(V²), the
reference). ``output_law`` computes the same sum in closed form per rule family, batched
over any leading axes:

- target rules (h independent of n): Σ_n p_n a_n e_n = min(p, h) and the rejection mass
  Σ_n p_n (1 − a_n) = Σ (h − p)_+ multiplies r = (h − p)_+/Σ(h − p)_+, so out = h exactly.
- branch rules (h^n_n = γ_n, h^n_i = s_n q_i with s_n = (1 − γ_n)/(1 − q_n)): when n is
  rejected γ_n < p_n, so r^n_n = 0 and r^n_i = q_i (s_n − ρ_i)_+ / Z_n for i ≠ n, where
  ρ_i = p_i/q_i and Z_n = Σ_{i≠n} q_i (s_n − ρ_i)_+. With c_n = p_n (1 − a_n)/Z_n,

      out_i = p_i a_i + q_i [ Σ_n c_n (s_n − ρ_i)_+ − c_i (s_i − ρ_i)_+ ],

  and both hinge sums come from one merge-sort of (ρ, s) per row: O(V log V), not O(V²).
- decision rules: out = p ⊙ accept + (Σ p ⊙ (1 − accept)) · recovery.
- the general family (a_n and r^n any functions of (q, p, n)): the rule's own closed form
  when it defines one (``emitted_law(target_probs, draft_probs)``, e.g. SGLang's threshold
  rule, O(V); ``cactus_theory.testing`` checks it against the enumerated sum), else the
  sum itself, batched:
  out = p ⊙ a + Σ_{n: p_n (1 − a_n) > 0} p_n (1 − a_n) r^n, with the residuals of every
  drafted token that can be rejected computed in one call per chunk of rows
  (``general_rule_law``; O(V·m) per row for m such tokens, so O(V²) for a full-support
  draft, O(V·k) after top-k).

Which closed form applies is ``rules.exact_family(rule)``: a family subclass that overrides
one of the family's derived methods goes through the general path, so the law is always
the sum of what the rule's own methods say.

``acceptance`` is Σ_n p_n a_n. Inputs are validated; shapes [V] or [..., V].

``frontier_gap`` compares any rule with the frontier at the rule's own emitted divergence,
row by row: no scheme whose emitted law μ has KL(μ‖q) <= K accepts more than the frontier
with δ = K (maximal coupling), so the gap is >= 0 for every rule, and 0 only on the frontier.
``pool_frontier_gap`` does the same for a pool's means (``core.pool_frontier``: the most
mean acceptance any rule reaches at a mean KL per position), the Pareto gap of a rule
averaged over real or synthetic contexts.
"""

from __future__ import annotations

import numpy as np

from cactus_theory.core import divergences, validate
from cactus_theory.core.rules.base import Rule, branch_scale, exact_family
from cactus_theory.core.rules.frontier import frontier_target

Array = np.ndarray


def _rule(rule: object) -> Rule:
    if not isinstance(rule, Rule):
        raise ValueError(f"rule: expected a rule from rules.make(...), got {type(rule).__name__}")
    return rule


def output_law(rule: Rule, target: object, draft: object) -> Array:
    """[..., V]: the exact law of the token emitted at one position (drafted token ~ draft)."""
    target_probs, draft_probs = validate.pair(target, draft)
    return output_law_rows(_rule(rule), target_probs, draft_probs)


def acceptance(rule: Rule, target: object, draft: object) -> float | Array:
    """P(the drafted token is accepted) = Σ_n p_n a_n; a float for one row."""
    target_probs, draft_probs = validate.pair(target, draft)
    values = acceptance_rows(_rule(rule), target_probs, draft_probs)
    return float(values) if values.ndim == 0 else values


def acceptance_rows(rule: Rule, target_probs: Array, draft_probs: Array) -> Array:
    """Σ_n p_n a_n on validated rows (no validation)."""
    return (draft_probs * rule.accept_probs(target_probs, draft_probs)).sum(axis=-1)


def output_law_rows(rule: Rule, target_probs: Array, draft_probs: Array) -> Array:
    """``output_law`` on validated float64 rows (no validation)."""
    family = exact_family(rule)
    if family == "target":
        return target_rule_law(rule.target_law(target_probs, draft_probs), draft_probs)
    if family == "branch":
        raised = rule.raised_masses(target_probs, draft_probs, cap=draft_probs)
        return branch_rule_law(raised, target_probs, draft_probs)
    if family == "decision":
        return decision_rule_law(
            rule.accept_mask(target_probs), rule.recovery(target_probs), draft_probs
        )
    closed = getattr(type(rule), "emitted_law", None)
    if callable(closed):  # a general rule's own closed form (the kit holds it to the sum)
        return np.asarray(rule.emitted_law(target_probs, draft_probs), dtype=np.float64)
    return general_rule_law(rule, target_probs, draft_probs)


#: The general law computes residuals for at most this many (row, token, vocabulary)
#: entries at a time.
GENERAL_CHUNK_ELEMENTS = 1 << 22


def general_rule_law(rule: Rule, target_probs: Array, draft_probs: Array) -> Array:
    """out = p ⊙ a + Σ_n p_n (1 − a_n) r^n on rows [..., V], by batched enumeration of the
    drafted tokens n that can be rejected (p_n (1 − a_n) > 0). What ``residuals_for``
    returns is a law within 1e-9 (``rules.contract`` refuses anything else, naming the
    rule); each r^n is then divided by its sum, which removes only that rounding (the
    sampler draws by inverse CDF scaled to the row total: the same law)."""
    shape = target_probs.shape
    vocab = shape[-1]
    target = target_probs.reshape(-1, vocab)  # [R, V]
    draft = draft_probs.reshape(-1, vocab)  # [R, V]
    accept = np.asarray(rule.accept_probs(target, draft), dtype=np.float64)  # [R, V] a_n
    out = draft * accept
    weight = draft * (1.0 - accept)  # [R, V] p_n (1 − a_n): mass of each rejected branch
    rejectable = weight > 0
    counts = rejectable.sum(axis=-1)  # [R] rejectable tokens per row
    order = np.argsort(~rejectable, axis=-1, kind="stable")  # rejectable tokens first
    most = int(counts.max()) if counts.size else 0
    rows_per_chunk = max(1, GENERAL_CHUNK_ELEMENTS // (vocab * max(1, most)))
    for start in range(0, target.shape[0], rows_per_chunk):
        rows = slice(start, start + rows_per_chunk)
        width = int(counts[rows].max())
        columns = max(1, GENERAL_CHUNK_ELEMENTS // (vocab * target[rows].shape[0]))
        for column in range(0, width, columns):
            tokens = order[rows, column : column + columns]  # [r, m] drafted tokens n
            branch = np.take_along_axis(weight[rows], tokens, axis=-1)  # [r, m] p_n (1 − a_n)
            size = (tokens.shape[0], tokens.shape[1], vocab)
            residual = np.asarray(
                rule.residuals_for(
                    np.broadcast_to(target[rows, None, :], size),
                    np.broadcast_to(draft[rows, None, :], size),
                    tokens,
                ),
                dtype=np.float64,
            )  # [r, m, V] r^n
            residual = np.broadcast_to(residual, size)
            total = residual.sum(axis=-1, keepdims=True)
            normalised = np.where(total > 0, residual / np.where(total > 0, total, 1.0), 0.0)
            out[rows] += np.einsum("rm,rmv->rv", branch, normalised)
    return out.reshape(shape)


def target_rule_law(adjusted: Array, draft_probs: Array) -> Array:
    """min(p, h) + (h − p)_+  (= h): generalised SpS with an n-independent target h."""
    return np.minimum(draft_probs, adjusted) + np.maximum(adjusted - draft_probs, 0.0)


def decision_rule_law(accept: Array, recovery: Array, draft_probs: Array) -> Array:
    """p ⊙ 1[accept] + P(reject) · recovery."""
    accepted = np.where(accept, draft_probs, 0.0)
    rejected = draft_probs.sum(axis=-1, keepdims=True) - accepted.sum(axis=-1, keepdims=True)
    return accepted + np.maximum(rejected, 0.0) * recovery


def hinge_sums(
    thresholds: Array, weights: Array, weighted_thresholds: Array, queries: Array
) -> Array:
    """Σ_i w_i (x_j − t_i)_+ for every query x_j, per row, by one merged sort.

    ``weighted_thresholds`` is w_i t_i, passed in so that t_i = +inf with w_i = 0 (a token
    with q = 0) contributes nothing instead of inf · 0. Ties contribute 0 either way.
    """
    size = thresholds.shape[-1]
    keys = np.concatenate([thresholds, queries], axis=-1)
    order = np.argsort(keys, axis=-1, kind="stable")
    pad = np.zeros_like(queries)
    cum_weights = np.cumsum(np.take_along_axis(np.concatenate([weights, pad], -1), order, -1), -1)
    cum_products = np.cumsum(
        np.take_along_axis(np.concatenate([weighted_thresholds, pad], -1), order, -1), -1
    )
    position = np.empty_like(order)
    np.put_along_axis(position, order, np.broadcast_to(np.arange(keys.shape[-1]), keys.shape), -1)
    at_query = position[..., size:]
    below_weight = np.take_along_axis(cum_weights, at_query, -1)
    below_product = np.take_along_axis(cum_products, at_query, -1)
    return np.maximum(queries * below_weight - below_product, 0.0)


def branch_rule_law(raised: Array, target_probs: Array, draft_probs: Array) -> Array:
    """Exact emitted law for a branch rule with raised masses γ [..., V] (module docstring).

    ``raised`` may be capped at p (min(γ_n, p_n)): accepted branches contribute p_n e_n
    whatever their γ_n, and rejected ones have γ_n < p_n, so the cap changes nothing.
    Tokens with q_i = 0 (or p_i/q_i beyond float range) never receive residual mass.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = np.where(target_probs > 0, draft_probs / target_probs, np.inf)
        accept = np.where(draft_probs > 0, np.minimum(1.0, raised / draft_probs), 0.0)
    scale = branch_scale(raised, target_probs)
    support = np.isfinite(ratio)
    finite_ratio = np.where(support, ratio, 0.0)
    # Z_n = Σ_i q_i (s_n − ρ_i)_+ minus the i = n term (0 when n is rejected: γ_n < p_n).
    weighted_ratio = np.where(support, draft_probs, 0.0)
    own_hinge = np.where(support, target_probs * np.maximum(scale - finite_ratio, 0.0), 0.0)
    residual_mass = hinge_sums(ratio, target_probs, weighted_ratio, scale) - own_hinge
    rejected = draft_probs * (1.0 - accept)
    with np.errstate(divide="ignore", invalid="ignore"):
        coeff = np.where((rejected > 0) & (residual_mass > 0), rejected / residual_mass, 0.0)
    # G(ρ_i) = Σ_n c_n (s_n − ρ_i)_+, a hinge sum "from above" (negated thresholds), so
    # a ρ_i above every s_n gives exactly 0 rather than a cancellation.
    spread = hinge_sums(-scale, coeff, -coeff * scale, -finite_ratio)
    own = coeff * np.maximum(scale - finite_ratio, 0.0)
    from_rejections = np.where(support, target_probs * np.maximum(spread - own, 0.0), 0.0)
    return draft_probs * accept + from_rejections


def output_law_enumerated(rule: Rule, target: object, draft: object) -> Array:
    """Reference law for one row: loop over n with the public per-token API (O(V²))."""
    target_probs, draft_probs = validate.pair(target, draft)
    if target_probs.ndim != 1:
        raise ValueError(f"target: expected one row [V], got shape {target_probs.shape}")
    law = np.zeros_like(target_probs)
    for token in np.flatnonzero(draft_probs > 0):
        accept = _rule(rule).accept_prob(target=target_probs, draft=draft_probs, token=int(token))
        law[token] += draft_probs[token] * accept
        if accept < 1.0:
            residual = rule.residual(target=target_probs, draft=draft_probs, token=int(token))
            law += draft_probs[token] * (1.0 - accept) * residual
    return law


def adjusted_targets(rule: Rule, target: object, draft: object) -> Array:
    """[V, V]: row n is the h the rule targets when n is drafted (one (q, p) row; O(V²)).

    Rows for tokens with p_n = 0 are still filled (what h would be), which is what the
    per-branch divergence checks need.
    """
    target_probs, draft_probs = validate.pair(target, draft)
    if target_probs.ndim != 1:
        raise ValueError(f"target: expected one row [V], got shape {target_probs.shape}")
    size = target_probs.shape[-1]
    every = np.broadcast_to(target_probs, (size, size))
    return _rule(rule).targets_for(
        every, np.broadcast_to(draft_probs, (size, size)), np.arange(size)
    )


def branch_divergence(rule: Rule, target: object, draft: object, divergence: str = "kl") -> Array:
    """[..., V]: D(h^n‖q) for every drafted n, the per-branch budget Cactus promises.

    Branch rules use the exact reduction D(h^n‖q) = D((γ_n, 1−γ_n)‖(q_n, 1−q_n)); target
    rules have one h for all n. Decision rules and the general family have no target in
    this sense (ValueError naming the family).
    """
    target_probs, draft_probs = validate.pair(target, draft)
    rule = _rule(rule)
    family = exact_family(rule)
    if family == "branch":
        raised = rule.raised_masses(target_probs, draft_probs)
        return divergences.binary(divergence, raised, target_probs)
    if family == "target":
        value = divergences.rows(
            divergence, rule.target_law(target_probs, draft_probs), target_probs
        )
        return np.broadcast_to(value[..., None], target_probs.shape).copy()
    raise ValueError(
        f"rule: {rule.name} is a {family} rule; only target and branch rules have a "
        "per-branch target h (use emitted_divergence for the law it emits)"
    )


def emitted_divergence(
    rule: Rule, target: object, draft: object, divergence: str = "kl"
) -> float | Array:
    """D(emitted law ‖ q): how far what the rule actually emits is from the verifier."""
    target_probs, draft_probs = validate.pair(target, draft)
    law = output_law_rows(_rule(rule), target_probs, draft_probs)
    values = divergences.rows(divergence, law / law.sum(axis=-1, keepdims=True), target_probs)
    return float(values) if values.ndim == 0 else values


def frontier_acceptance(target: object, draft: object, budget: object) -> float | Array:
    """A*(δ) = max Σ min(p, h) over h with KL(h‖q) <= δ, per row, for a budget per row
    (``budget`` broadcast against the rows' leading shape; +inf gives 1: h = p)."""
    target_probs, draft_probs = validate.pair(target, draft)
    delta = np.broadcast_to(np.asarray(budget, dtype=np.float64), target_probs.shape[:-1])
    if np.any(np.isnan(delta)) or np.any(delta < 0):
        raise ValueError("budget: must be >= 0 (nats), one per row or one for all")
    finite = np.where(np.isfinite(delta), delta, 0.0)
    best = frontier_target(target_probs, draft_probs, finite)
    values = np.where(np.isfinite(delta), np.minimum(draft_probs, best).sum(axis=-1), 1.0)
    return float(values) if values.ndim == 0 else values


def frontier_gap(rule: Rule, target: object, draft: object) -> float | Array:
    """A*(K) − A per row: the frontier's acceptance at the rule's own emitted KL
    K = KL(μ‖q) minus the rule's acceptance A (module docstring); >= 0 up to rounding."""
    target_probs, draft_probs = validate.pair(target, draft)
    rule = _rule(rule)
    emitted = output_law_rows(rule, target_probs, draft_probs)
    emitted = emitted / emitted.sum(axis=-1, keepdims=True)
    spent = divergences.rows("kl", emitted, target_probs)
    best = frontier_acceptance(target_probs, draft_probs, spent)
    values = best - acceptance_rows(rule, target_probs, draft_probs)
    return float(values) if np.ndim(values) == 0 else values


def pool_frontier_gap(rule: Rule, target: object, draft: object) -> float:
    """A*(K̄) − Ā over a pool of rows [N, V]: the pool frontier's mean acceptance at the
    rule's mean emitted KL K̄ minus the rule's mean acceptance Ā (``core.pool_frontier``);
    >= 0 up to rounding for every rule. A rule with infinite mean KL is compared with
    acceptance 1 (an infinite budget allows h = p)."""
    from cactus_theory.core import pool_frontier

    target_probs, draft_probs = validate.pair(target, draft)
    rule = _rule(rule)
    emitted = output_law_rows(rule, target_probs, draft_probs)
    emitted = emitted / emitted.sum(axis=-1, keepdims=True)
    mean_kl = float(np.mean(divergences.rows("kl", emitted, target_probs)))
    mean_acceptance = float(np.mean(acceptance_rows(rule, target_probs, draft_probs)))
    if not np.isfinite(mean_kl):
        return 1.0 - mean_acceptance
    best = pool_frontier.frontier_acceptance(target_probs, draft_probs, mean_kl)
    return best - mean_acceptance
