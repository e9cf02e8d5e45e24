"""Speculative decoding with any rule, for Hugging Face causal LMs, batched, with KV caches.

``speculative_generate(verifier, draft, input_ids, rule=..., k=...)`` runs the loop

    draft k tokens with the draft model (each sampled from its processed law p);
    run the verifier once on [last token, d_1..d_k] to get q for k+1 positions;
    ``sampler.verify`` accepts a prefix and emits one more token (residual or bonus);
    commit, roll both KV caches back past the rejected tokens, repeat.

Both models see the same processors (temperature, top-k, top-p; ``torch_processors``), so
the rule compares exactly the law each draft was sampled from with the verifier's law after
the same processors. temperature = 0 is greedy: both laws are one-hot. A rule that puts
no mass where the verifier has none (sps, cactus, cactus-exact with KL or χ², frontier,
tas, greedy, topk with k = 1) then accepts a draft iff it is the verifier's argmax and
otherwise emits that argmax, so the output equals the verifier's own greedy decoding,
token for token; interp, topk with k > 1 and cactus-exact with tv, hellinger, js or
reverse KL may accept other drafts, as their definitions say.

**Ragged batches (rows accept different numbers of tokens).** Each model keeps one
rectangular ``DynamicCache`` of *slots* plus a 0/1 slot mask [B, slots] that is passed as the
attention mask, and explicit ``position_ids`` (a row's position = its number of valid
tokens so far). Hugging Face builds the causal mask from slot indices and the 0/1 mask, and
embeds positions from ``position_ids``, so a slot marked 0 is invisible and positions stay
contiguous within each row. After a verify step that appended k+1 slots, row b keeps its
first a_b + 1 (its last committed token and its a_b accepted drafts); the others become
holes (mask 0). Slots that are holes in *every* row are removed from the end with
``DynamicCache.crop`` (the rollback; nothing is recomputed), so a batch of one row never
has holes, and holes in a batch only cost masked attention over at most k slots per step.
This is exact: a hole is never attended to, and every valid key/value was computed with
exactly the valid prefix of its row (left padding of the prompt is the same mechanism).
Rows that finish (EOS or max_new_tokens) leave the batch (``batch_select_indices``).

The draft lags one token behind when all k drafts were accepted (d_k was sampled but never
fed to it); the next draft call then feeds two tokens [d_k, last] for all rows, with d_k's
slot a hole in rows that do not need it.

**Exactness of stopping.** Tokens are committed left to right and a row stops at its first
EOS (kept) or at max_new_tokens (exact). A row's drafts never run past what it can still
commit, and the last step needs no draft at all. Finished rows are padded with
``pad_token_id`` (default: eos_token_id, else 0), as in ``generate``.

Randomness: the draft tokens and the sampler's uniforms come from ``generator`` (a CPU
``torch.Generator`` keeps results identical across devices up to float rounding).

``autoregressive_generate`` is the plain baseline with the same interface and result type,
so speed-ups are measured side by side. ``verifier_nll`` scores generated text under the
verifier (the quality proxy).

Limits: models must accept ``attention_mask``, ``position_ids`` and a ``DynamicCache`` (all
standard decoder-only ``transformers`` models do); sliding-window attention, if any,
counts cache slots, holes included.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from cactus_theory import sampler
from cactus_theory.core import validate
from cactus_theory.core.rules.base import Rule
from cactus_theory.decode.cache import CachedModel, positions_of_prompt
from cactus_theory.decode.checks import (
    check_generator,
    check_inputs,
    eos_ids,
    model_device,
    parse_rule,
    resolve_pad_id,
    sampling_settings,
    vocab_size,
)
from cactus_theory.sampler.processors import process_logits

Tensor = torch.Tensor


@dataclass
class DecodeResult:
    """What a generate call returns.

    sequences: [B, P + T] the prompts (as given, left-padded) followed by the generated
    tokens, finished rows padded with ``pad_token_id`` (T = the longest generation).
    num_generated: [B] tokens generated per row (EOS included). accepted_lengths:
    [steps, B] accepted drafts per verify step per row (−1 where the row was not active;
    empty for the baseline). timing: seconds (``total``, ``prefill``, ``draft``,
    ``verify``, ``sampler``) and counts (``verifier_calls``, ``draft_calls``).
    """

    sequences: Tensor
    prompt_length: int
    num_generated: Tensor
    accepted_lengths: Tensor
    timing: dict = field(default_factory=dict)

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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Clock:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str):
        clock = self

        class _Span:
            def __enter__(self):
                _sync(clock.device)
                self.start = time.perf_counter()

            def __exit__(self, *exc):
                _sync(clock.device)
                clock.seconds[name] = clock.seconds.get(name, 0.0) + (
                    time.perf_counter() - self.start
                )

        return _Span()


def _uniforms(count: int, generator, device) -> Tensor:
    draw_device = torch.device("cpu") if generator is None else generator.device
    return torch.rand(count, generator=generator, dtype=torch.float64, device=draw_device).to(
        device
    )


# --- the shared bookkeeping of committed tokens ----------------------------------------------


class _Rows:
    """Committed tokens per original row, EOS / max_new_tokens stopping, active rows."""

    def __init__(self, batch: int, max_new_tokens: int, eos: list[int]) -> None:
        self.generated: list[list[int]] = [[] for _ in range(batch)]
        self.finished = [max_new_tokens == 0] * batch
        self.max_new_tokens = max_new_tokens
        self.eos = set(eos)

    def remaining(self, row: int) -> int:
        return self.max_new_tokens - len(self.generated[row])

    def commit(self, row: int, tokens: list[int]) -> int:
        """Append tokens left to right until EOS or the budget; returns how many were kept."""
        kept = 0
        for token in tokens:
            if self.finished[row]:
                break
            self.generated[row].append(token)
            kept += 1
            if token in self.eos or self.remaining(row) == 0:
                self.finished[row] = True
        return kept

    def result(self, input_ids, pad_id, accepted, timing) -> DecodeResult:
        longest = max((len(tokens) for tokens in self.generated), default=0)
        padded = [tokens + [pad_id] * (longest - len(tokens)) for tokens in self.generated]
        new = torch.tensor(padded, dtype=torch.int64).reshape(len(padded), longest)
        return DecodeResult(
            sequences=torch.cat([input_ids.cpu(), new], dim=1),
            prompt_length=input_ids.shape[1],
            num_generated=torch.tensor([len(tokens) for tokens in self.generated]),
            accepted_lengths=accepted,
            timing=timing,
        )


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
) -> DecodeResult:
    """Generate up to ``max_new_tokens`` per row with ``rule``, k drafts per verify step.

    ``rule``: a rule object or a spec string (``"cactus:delta=1.0"``). ``input_ids`` [B, P]
    with an optional left-padding ``attention_mask``. See the module docstring for the
    ragged-batch method, stopping and randomness.
    """
    rule = parse_rule(rule)
    steps_per_call = validate.positive_int("k", k)
    settings = sampling_settings(temperature, top_k, top_p)
    check_generator(generator)
    device = model_device(verifier, "verifier")
    if model_device(draft, "draft") != device:
        raise ValueError(f"draft: on {model_device(draft, 'draft')}, verifier on {device}")
    vocab = vocab_size(verifier)
    if vocab_size(draft) != vocab:
        raise ValueError(
            f"draft: vocabulary size {vocab_size(draft)} differs from the verifier's {vocab}"
        )
    input_ids, mask = check_inputs(input_ids, attention_mask, max_new_tokens, vocab, device)
    eos = eos_ids(eos_token_id, vocab)
    pad_id = resolve_pad_id(pad_token_id, eos, vocab)
    batch = input_ids.shape[0]
    rows = _Rows(batch, max_new_tokens, eos)
    clock = _Clock(device)
    started = time.perf_counter()
    target_model = CachedModel(verifier, batch, device)
    draft_model = CachedModel(draft, batch, device)

    with clock("prefill"):
        if input_ids.shape[1] > 1:
            prefix, prefix_mask = input_ids[:, :-1], mask[:, :-1]
            positions = positions_of_prompt(prefix_mask)
            for model in (target_model, draft_model):
                model.forward(prefix, prefix_mask, positions, keep=1)
    active = torch.arange(batch, device=device)  # original row of each batch row
    last = input_ids[:, -1]  # committed, not yet in either cache
    count = mask.sum(dim=1)  # committed tokens per row (position of `last` is count − 1)
    lagging = torch.zeros(batch, dtype=torch.bool, device=device)  # draft misses d_k
    lag_token = torch.zeros(batch, dtype=torch.int64, device=device)
    accepted_log: list[Tensor] = []

    while not all(rows.finished):
        active_rows = active.tolist()
        budget = max(rows.remaining(row) for row in active_rows)
        steps = min(steps_per_call, budget - 1)
        drafted, draft_laws = [], []
        fed_lag = steps > 0 and bool(lagging.any())
        with clock("draft"):
            if steps > 0:
                if fed_lag:
                    ids = torch.stack([lag_token, last], dim=1)
                    valid = torch.stack([lagging, torch.ones_like(lagging)], dim=1)
                    positions = torch.stack([count - 2, count - 1], dim=1).clamp(min=0)
                else:
                    ids, valid = last[:, None], torch.ones_like(last[:, None])
                    positions = (count - 1)[:, None]
                logits = draft_model.forward(ids, valid, positions, keep=1)[:, -1]
                for step in range(steps):
                    law = process_logits(logits, settings)
                    token = sampler.inverse_cdf(law, _uniforms(len(active_rows), generator, device))
                    drafted.append(token)
                    draft_laws.append(law)
                    if step + 1 < steps:
                        logits = draft_model.forward(
                            token[:, None],
                            torch.ones_like(token[:, None]),
                            (count + step)[:, None],
                            keep=1,
                        )[:, -1]
        draft_ids = (
            torch.stack(drafted, dim=1)
            if drafted
            else torch.zeros(len(active_rows), 0, dtype=torch.int64, device=device)
        )
        with clock("verify"):
            verify_ids = torch.cat([last[:, None], draft_ids], dim=1)
            positions = (count - 1)[:, None] + torch.arange(steps + 1, device=device)[None]
            logits = target_model.forward(verify_ids, torch.ones_like(verify_ids), positions)
            target_laws = process_logits(logits, settings)
        with clock("sampler"):
            if draft_laws:
                draft_probs = torch.stack(draft_laws, dim=1)
            else:
                draft_probs = target_laws.new_zeros(len(active_rows), 0, vocab)
            tokens, accepted = sampler.verify(
                target_laws, draft_probs, draft_ids, rule, generator=generator, check=False
            )
        logged = torch.full((batch,), -1, dtype=torch.int64)
        logged[active.cpu()] = accepted.cpu()
        accepted_log.append(logged)

        # Commit, then roll both caches back to what each row keeps.
        emitted = tokens.gather(1, accepted[:, None])[:, 0]
        token_lists, accepted_list = tokens.tolist(), accepted.tolist()
        for index, row in enumerate(active_rows):
            rows.commit(row, token_lists[index][: accepted_list[index] + 1])
        positions_new = torch.arange(steps + 1, device=device)[None]
        target_model.keep_slots(positions_new <= accepted[:, None])
        if steps > 0:
            # Draft slots this step: [lag token if fed], last, d_1 .. d_{steps−1}.
            kept = torch.arange(steps, device=device)[None] <= accepted[:, None]
            if fed_lag:
                kept = torch.cat([lagging[:, None], kept], dim=1)
            draft_model.keep_slots(kept)
        lagging = accepted == steps if steps > 0 else torch.zeros_like(lagging)
        lag_token = draft_ids[:, -1] if steps > 0 else lag_token
        count = count + accepted + 1
        last = emitted

        still = [index for index, row in enumerate(active_rows) if not rows.finished[row]]
        if len(still) < len(active_rows) and still:
            keep = torch.tensor(still, device=device)
            for model in (target_model, draft_model):
                model.select_rows(keep)
            active, last, count = active[keep], last[keep], count[keep]
            lagging, lag_token = lagging[keep], lag_token[keep]

    timing = dict(clock.seconds)
    timing["total"] = time.perf_counter() - started
    timing["verifier_calls"] = len(accepted_log)
    timing["draft_calls"] = draft_model.calls
    accepted_lengths = (
        torch.stack(accepted_log) if accepted_log else torch.zeros(0, batch, dtype=torch.int64)
    )
    return rows.result(input_ids, pad_id, accepted_lengths, timing)


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
) -> DecodeResult:
    """Plain decoding with the verifier alone; same interface and result type.

    ``draft``, ``rule`` and ``k`` are accepted and ignored, so the two functions can be
    swapped in a benchmark. One token per verifier call, drawn by inverse CDF from the
    processed law with a uniform from ``generator``.
    """
    settings = sampling_settings(temperature, top_k, top_p)
    check_generator(generator)
    device = model_device(verifier, "verifier")
    vocab = vocab_size(verifier)
    input_ids, mask = check_inputs(input_ids, attention_mask, max_new_tokens, vocab, device)
    eos = eos_ids(eos_token_id, vocab)
    pad_id = resolve_pad_id(pad_token_id, eos, vocab)
    batch = input_ids.shape[0]
    rows = _Rows(batch, max_new_tokens, eos)
    clock = _Clock(device)
    started = time.perf_counter()
    model = CachedModel(verifier, batch, device)
    with clock("prefill"):
        if input_ids.shape[1] > 1:
            model.forward(
                input_ids[:, :-1], mask[:, :-1], positions_of_prompt(mask[:, :-1]), keep=1
            )
    active = torch.arange(batch, device=device)
    last, count = input_ids[:, -1], mask.sum(dim=1)
    steps = 0
    while not all(rows.finished):
        steps += 1
        with clock("verify"):
            logits = model.forward(
                last[:, None], torch.ones_like(last[:, None]), (count - 1)[:, None]
            )
            law = process_logits(logits[:, -1], settings)
        with clock("sampler"):
            token = sampler.inverse_cdf(law, _uniforms(len(last), generator, device))
        active_rows = active.tolist()
        for index, value in enumerate(token.tolist()):
            rows.commit(active_rows[index], [value])
        last, count = token, count + 1
        still = [index for index, row in enumerate(active_rows) if not rows.finished[row]]
        if len(still) < len(active_rows) and still:
            keep = torch.tensor(still, device=device)
            model.select_rows(keep)
            active, last, count = active[keep], last[keep], count[keep]
    timing = dict(clock.seconds)
    timing["total"] = time.perf_counter() - started
    timing["verifier_calls"] = steps
    timing["draft_calls"] = 0
    return rows.result(input_ids, pad_id, torch.zeros(0, batch, dtype=torch.int64), timing)


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
