"""Speculative decoding with any rule, for Hugging Face causal LMs, batched, with KV caches.

``speculative_generate(verifier, draft, input_ids, rule=..., k=...)`` runs, per step,

    draft     the draft model proposes k_b = min(k, tokens row b still needs − 1) tokens,
              each sampled from its processed law p;
    verify    one verifier forward over [last, d_1..d_K] gives q at K + 1 positions;
    sample    ``sampler.verify`` accepts a prefix of each row's k_b drafts and emits one
              more token: the residual at the first rejection, or the bonus token from q
              after the row's last draft (a plain sample from q when k_b = 0);
    measure   the divergence meter records KL(μ ‖ q) of every emitted token
              (``sampler.divergence_meter``);
    commit    accepted drafts and the emitted token are committed left to right, up to
              EOS (kept), a ``stopping`` hook's True (kept) or max_new_tokens (exact);
              a ``streamer`` gets every column all rows have reached;
    roll back both KV caches drop the rejected slots (``cache``; nothing is recomputed);
    retire    finished rows leave the batch.

With ``tree=`` (``decode.tree_shape``) the step drafts a tree instead of a chain, and the
tree loop (``_tree_loop``) reads as its own list, each step a function of ``tree_steps``:

    draft tree    the draft expands a tree level by level (``tree_draft``);
    verify tree   one verifier forward over [root, nodes 1..N] under a 4D tree mask
                  (``tree_cache``): q at every node;
    walk          ``sampler.verify_tree`` walks each row's tree from the root with the tree
                  rule (a chain rule runs as its lift), measuring the emitted laws' KL;
    commit        the accepted path and the emitted token, as for chains;
    compact       both caches keep the root and the accepted path;
    retire        finished rows leave the batch.

Each step is a function of ``steps``, and the loop below reads as this list. The settings
both generate functions share are one ``settings.GenerationSettings``; the result and the
per-row record it is built from are in ``result``.

**Every row is decoded as it would be alone.** Its number of drafts, k_b, depends only on
the row (so its last token is always a plain verifier sample, law q, as at batch 1); its
randomness only on the generator; its cache on its own tokens. Both models see the same
processors (temperature, top-k, top-p; ``sampler.processors``), so the rule compares
exactly the law each draft was sampled from with the verifier's law after the same
processors. So a row's output law is the same at any batch size and batch composition.
temperature = 0 is greedy: both laws are one-hot, and a rule that puts no mass where the
verifier has none (sps, cactus, cactus-exact with KL or χ², frontier, pareto, tas, greedy,
topk with k = 1) accepts a draft iff it is the verifier's argmax and otherwise emits that
argmax, so the output equals the verifier's own greedy ``generate`` token for token.

**Ragged batches.** Each model keeps one rectangular cache of slots with a 0/1 slot mask
passed as the attention mask and explicit ``position_ids``; between forwards every row's
valid slots are contiguous and right-aligned (left padding), so slot distance equals
position distance and sliding-window attention sees each row exactly as alone (``cache``
explains the rollback and the right-alignment). A row with k_b < K drafts carries padding
drafts past its own; they are never verified, sit after its valid tokens (invisible to
them), and are rolled back. When a row accepts all K drafts, the draft model has not seen
d_K: the draft cache keeps it pending and feeds it first at the next step.

**Defaults like ``generate``.** ``eos_token_id=None`` takes the verifier's
``generation_config.eos_token_id`` (one id or a list; ``[]`` disables EOS), and
``pad_token_id=None`` its ``generation_config.pad_token_id``, else the first EOS id, else 0.
The prompt plus ``max_new_tokens`` must fit both models' context
(``max_position_embeddings``, ``n_positions``): beyond it learned positions have no
embedding and rotary ones extrapolate, so it is a ValueError.

Randomness: the draft tokens and the sampler's uniforms come from ``generator`` (a CPU
``torch.Generator`` keeps results identical across devices up to float rounding).
``autoregressive_generate`` is the plain baseline with the same preparation, interface
and result type, so speed-ups are measured side by side. ``verifier_nll`` scores generated
text under the verifier (the quality proxy).
"""

