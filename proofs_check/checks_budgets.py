"""Our guarantees, checked on exact emitted laws: cactus-exact and frontier stay within δ,
and δ = 0 is exactly SpS (the laws come from ``reference``, as in ``checks_laws``).
"""

from __future__ import annotations

import numpy as np

from cactus_theory import divergences, law, rules
from cactus_theory.core import gamma
from cactus_theory.core.verify import inverse_cdf, verify_block
from proofs_check import instances, reference, search
from proofs_check.checks_laws import BUDGET_VOCABS, LAW_VOCABS, chunk_deltas, search_budget
from proofs_check.claims import ROUNDING, Context, Worst, budget_tolerance, instance_dict, row

Array = np.ndarray


def check_cactus_exact_budget(context: Context) -> dict:
    """Every cactus-exact branch has D(h^n‖q) <= δ on full rows, for every divergence."""
    rng = context.rng("cactus-exact-budget")
    total = context.count(1500, 20_000)
    excess = Worst()
    with context.bar(total, "cactus-exact budgets") as bar:
        for batch, delta in chunk_deltas(rng, total, BUDGET_VOCABS, 200):
            count, vocab_size = batch.target.shape
            every_target = np.broadcast_to(
                batch.target[:, None, :], (count, vocab_size, vocab_size)
            )
            for name in divergences.NAMES:
                rule = rules.make("cactus-exact", delta=delta, divergence=name)
                adjusted = reference.all_branch_targets(rule, batch.target, batch.draft)
                value = divergences.rows(name, adjusted, every_target)  # [N, V]: D(h^n‖q)
                over = (value - delta) / budget_tolerance(delta)
                worst = over.max(axis=-1)
                excess.update(
                    worst,
                    worst > 1.0,
                    vocab_size,
                    lambda i, t=batch.target, n=name, v=value, o=over, dl=delta: instance_dict(
                        t[i],
                        delta=dl,
                        divergence=n,
                        token=int(np.argmax(o[i])),
                        value=float(v[i].max()),
                    ),
                )
            bar.update(count)
    found_max = _search_branch_over_budget(context, rng, excess)
    return {
        "rows": [
            row(
                "ours.cactus-exact.branch",
                "cactus-exact keeps every branch within budget: D(h^n‖q) ≤ δ for every drafted n, "
                "for D in KL, reverse KL, χ², squared Hellinger, TV, JS (full rows; tolerance "
                "1e-12·δ + 1e-15 for rounding; plus a scipy search over (q_n, δ)).",
                "ours",
                excess.holds,
                excess.count,
                {"max (D − δ)/tolerance": excess.value, "search max": found_max},
                excess.counterexample,
            )
        ]
    }


def _search_branch_over_budget(context: Context, rng: np.random.Generator, excess: Worst) -> float:
    """A scipy search over (logit q_n, log δ) for a cactus-exact branch above budget, per
    divergence (the binary reduction); returns the largest (D − δ)/tolerance found."""
    found_max = -np.inf
    for name in divergences.NAMES:

        def objective(points: Array, name=name) -> Array:
            q_n = 1.0 / (1.0 + np.exp(-points[:, 0]))
            deltas = np.exp(points[:, 1])
            values = np.empty(points.shape[0])
            for index in range(points.shape[0]):  # δ is a scalar per solve
                raised = gamma.exact_raised_mass(q_n[index], deltas[index], name)
                values[index] = float(divergences.binary(name, raised, q_n[index]))
            return (values - deltas) / budget_tolerance(deltas)

        value, point, evaluations = search.maximise_scalar(
            objective,
            [(-40.0, 40.0), (np.log(1e-8), np.log(50.0))],
            rng,
            random_points=context.count(150, 3000),
            polish_starts=context.count(1, 5),
            polish_evaluations=context.count(40, 300),
        )
        found_max = max(found_max, value)
        q_n, delta = 1.0 / (1.0 + np.exp(-point[0])), float(np.exp(point[1]))
        excess.update(
            [value],
            [value > 1.0],
            2,
            lambda _, q=q_n, d=delta, n=name: instance_dict([q, 1 - q], delta=d, divergence=n),
        )
        excess.count += evaluations - 1
    return found_max


