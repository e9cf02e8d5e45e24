"""Speculative decoding with any rule, for Hugging Face causal LMs, batched, with KV caches.

``speculative_generate(verifier, draft, input_ids, rule=..., k=...)`` runs, per step,

    draft     the draft model proposes k_b = min(k, tokens row b still needs − 1) tokens,
              each sampled from its processed law p;
    verify    one verifier forward over [last, d_1..d_K] gives q at K + 1 positions;
    sample    ``sampler.verify`` accepts a prefix of each row's k_b drafts and emits one
              more token: the residual at the first rejection, or the bonus token from q
              after the row's last draft (a plain sample from q when k_b = 0);
    measure   the divergence meter records KL(μ ‖ q) of every emitted token (``meter``);
    commit    accepted drafts and the emitted token are committed left to right, up to
              EOS (kept) or max_new_tokens (exact);
    roll back both KV caches drop the rejected slots (``cache``; nothing is recomputed);
    retire    finished rows leave the batch.

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

import math
import time
from dataclasses import dataclass, field

import torch

from cactus_theory import sampler
from cactus_theory.core import validate
from cactus_theory.core.processors import SamplingSettings
from cactus_theory.core.rules.base import Rule
from cactus_theory.decode.budget import KLBudget
from cactus_theory.decode.cache import (
    CachedModel,
    DraftCache,
    FeatureDraftCache,
    positions_of_prompt,
)
from cactus_theory.decode.checks import (
    check_context,
    check_generator,
    check_inputs,
    eos_ids,
    model_device,
    parse_rule,
    resolve_pad_id,
    sampling_settings,
    vocab_size,
)
from cactus_theory.decode.feature_draft import FeatureDraft
from cactus_theory.sampler.divergence_meter import StepDivergence, positions_below, step_divergence
from cactus_theory.sampler.processors import process_logits

Tensor = torch.Tensor


@dataclass
class DecodeResult:
    """What a generate call returns.

    sequences: [B, P + T] the prompts (as given, left-padded) followed by the generated
    tokens, finished rows padded with ``pad_token_id`` (T = the longest generation).
    num_generated: [B] tokens generated per row (EOS included). accepted_lengths:
    [steps, B] accepted drafts per verify step per row (−1 where the row was not active;
    empty for the baseline); draft_counts: [steps, B] the drafts k_b each row verified.
    token_kl, token_tv: [B, T] float64 KL(μ_t ‖ q_t) and TV(μ_t, q_t) of every generated
    token (0 for bonus and plain tokens and past num_generated; None when the meter is
    off); ``sequence_kl`` and ``sequence_tv`` are their per-row sums (``meter`` says what
    they estimate). timing: seconds (``total``, ``prefill``, ``draft``, ``verify``,
    ``sampler``, ``meter``) and counts (``verifier_calls``, ``draft_calls``).
    eos_token_id, pad_token_id: the ids used (after the generation-config defaults).
    """

    sequences: Tensor
    prompt_length: int
    num_generated: Tensor
    accepted_lengths: Tensor
    draft_counts: Tensor
    token_kl: Tensor | None = None
    token_tv: Tensor | None = None
    timing: dict = field(default_factory=dict)
    eos_token_id: list[int] = field(default_factory=list)
    pad_token_id: int = 0

    @property
    def new_tokens(self) -> list[list[int]]:
        """The generated tokens of each row (without padding)."""
        ends = self.num_generated.tolist()
        rows = self.sequences[:, self.prompt_length :].tolist()
        return [row[:end] for row, end in zip(rows, ends, strict=True)]

    @property
    def total_tokens(self) -> int:
        return int(self.num_generated.sum())

    @property
    def tokens_per_second(self) -> float:
        return self.total_tokens / max(self.timing.get("total", 0.0), 1e-12)

    @property
    def mean_accepted(self) -> float:
        """Mean accepted drafts per verify step (over active rows)."""
        valid = self.accepted_lengths[self.accepted_lengths >= 0]
        return float(valid.float().mean()) if valid.numel() else 0.0

    @property
    def acceptance_length(self) -> float:
        """AL as in the paper: mean accepted drafts per verify step (bonus token excluded)."""
        return self.mean_accepted

    @property
    def tokens_per_call(self) -> float:
        """Tokens emitted per verifier call: AL + 1 (the residual or bonus token)."""
        return 1.0 + self.mean_accepted

    @property
    def sequence_kl(self) -> Tensor | None:
        """[B] Σ_t KL(μ_t ‖ q_t) per row (nats)."""
        return None if self.token_kl is None else self.token_kl.sum(dim=1)

    @property
    def sequence_tv(self) -> Tensor | None:
        """[B] Σ_t TV(μ_t, q_t) per row."""
        return None if self.token_tv is None else self.token_tv.sum(dim=1)

    @property
    def kl_per_token(self) -> float | None:
        """Σ over rows of sequence_kl / Σ num_generated: nats per generated token."""
        if self.token_kl is None:
            return None
        return float(self.token_kl.sum()) / max(self.total_tokens, 1)


# --- preparation shared by both generate functions -------------------------------------------


@dataclass
class Prepared:
    """Validated inputs and the settings both generate functions share."""

    input_ids: Tensor  # [B, P]
    mask: Tensor  # [B, P] left-padding mask
    settings: SamplingSettings
    eos: list[int]
    pad_id: int
    device: torch.device
    vocab: int
    max_new_tokens: int
    generator: torch.Generator | None


def prepare(
    verifier,
    draft,
    input_ids,
    attention_mask,
    max_new_tokens,
    temperature,
    top_k,
    top_p,
    eos_token_id,
    pad_token_id,
    generator,
) -> Prepared:
    """Validate every argument (ValueError naming it) and resolve the defaults."""
    settings = sampling_settings(temperature, top_k, top_p)
    check_generator(generator)
    device = model_device(verifier, "verifier")
    vocab = vocab_size(verifier)
    if draft is not None:
        if model_device(draft, "draft") != device:
            raise ValueError(f"draft: on {model_device(draft, 'draft')}, verifier on {device}")
        if vocab_size(draft) != vocab:
            raise ValueError(
                f"draft: vocabulary size {vocab_size(draft)} differs from the verifier's {vocab}"
            )
    ids, mask = check_inputs(input_ids, attention_mask, max_new_tokens, vocab, device)
    for name, model in (("verifier", verifier), ("draft", draft)):
        if model is not None:
            check_context(name, model, mask, max_new_tokens)
    config = getattr(verifier, "generation_config", None)
    if eos_token_id is None:
        eos_token_id = getattr(config, "eos_token_id", None)
    eos = eos_ids(eos_token_id, vocab)
    if pad_token_id is None:
        pad_token_id = getattr(config, "pad_token_id", None)
    pad_id = resolve_pad_id(pad_token_id, eos, vocab)
    return Prepared(ids, mask, settings, eos, pad_id, device, vocab, max_new_tokens, generator)


class Progress:
    """Per original row: committed tokens, their KL and TV, and whether it has finished."""

    def __init__(self, batch: int, max_new_tokens: int, eos: list[int], metered: bool) -> None:
        self.generated: list[list[int]] = [[] for _ in range(batch)]
        self.kl: list[list[float]] | None = [[] for _ in range(batch)] if metered else None
        self.tv: list[list[float]] | None = [[] for _ in range(batch)] if metered else None
        self.finished = [max_new_tokens == 0] * batch
        self.max_new_tokens = max_new_tokens
        self.eos = set(eos)

    def remaining(self, row: int) -> int:
        return self.max_new_tokens - len(self.generated[row])

    def commit(self, row: int, tokens: list[int], kl: list[float], tv: list[float]) -> int:
        """Append tokens left to right until EOS or the budget; returns how many were kept."""
        kept = 0
        for token in tokens:
            if self.finished[row]:
                break
            self.generated[row].append(token)
            if self.kl is not None:
                self.kl[row].append(kl[kept])
                self.tv[row].append(tv[kept])
            kept += 1
            if token in self.eos or self.remaining(row) == 0:
                self.finished[row] = True
        return kept

    def result(self, prepared: Prepared, accepted, drafts, timing) -> DecodeResult:
        longest = max((len(tokens) for tokens in self.generated), default=0)
        rows = len(self.generated)

        def padded(values: list[list], fill, dtype) -> Tensor:
            table = [row + [fill] * (longest - len(row)) for row in values]
            return torch.tensor(table, dtype=dtype).reshape(rows, longest)

        new = padded(self.generated, prepared.pad_id, torch.int64)  # [B, T]
        return DecodeResult(
            sequences=torch.cat([prepared.input_ids.cpu(), new], dim=1),
            prompt_length=prepared.input_ids.shape[1],
            num_generated=torch.tensor([len(tokens) for tokens in self.generated]),
            accepted_lengths=accepted,
            draft_counts=drafts,
            token_kl=None if self.kl is None else padded(self.kl, 0.0, torch.float64),
            token_tv=None if self.tv is None else padded(self.tv, 0.0, torch.float64),
            timing=timing,
            eos_token_id=sorted(self.eos),
            pad_token_id=prepared.pad_id,
        )


@dataclass
class Active:
    """The loop state of the rows still decoding (batch row i is original row rows[i])."""

    rows: Tensor  # [A] original row index
    last: Tensor  # [A] last committed token, in neither cache yet
    count: Tensor  # [A] committed tokens; ``last`` sits at position count − 1
    limit: Tensor  # [A] the last position a row may ever use (padding slots are clamped)

    def take(self, keep: Tensor) -> None:
        self.rows, self.last = self.rows[keep], self.last[keep]
        self.count, self.limit = self.count[keep], self.limit[keep]


def start(prepared: Prepared, target: CachedModel, drafter, clock) -> Active:
    """Prefill the verifier and the drafter (if any) with the prompts without their last
    token (a feature draft also gets the verifier's features there); the loop state."""
    ids, mask = prepared.input_ids, prepared.mask
    with clock("prefill"):
        if ids.shape[1] > 1:
            prefix, prefix_mask = ids[:, :-1], mask[:, :-1]  # [B, P-1]
            positions = positions_of_prompt(prefix_mask)
            features = drafter is not None and drafter.needs_features
            output = target.forward(prefix, prefix_mask, positions, keep=1, hidden=features)
            if drafter is not None:
                drafter.prefill(prefix, prefix_mask, positions, output[1] if features else None)
    count = mask.sum(dim=1)  # [B]
    rows = torch.arange(ids.shape[0], device=prepared.device)
    return Active(rows, ids[:, -1], count, count + prepared.max_new_tokens - 1)


def retire(progress: Progress, active: Active, models: list[CachedModel]) -> None:
    """Drop finished rows from the loop state and from every cache."""
    still = [index for index, row in enumerate(active.rows.tolist()) if not progress.finished[row]]
    if still and len(still) < active.rows.numel():
        keep = torch.tensor(still, device=active.rows.device)
        for model in models:
            model.select_rows(keep)
        active.take(keep)


def uniforms(count: int, generator, device) -> Tensor:
    """``count`` float64 uniforms from ``generator`` (drawn on its device, or the CPU)."""
    draw_device = torch.device("cpu") if generator is None else generator.device
    drawn = torch.rand(count, generator=generator, dtype=torch.float64, device=draw_device)
    return drawn.to(device)


# --- the steps of one speculative iteration --------------------------------------------------


def draft_step(drafter, active: Active, steps: int, prepared: Prepared) -> tuple[Tensor, Tensor]:
    """Sample ``steps`` (K) draft tokens per row: (draft_ids [A, K], draft_probs [A, K, V])."""
    ids, laws = [], []
    logits = drafter.first(active.last, active.count, active.limit)  # [A, V]
    for step in range(steps):
        law = process_logits(logits, prepared.settings)  # [A, V] the p the token is drawn from
        token = sampler.inverse_cdf(law, uniforms(len(law), prepared.generator, law.device))
        ids.append(token)
        laws.append(law)
        if step + 1 < steps:
            positions = torch.minimum(active.count + step, active.limit)  # [A]
            logits = drafter.next(token, positions)  # [A, V]
    return torch.stack(ids, dim=1), torch.stack(laws, dim=1)


def verify_step(
    target: CachedModel, active: Active, draft_ids: Tensor, prepared, features: bool = False
) -> tuple[Tensor, Tensor | None]:
    """One verifier forward over [last, d_1..d_K]: the processed laws q [A, K+1, V], and
    with ``features`` the verifier's last hidden states there [A, K+1, H] (else None)."""
    block = torch.cat([active.last[:, None], draft_ids], dim=1)  # [A, K+1]
    offsets = torch.arange(block.shape[1], device=block.device)[None, :]  # [1, K+1]
    positions = torch.minimum((active.count - 1)[:, None] + offsets, active.limit[:, None])
    output = target.forward(block, torch.ones_like(block), positions, hidden=features)
    logits, hidden = output if features else (output, None)  # [A, K+1, V], [A, K+1, H]
    return process_logits(logits, prepared.settings), hidden


def sample_step(
    rules_per_row: list[Rule],
    target_probs: Tensor,  # [A, K+1, V]
    draft_probs: Tensor,  # [A, K, V]
    draft_ids: Tensor,  # [A, K]
    num_drafts: Tensor,  # [A]
    generator,
) -> tuple[Tensor, Tensor]:
    """``sampler.verify`` per group of rows sharing a rule: (tokens [A, K+1], accepted [A])."""
    batch, steps = draft_ids.shape
    tokens = torch.full(
        (batch, steps + 1), sampler.PAD_ID, dtype=torch.int64, device=draft_ids.device
    )
    accepted = torch.zeros(batch, dtype=torch.int64, device=draft_ids.device)
    for rule in dict.fromkeys(rules_per_row):
        rows = torch.tensor(
            [index for index, item in enumerate(rules_per_row) if item == rule],
            device=draft_ids.device,
        )
        if rows.numel() == batch:
            rows = slice(None)
        tokens[rows], accepted[rows] = sampler.verify(
            target_probs[rows],
            draft_probs[rows],
            draft_ids[rows],
            rule,
            generator=generator,
            check=False,
            num_drafts=num_drafts[rows],
        )
    return tokens, accepted


def measure_step(
    divergence: StepDivergence | None,
    rules_per_row: list[Rule],
    target_probs: Tensor,
    draft_probs: Tensor,
    accepted: Tensor,
    num_drafts: Tensor,
) -> StepDivergence:
    """KL(μ ‖ q) and TV at each row's emitted verified positions i <= accepted, i < k_b
    (computed here unless the budget already did at every drafted position)."""
    if divergence is not None:
        return divergence
    emitted = torch.minimum(accepted + 1, num_drafts)  # [A] verified positions emitted
    rows, positions = positions_below(emitted, draft_probs.shape[1])
    return step_divergence(rules_per_row, target_probs, draft_probs, rows, positions)


def commit_step(
    progress: Progress,
    active: Active,
    tokens: Tensor,
    accepted: Tensor,
    num_drafts: Tensor,
    divergence: StepDivergence | None,
) -> list[float]:
    """Commit each row's accepted drafts and emitted token (with their KL and TV, 0 at a
    bonus or plain position); returns the KL each row realised."""
    token_lists, accepted_list = tokens.tolist(), accepted.tolist()
    drafts_list = num_drafts.tolist()
    kl_rows = divergence.kl.tolist() if divergence is not None else None
    tv_rows = divergence.tv.tolist() if divergence is not None else None
    realised = []
    for index, row in enumerate(active.rows.tolist()):
        emitted = accepted_list[index] + 1
        kl = tv = [0.0] * emitted
        if kl_rows is not None:  # position i is verified iff i < k_b
            kl = [kl_rows[index][i] if i < drafts_list[index] else 0.0 for i in range(emitted)]
            tv = [tv_rows[index][i] if i < drafts_list[index] else 0.0 for i in range(emitted)]
        kept = progress.commit(row, token_lists[index][:emitted], kl, tv)
        realised.append(math.fsum(kl[:kept]))
    emitted_tokens = tokens.gather(1, accepted[:, None])[:, 0]  # [A]
    active.count = active.count + accepted + 1
    active.last = emitted_tokens
    return realised


def rollback_step(
    target: CachedModel, drafter, draft_ids: Tensor, accepted: Tensor, active: Active, features
) -> None:
    """Keep each row's committed slots in the verifier cache (last, d_1 .. d_a); the
    drafter keeps what its kind keeps (``cache.DraftCache.rollback``,
    ``cache.FeatureDraftCache.rollback``)."""
    offsets = torch.arange(draft_ids.shape[1] + 1, device=accepted.device)[None, :]  # [1, K+1]
    target.keep(offsets <= accepted[:, None])
    drafter.rollback(draft_ids, accepted, active.last, features)


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
) -> DecodeResult:
    """Generate up to ``max_new_tokens`` per row with ``rule``, at most k drafts per step.

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
    divergence : run the divergence meter (``DecodeResult.token_kl``; ``sampler.divergence_meter``).
    max_kl : cap every row's Σ_t KL(μ_t ‖ q_t) at this many nats (rules with a δ only;
        ``budget.KLBudget``), falling back to SpS when the budget is spent.

    Returns a ``DecodeResult``; see the module docstring for the method.
    """
    rule = parse_rule(rule)
    steps_per_call = validate.positive_int("k", k)
    if max_kl is not None and not divergence:
        raise ValueError("max_kl: needs the divergence meter (divergence=True)")
    prepared = prepare(
        verifier, draft, input_ids, attention_mask, max_new_tokens, temperature, top_k,
        top_p, eos_token_id, pad_token_id, generator,
    )  # fmt: skip
    batch = prepared.input_ids.shape[0]
    budget = None if max_kl is None else KLBudget(rule, max_kl, batch, prepared.device)
    progress = Progress(batch, max_new_tokens, prepared.eos, metered=divergence)
    clock = Clock(prepared.device)
    started = time.perf_counter()
    target = CachedModel(verifier, batch, prepared.device)
    kind = FeatureDraftCache if isinstance(draft, FeatureDraft) else DraftCache
    drafter = kind(draft, batch, prepared.device)
    active = start(prepared, target, drafter, clock)
    accepted_log, drafts_log = [], []

    while not all(progress.finished):
        remaining = torch.tensor([progress.remaining(row) for row in active.rows.tolist()])
        num_drafts = (remaining - 1).clamp(0, steps_per_call).to(prepared.device)  # [A] k_b
        steps = int(num_drafts.max())
        with clock("draft"):
            if steps:
                draft_ids, draft_probs = draft_step(drafter, active, steps, prepared)
            else:
                draft_ids = torch.zeros(
                    len(num_drafts), 0, dtype=torch.int64, device=prepared.device
                )
                draft_probs = torch.zeros(
                    len(num_drafts), 0, prepared.vocab, device=prepared.device
                )
        with clock("verify"):
            target_probs, features = verify_step(  # [A, K+1, V], [A, K+1, H] or None
                target, active, draft_ids, prepared, drafter.needs_features
            )
        rules_per_row, measured = [rule] * len(num_drafts), None
        if budget is not None:
            with clock("meter"):
                measured = budget.choose(active.rows, target_probs, draft_probs, num_drafts)
                rules_per_row = measured.rules
        with clock("sampler"):
            tokens, accepted = sample_step(
                rules_per_row, target_probs, draft_probs, draft_ids, num_drafts, prepared.generator
            )
        if divergence:
            with clock("meter"):
                measured = measure_step(
                    measured, rules_per_row, target_probs, draft_probs, accepted, num_drafts
                )
        accepted_log.append(_logged(batch, active.rows, accepted))
        drafts_log.append(_logged(batch, active.rows, num_drafts))
        realised = commit_step(progress, active, tokens, accepted, num_drafts, measured)
        if budget is not None:
            budget.spend(
                active.rows, torch.tensor(realised, dtype=torch.float64, device=prepared.device)
            )
        rollback_step(target, drafter, draft_ids, accepted, active, features)
        retire(progress, active, [target, drafter])

    timing = clock.finish(started, verifier_calls=len(accepted_log), draft_calls=drafter.calls)
    return progress.result(
        prepared, _stacked(accepted_log, batch), _stacked(drafts_log, batch), timing
    )