from __future__ import annotations

import torch

from cactus_theory import sampler
from cactus_theory.core import validate
from cactus_theory.core.rules.base import Rule
from cactus_theory.core.trees.base import DETERMINISTIC
from cactus_theory.decode import steps, tree_steps
from cactus_theory.decode.budget import KLBudget
from cactus_theory.decode.cache import (
    CachedModel,
    DraftCache,
    FeatureDraftCache,
    positions_of_prompt,
)
from cactus_theory.decode.checks import model_device, parse_rule
from cactus_theory.decode.feature_draft import FeatureDraft
from cactus_theory.decode.result import DecodeResult, Progress, StepLog, Stream
from cactus_theory.decode.settings import GenerationSettings, Prepared, prepare
from cactus_theory.decode.tree_auto import choose_tree
from cactus_theory.decode.tree_budget import TreeBudget
from cactus_theory.decode.tree_cache import check_tree_model
from cactus_theory.decode.tree_rules import tree_rule
from cactus_theory.decode.tree_shape import TreeShape, check_children, parse_tree
from cactus_theory.sampler.processors import process_logits
from cactus_theory.sampler.tree_meter import metered_exactly
from cactus_theory.sampler.tree_structure import TreeStructure
from cactus_theory.util.timing import Clock

Tensor = torch.Tensor

__all__ = ["DecodeResult", "autoregressive_generate", "speculative_generate", "verifier_nll"]


def device_clock(device: torch.device) -> Clock:
    """A ``Clock`` that waits for the device at both ends of every span (CUDA)."""
    if device.type == "cuda":
        return Clock(lambda: torch.cuda.synchronize(device))
    return Clock()


# --- speculative decoding --------------------------------------------------------------------


@torch.inference_mode()
def speculative_generate(
    verifier,
    draft,
    input_ids: Tensor,
    rule: Rule | str = "sps",
    k: int = 5,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    attention_mask: Tensor | None = None,
    pad_token_id: int | None = None,
    divergence: bool = True,
    max_kl: float | None = None,
    stopping=None,
    streamer=None,
    tree: str | TreeShape | None = None,
    children: str = DETERMINISTIC,
) -> DecodeResult:
    """Generate up to ``max_new_tokens`` per row with ``rule``, at most k drafts per step,
    or with ``tree`` a drafted tree per step.

    Parameters
    ----------
    verifier, draft : ``transformers`` causal LMs on one device with one output vocabulary.
    input_ids : [B, P] prompts, left-padded with ``attention_mask`` [B, P] (default all 1).
    rule : a rule object or a spec string (``"cactus:delta=1.0"``).
    k : the most drafts per verify step (row b drafts min(k, tokens it still needs − 1)).
    temperature, top_k, top_p : the processors both models' laws go through.
    eos_token_id, pad_token_id : None takes the verifier's generation config (module
        docstring); ``eos_token_id=[]`` never stops at EOS.
    generator : the source of every random draw (draft tokens and the sampler's uniforms).
    divergence : run the divergence meter (``DecodeResult.token_kl``;
        ``sampler.divergence_meter``).
    max_kl : cap every row's Σ_t KL(μ_t ‖ q_t) at this many nats (any rule;
        ``budget.KLBudget``), falling back to SpS when the budget is spent.
    stopping : ``stopping(row, generated) -> bool`` after every committed token; True
        finishes the row (``settings`` docstring).
    streamer : an object with ``put`` and ``end`` (transformers' ``BaseStreamer``), fed as
        ``generate()`` feeds it (``result.Stream``).
    tree : None (a chain of k drafts), or a tree shape: ``"4,2,1"`` (widths per depth),
        ``"dynamic:16"`` (EAGLE-2, 16 nodes), ``"auto"`` (``decode.tree_shape``); ``k`` is
        then not used. ``rule`` may be a tree rule, and a chain rule runs as its lift.
    children : how a tree's children are drafted: ``"deterministic"`` (the draft's top-K),
        ``"with-replacement"`` or ``"without-replacement"`` (sampled from p).

    Returns a ``DecodeResult``; see the module docstring for the method.
    """
    shape = parse_tree(tree)
    if shape is not None:
        return _tree_run(
            verifier, draft, input_ids, rule, shape, check_children(children, shape),
            GenerationSettings(
                max_new_tokens, temperature, top_k, top_p, eos_token_id, pad_token_id,
                generator, stopping, streamer, meter=divergence,
            ),
            attention_mask, max_kl,
        )  # fmt: skip
    rule = parse_rule(rule)
    k = validate.positive_int("k", k)
    if max_kl is not None and not divergence:
        raise ValueError("max_kl: needs the divergence meter (divergence=True)")
    settings = GenerationSettings(
        max_new_tokens, temperature, top_k, top_p, eos_token_id, pad_token_id, generator,
        stopping, streamer, meter=divergence,
    )  # fmt: skip
    prepared = prepare(verifier, draft, input_ids, attention_mask, settings)
    budget = None if max_kl is None else KLBudget(rule, max_kl, prepared.batch, prepared.device)
    return _speculative_loop(verifier, draft, prepared, rule, k, budget)