def check_frontier_budget(context: Context) -> dict:
    """frontier's emitted law (by enumeration) is within δ, and equals its h."""
    rng = context.rng("frontier-budget")
    total = context.count(1500, 20_000)
    excess = Worst()
    identity = 0.0
    with context.bar(total, "frontier budget") as bar:
        for batch, delta in chunk_deltas(rng, total, BUDGET_VOCABS, 200):
            count, vocab_size = batch.target.shape
            rule = rules.make("frontier", delta=delta)
            emitted, _ = reference.enumerated_law(rule, batch.target, batch.draft)
            adjusted = rule.target_law(batch.target, batch.draft)
            identity = max(identity, float(np.abs(emitted - adjusted).max()))
            value = divergences.kl_rows(emitted / emitted.sum(axis=-1, keepdims=True), batch.target)
            over = (value - delta) / budget_tolerance(delta)
            excess.update(
                over,
                over > 1.0,
                vocab_size,
                lambda i, t=batch.target, d=batch.draft, v=value, dl=delta: instance_dict(
                    t[i], d[i], delta=dl, kl_emitted=float(v[i])
                ),
            )
            bar.update(count)
    for delta, vocab_size in ((0.05, 3), (0.5, 5)):
        rule = rules.make("frontier", delta=delta)

        def objective(target: Array, draft: Array, rule=rule, delta=delta) -> Array:
            emitted, _ = reference.enumerated_law(rule, target, draft)
            value = divergences.kl_rows(emitted / emitted.sum(axis=-1, keepdims=True), target)
            return (value - delta) / budget_tolerance(delta)

        found = search.maximise_over_pairs(objective, vocab_size, rng, **search_budget(context))
        excess.update(
            [found.value],
            [found.value > 1.0],
            vocab_size,
            lambda _, f=found, d=delta: instance_dict(f.target, f.draft, delta=d),
        )
        excess.count += found.evaluations - 1
    return {
        "rows": [
            row(
                "ours.frontier.budget",
                "frontier's emitted law (enumerated over drafts) is exactly its h and satisfies "
                "KL(emitted‖q) ≤ δ (tolerance 1e-12·δ + 1e-15; plus a scipy search).",
                "ours",
                excess.holds and identity <= ROUNDING,
                excess.count,
                {"max (KL − δ)/tolerance": excess.value, "max |emitted − h|": identity},
                excess.counterexample,
            )
        ]
    }


def check_delta_zero(context: Context) -> dict:
    """δ = 0 turns every Cactus rule and frontier into SpS, bit for bit."""
    rng = context.rng("delta-zero")
    total = context.count(1000, 10_000)
    sps = rules.make("sps")
    zero_rules = [rules.make("cactus", delta=0.0), rules.make("frontier", delta=0.0)] + [
        rules.make("cactus-exact", delta=0.0, divergence=name) for name in divergences.NAMES
    ]
    mismatch = Worst()
    law_gap = 0.0
    checked = 0
    with context.bar(total, "δ = 0 vs SpS") as bar:
        for batch in instances.batches(rng, total, LAW_VOCABS, 200):
            count, vocab_size = batch.target.shape
            target, draft = batch.target, batch.draft
            block = _random_block(rng, target, draft, steps=3)
            expected = _decisions(sps, target, draft, block)
            for rule in zero_rules:
                found = _decisions(rule, target, draft, block)
                different = [
                    key
                    for key in expected
                    if not all(
                        np.array_equal(a, b)
                        for a, b in zip(
                            _as_tuple(expected[key]), _as_tuple(found[key]), strict=True
                        )
                    )
                ]
                law_gap = max(
                    law_gap, float(np.abs(law.output_law_rows(rule, target, draft) - target).max())
                )
                mismatch.update(
                    [float(len(different))],
                    [bool(different)],
                    vocab_size,
                    lambda _, r=rule, k=different: {"rule": rules.spec_of(r), "differs_in": k},
                )
            checked += count
            bar.update(count)
    return {
        "rows": [
            row(
                "ours.delta0",
                "δ = 0 gives SpS bit for bit: cactus, cactus-exact (every divergence) and frontier "
                "have identical acceptance probabilities, targets and residuals, hence identical "
                "verify_block tokens under the same uniforms (exact laws equal q to rounding).",
                "ours",
                mismatch.holds,
                checked,
                {"arrays that differ": mismatch.violations, "max |law − q|": law_gap},
                mismatch.counterexample,
            )
        ]
    }


def _random_block(rng: np.random.Generator, target: Array, draft: Array, steps: int) -> tuple:
    """A verify block from rows [N, V]: (target [N, k+1, V], draft [N, k, V], draft ids
    [N, k] sampled from it, accept uniforms [N, k], sample uniforms [N]), k = ``steps``;
    position j of row i holds row i − j (rolled)."""
    count = target.shape[0]
    block_target = np.stack([np.roll(target, shift, axis=0) for shift in range(steps + 1)], 1)
    block_draft = np.stack([np.roll(draft, shift, axis=0) for shift in range(steps)], 1)
    draft_ids = inverse_cdf(block_draft, rng.random((count, steps)))
    accept_uniforms = rng.random((count, steps))
    sample_uniforms = rng.random(count)
    return block_target, block_draft, draft_ids, accept_uniforms, sample_uniforms


def _decisions(rule: rules.Rule, target: Array, draft: Array, block: tuple) -> dict:
    """Everything a rule decides on rows [N, V]: acceptance probabilities, targets and
    residuals of every drafted token, and ``verify_block``'s tokens on ``block`` (target
    [N, k+1, V], draft [N, k, V], draft ids, accept and sample uniforms)."""
    return {
        "accept": rule.accept_probs(target, draft),
        "targets": reference.all_branch_targets(rule, target, draft),
        "residuals": _all_residuals(rule, target, draft),
        "verify": verify_block(rule, *block),
    }


def _all_residuals(rule: rules.Rule, target: Array, draft: Array) -> Array:
    vocab_size = target.shape[-1]
    shape = target.shape[:-1] + (vocab_size, vocab_size)
    return rule.residuals_for(
        np.broadcast_to(target[..., None, :], shape).copy(),
        np.broadcast_to(draft[..., None, :], shape).copy(),
        np.broadcast_to(np.arange(vocab_size), shape[:-1]).copy(),
    )


def _as_tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)