def _logged(batch: int, rows: Tensor, values: Tensor) -> Tensor:
    """values [A] of the active rows placed in a [B] vector (−1 for inactive rows)."""
    logged = torch.full((batch,), -1, dtype=torch.int64)
    logged[rows.cpu()] = values.cpu()
    return logged


def _stacked(log: list[Tensor], batch: int) -> Tensor:
    return torch.stack(log) if log else torch.zeros(0, batch, dtype=torch.int64)


# --- the autoregressive baseline -------------------------------------------------------------


@torch.inference_mode()
def autoregressive_generate(
    verifier,
    draft=None,
    input_ids: Tensor | None = None,
    rule: Rule | str | None = None,
    k: int | None = None,
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
) -> DecodeResult:
    """Plain decoding with the verifier alone; same preparation, interface and result.

    ``draft``, ``rule``, ``k`` and ``max_kl`` are accepted and ignored, so the two functions
    can be swapped in a benchmark. One token per verifier call, drawn by inverse CDF from
    the processed law with a uniform from ``generator``; every token's law is q, so the
    meter reads 0 (``token_kl`` is zeros when ``divergence`` is on).
    """
    prepared = prepare(
        verifier, None, input_ids, attention_mask, max_new_tokens, temperature, top_k,
        top_p, eos_token_id, pad_token_id, generator,
    )  # fmt: skip
    batch = prepared.input_ids.shape[0]
    progress = Progress(batch, max_new_tokens, prepared.eos, metered=divergence)
    clock = Clock(prepared.device)
    started = time.perf_counter()
    model = CachedModel(verifier, batch, prepared.device)
    active = start(prepared, model, None, clock)
    steps = 0
    while not all(progress.finished):
        steps += 1
        with clock("verify"):
            logits = model.forward(
                active.last[:, None],
                torch.ones_like(active.last[:, None]),
                (active.count - 1)[:, None],
            )
            law = process_logits(logits[:, -1], prepared.settings)  # [A, V]
        with clock("sampler"):
            token = sampler.inverse_cdf(law, uniforms(len(law), prepared.generator, law.device))
        for row, value in zip(active.rows.tolist(), token.tolist(), strict=True):
            progress.commit(row, [value], [0.0], [0.0])
        active.last, active.count = token, active.count + 1
        retire(progress, active, [model])
    timing = clock.finish(started, verifier_calls=steps, draft_calls=0)
    empty = torch.zeros(0, batch, dtype=torch.int64)
    return progress.result(prepared, empty, empty, timing)


# --- timing ----------------------------------------------------------------------------------


class Clock:
    """Seconds per named span (device-synchronised on CUDA), plus the total."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, name: str):
        clock = self

        class _Span:
            def __enter__(self):
                clock._sync()
                self.start = time.perf_counter()

            def __exit__(self, *exc):
                clock._sync()
                elapsed = time.perf_counter() - self.start
                clock.seconds[name] = clock.seconds.get(name, 0.0) + elapsed

        return _Span()

    def finish(self, started: float, **counts: int) -> dict:
        timing = dict(self.seconds)
        timing["total"] = time.perf_counter() - started
        timing.update(counts)
        return timing


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