def _speculative_loop(
    verifier, draft, prepared: Prepared, rule: Rule, k: int, budget: KLBudget | None
) -> DecodeResult:
    """The speculative loop: draft, verify, sample, measure, commit, roll back, retire."""
    clock = device_clock(prepared.device)
    progress = Progress.of(prepared)
    stream = Stream(prepared.streamer, prepared)
    log = StepLog(prepared.batch)
    target = CachedModel(verifier, prepared.batch, prepared.device)
    kind = FeatureDraftCache if isinstance(draft, FeatureDraft) else DraftCache
    drafter = kind(draft, prepared.batch, prepared.device)
    active = steps.start(prepared, target, drafter, clock)

    while not all(progress.finished):
        num_drafts = steps.draft_counts(progress, active, k)  # [A] k_b
        with clock("draft"):  # [A, K], [A, K, V]
            draft_ids, draft_probs = steps.draft_tokens(drafter, active, num_drafts, prepared)
        with clock("verify"):  # [A, K+1, V], [A, K+1, H] or None
            target_probs, features = steps.verifier_forward(
                target, active, draft_ids, prepared, drafter.needs_features
            )
        rules_per_row, measured = [rule] * len(num_drafts), None
        if budget is not None:  # each row's δ this step, and its KL at every drafted position
            with clock("meter"):
                measured = budget.choose(active.rows, target_probs, draft_probs, num_drafts)
            rules_per_row = measured.rules
        with clock("sampler"):  # [A, K+1], [A]
            tokens, accepted = steps.sample(
                rules_per_row, target_probs, draft_probs, draft_ids, num_drafts, prepared.generator
            )
        if prepared.meter:
            with clock("meter"):
                if measured is None:
                    measured = steps.measure(
                        rules_per_row, target_probs, draft_probs, accepted, num_drafts
                    )
        log.record(active.rows, accepted, num_drafts)
        realised = steps.commit(progress, active, tokens, accepted, num_drafts, measured)
        stream.push(progress)
        if budget is not None:
            budget.spend(
                active.rows, torch.tensor(realised, dtype=torch.float64, device=prepared.device)
            )
        steps.rollback(target, drafter, draft_ids, accepted, active, features)
        steps.retire(progress, active, [target, drafter])

    stream.end(progress)
    timing = clock.finish(verifier_calls=log.verifier_calls, draft_calls=drafter.calls)
    return progress.result(prepared, *log.stacked(), timing)


# --- tree decoding ----------------------------------------------------------------------------


def _tree_run(verifier, draft, input_ids, rule, shape, scheme, settings, attention_mask, max_kl):
    """Check and prepare a tree run, then loop (``speculative_generate`` with ``tree``)."""
    rule = tree_rule(rule, scheme)
    if max_kl is not None and not settings.meter:
        raise ValueError("max_kl: needs the divergence meter (divergence=True)")
    if settings.meter and not metered_exactly(rule, scheme):
        raise ValueError(
            f"divergence: the exact law of {rule.label} with {scheme} children is an "
            "expectation over the drafted tuples (V^K of them), which the meter does not "
            "compute; pass divergence=False, deterministic children or a lossless rule"
        )
    prepared = prepare(verifier, draft, input_ids, attention_mask, settings)
    longest = int(prepared.mask.sum(dim=1).max()) + prepared.max_new_tokens
    check_tree_model("verifier", verifier, longest)
    check_tree_model("draft", draft, longest)
    if shape.auto is not None:
        shape = choose_tree(verifier, draft, prepared, rule, scheme, shape).shape
    budget = None if max_kl is None else TreeBudget(rule, scheme, max_kl, prepared)
    return _tree_loop(verifier, draft, prepared, rule, shape, scheme, budget)


def _tree_loop(
    verifier, draft, prepared: Prepared, rule, shape: TreeShape, scheme: str, budget
) -> DecodeResult:
    """The tree loop: draft tree, verify tree, walk, measure, commit, compact, retire."""
    clock = device_clock(prepared.device)
    progress = Progress.of(prepared)
    stream = Stream(prepared.streamer, prepared)
    log = StepLog(prepared.batch, shape.depth)
    target = CachedModel(verifier, prepared.batch, prepared.device)
    kind = FeatureDraftCache if isinstance(draft, FeatureDraft) else DraftCache
    drafter = kind(draft, prepared.batch, prepared.device)
    active = steps.start(prepared, target, drafter, clock)
    streams = tree_steps.RowStreams(prepared.generator, prepared.batch, prepared.device)
    plan = tree_steps.plan(shape)

    while not all(progress.finished):
        limits = tree_steps.depth_limits(progress, active, shape.depth)  # [A] k_b
        with clock("draft"):  # tokens, parents [A, N+1]
            tree = tree_steps.draft(drafter, active, plan, scheme, limits, prepared, streams)
            structure = TreeStructure.of(tree.parents)
        with clock("verify"):  # [A, N+1, V], [A, N+1, H] or None
            target_probs, features = tree_steps.verify_forward(
                target, active, tree, structure, prepared, drafter.needs_features
            )
        uniforms = streams.walk_uniforms(active.rows, shape.depth)  # [A, D], [A]
        rules_per_row, measured = [rule] * len(active.rows), None
        if budget is not None:  # each row's rule this step, and its KL at every node
            with clock("meter"):
                rules_per_row = budget.choose(active.rows, target_probs, tree, structure)
        with clock("sampler"):  # the path, its tokens, the emitted token (and their laws' KL)
            walked = tree_steps.walk(
                rules_per_row, target_probs, tree, structure, scheme, uniforms, prepared.meter
            )
        if prepared.meter:
            measured = tree_steps.measure(walked, rules_per_row)
        log.record(active.rows, walked.num_accepted, structure.real.sum(dim=1) - 1)
        log.record_tree(active.rows, walked.outcomes, walked.num_children)
        verified = torch.full_like(walked.num_accepted, walked.outcomes.shape[1])  # [A]
        realised = steps.commit(
            progress, active, walked.token_ids, walked.num_accepted, verified, measured
        )
        stream.push(progress)
        if budget is not None:
            budget.spend(active.rows, realised)
        tree_steps.compact(target, drafter, tree, walked, active, features)
        steps.retire(progress, active, [target, drafter])

    stream.end(progress)
    timing = clock.finish(verifier_calls=log.verifier_calls, draft_calls=drafter.calls)
    return progress.result(prepared, *log.stacked(), timing, tree=log.tree())


# --- the autoregressive baseline -------------------------------------------------------------


@torch.inference_mode()
def autoregressive_generate(
    verifier,
    draft=None,
    input_ids: Tensor | None = None,
    rule: Rule | str | None = None,
    k: int | None = None,
    *,
    attention_mask: Tensor | None = None,
    divergence: bool = True,
    max_kl: float | None = None,
    **settings,
) -> DecodeResult:
    """Plain decoding with the verifier alone; same preparation, keywords and result.

    ``settings`` are the generation keywords ``speculative_generate`` takes, with the same
    meaning and defaults (``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``,
    ``eos_token_id``, ``pad_token_id``, ``generator``, ``stopping``, ``streamer``:
    ``settings.GenerationSettings``);
    any other is a ValueError. ``draft``, ``rule``, ``k`` and ``max_kl`` are accepted and
    ignored, so the two functions can be swapped in a benchmark. One token per verifier
    call, drawn by inverse CDF from the processed law with a uniform from ``generator``;
    every token's law is q, so the meter reads 0 (``token_kl`` is zeros when
    ``divergence`` is on).
    """
    settings = GenerationSettings.from_keywords(settings, meter=divergence)
    prepared = prepare(verifier, None, input_ids, attention_mask, settings)
    clock = device_clock(prepared.device)
    progress = Progress.of(prepared)
    stream = Stream(prepared.streamer, prepared)
    model = CachedModel(verifier, prepared.batch, prepared.device)
    active = steps.start(prepared, model, None, clock)
    verifier_calls = 0
    while not all(progress.finished):
        verifier_calls += 1
        with clock("verify"):
            last = active.last[:, None]  # [A, 1]
            logits = model.forward(last, torch.ones_like(last), (active.count - 1)[:, None])
            law = process_logits(logits[:, -1], prepared.processors)  # [A, V]
        with clock("sampler"):
            uniforms = steps.uniforms(len(law), prepared.generator, law.device)  # [A]
            token = sampler.inverse_cdf(law, uniforms)  # [A]
        for row, value in zip(active.rows.tolist(), token.tolist(), strict=True):
            progress.commit(row, [value], [0.0], [0.0])
        stream.push(progress)
        active.last, active.count = token, active.count + 1
        steps.retire(progress, active, [model])
    stream.end(progress)
    timing = clock.finish(verifier_calls=verifier_calls, draft_calls=0)
    return progress.result(prepared, *StepLog(prepared.batch).stacked(), timing)


# --- the quality proxy -----------------------------------------------------------------------


@torch.inference_mode()
def verifier_nll(verifier, result: DecodeResult, attention_mask: Tensor | None = None) -> float:
    """Mean negative log-likelihood (nats/token) of the generated tokens under the verifier's
    raw distribution (temperature 1, no truncation), given each row's prompt."""
    device = model_device(verifier, "verifier")
    sequences = result.sequences.to(device)
    batch, total = sequences.shape
    prompt = result.prompt_length
    mask = torch.ones(batch, total, dtype=torch.int64, device=device)
    if attention_mask is not None:
        mask[:, :prompt] = attention_mask.to(device, torch.int64)
    generated = torch.arange(total, device=device)[None] - prompt
    scored = (generated >= 0) & (generated < result.num_generated.to(device)[:, None])
    mask = mask * ((generated < 0) | scored)
    positions = positions_of_prompt(mask)
    logits = verifier(input_ids=sequences, attention_mask=mask, position_ids=positions).logits
    log_probs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = log_probs.gather(-1, sequences[:, 1:, None])[..., 0]
    weights = scored[:, 1:].float()
    return float(-(picked * weights).sum() / weights.sum().clamp(min=1.0))
