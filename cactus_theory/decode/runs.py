"""Decoding a list of prompts with a pair of models: what ``cactus decode``, ``cactus bench
decode`` and the report's real-model table share.

- ``Pair``: a verifier and a draft (folders, .gguf files or hub ids) and their prompts;
- ``read_prompts``: a prompt file (.jsonl of strings or {"prompt": ...} objects, or one
  prompt per line with ``\\n`` and ``\\t`` escapes), with clear errors;
- ``load_setup``: both models (``loading.load_model``), the shared tokenizer (checked),
  the prompts, and whether they go through the chat template;
- ``run_prompts``: every prompt decoded in batches with one rule and k (or the baseline),
  accumulated in ``Totals`` (tokens, time, accepted counts, verifier NLL, the meter);
  ``run_paired``: the same for both, batch by batch interleaved, with each batch's
  speed-up (what ``cactus decode``'s interval is made of).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from cactus_theory.core.processors import SamplingSettings


@dataclass(frozen=True)
class Pair:
    """A verifier/draft pair (paths or hub ids) and the prompts that go with it."""

    verifier: str
    draft: str
    prompts: str | None = None
    name: str = "custom"


def check_pair(verifier, verifier_tokenizer, draft, draft_tokenizer) -> None:
    """The draft must share the verifier's tokenizer and output vocabulary."""
    from cactus_theory.decode.checks import vocab_size

    verifier_vocab, draft_vocab = verifier_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if verifier_vocab != draft_vocab:
        differing = len(set(verifier_vocab.items()) ^ set(draft_vocab.items()))
        raise ValueError(
            f"draft: its tokenizer differs from the verifier's ({len(draft_vocab)} vs "
            f"{len(verifier_vocab)} tokens, {differing} (token, id) pairs differ)"
        )
    if vocab_size(verifier) != vocab_size(draft):
        raise ValueError(
            f"draft: output vocabulary {vocab_size(draft)} differs from the verifier's "
            f"{vocab_size(verifier)}"
        )
    if len(verifier_tokenizer) > vocab_size(verifier):
        raise ValueError(
            f"verifier: tokenizer has {len(verifier_tokenizer)} tokens but the model only "
            f"{vocab_size(verifier)} outputs"
        )


def read_prompts(path: str) -> list[str]:
    """The prompts of a file (module docstring); ValueError naming the file and the line
    for a missing file, bytes that are not UTF-8, bad JSON, a JSON object without a
    "prompt" key or a prompt that is not a string."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"prompts: file {path!r} does not exist")
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise ValueError(
            f"prompts: {path} is not UTF-8 text ({error.reason} at byte {error.start})"
        ) from None
    if file.suffix != ".jsonl":
        prompts = [line.replace("\\n", "\n").replace("\\t", "\t") for line in lines if line.strip()]
    else:
        prompts = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"prompts: line {number} of {path} is not JSON ({error})"
                ) from None
            if isinstance(item, dict):
                if "prompt" not in item:
                    raise ValueError(f'prompts: line {number} of {path} has no "prompt" key')
                item = item["prompt"]
            if not isinstance(item, str):
                raise ValueError(
                    f"prompts: line {number} of {path}: the prompt must be a string, got "
                    f"{type(item).__name__}"
                )
            prompts.append(item)
    if not prompts:
        raise ValueError(f"prompts: file {path!r} holds no prompt")
    return prompts


@dataclass
class Setup:
    """Loaded models, tokenizer, prompts and settings for a decode or benchmark run."""

    verifier: object
    draft: object
    tokenizer: object
    prompts: list[str]
    device: object
    pair: Pair
    chat: bool
    extra: dict = field(default_factory=dict)


def load_setup(
    pair: Pair,
    device,
    dtype: str = "float32",
    prompts: str | None = None,
    num_prompts: int | None = None,
    raw: bool = False,
) -> Setup:
    """Load the pair and the prompts (``prompts`` overrides the pair's own file); prompts go
    through the verifier tokenizer's chat template when it has one, unless ``raw``. A draft
    folder holding a feature draft (``feature_draft.py``) is built on the verifier."""
    from cactus_theory.decode.feature_draft import FeatureDraft, is_feature_draft_folder
    from cactus_theory.decode.loading import load_model

    source = prompts or pair.prompts
    if not source:
        raise ValueError("prompts: this pair has no default prompts; pass a prompt file")
    texts = read_prompts(source)
    verifier, verifier_tokenizer = load_model("verifier", pair.verifier, device, dtype)
    if is_feature_draft_folder(pair.draft):  # drafts from the verifier's own features
        draft = FeatureDraft.load(pair.draft, verifier)
    else:
        draft, draft_tokenizer = load_model("draft", pair.draft, device, dtype)
        check_pair(verifier, verifier_tokenizer, draft, draft_tokenizer)
    if num_prompts:
        texts = texts[:num_prompts]
    tokenizer = verifier_tokenizer
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    chat = bool(getattr(tokenizer, "chat_template", None)) and not raw
    return Setup(verifier, draft, tokenizer, texts, device, pair, chat)


def encode(setup: Setup, prompts: list[str]):
    """(input_ids [B, P], attention_mask [B, P]) of ``prompts`` for this setup
    (``encode_prompts`` with its tokenizer and chat setting)."""
    return encode_prompts(setup.tokenizer, prompts, setup.chat)


def encode_prompts(tokenizer, prompts: list[str], chat: bool):
    """(input_ids [B, P], attention_mask [B, P]) padded on the tokenizer's padding side
    (left, as ``load_setup`` sets it), through the chat template (one user turn,
    generation prompt added) when ``chat``."""
    if chat:
        texts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            for prompt in prompts
        ]
        encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    else:
        encoded = tokenizer(prompts, return_tensors="pt", padding=True)
    if encoded.input_ids.shape[1] == 0:
        raise ValueError("prompts: a batch of empty prompts")
    return encoded.input_ids, encoded.attention_mask


def batches(setup: Setup, batch_size: int):
    """(prompts, input_ids, attention_mask) per batch, left-padded."""
    for start in range(0, len(setup.prompts), batch_size):
        chunk = setup.prompts[start : start + batch_size]
        yield (chunk, *encode(setup, chunk))


@dataclass(frozen=True)
class RunSettings:
    """How every prompt is decoded (the processors, lengths, batch, seed, the meter)."""

    max_new_tokens: int = 64
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    batch_size: int = 1
    seed: int = 0
    divergence: bool = True
    max_kl: float | None = None
    tree: str | None = None  # a tree shape (``decode.tree_shape``) instead of a chain
    children: str = "deterministic"  # how a tree's children are drafted
    #: The verifier's NLL of what was generated (one teacher-forced verifier forward per
    #: batch, outside the timed decode); False skips it (``Totals.nll`` is then None).
    nll: bool = True


@dataclass
class Totals:
    """Accumulated over batches: tokens, seconds, accepted counts, NLL, the meter."""

    tokens: int = 0
    seconds: float = 0.0
    verifier_calls: int = 0
    accepted: list[int] = field(default_factory=list)
    nll_sum: float = 0.0
    texts: list[str] = field(default_factory=list)
    sequence_kl: list[float] = field(default_factory=list)
    sequence_tv: list[float] = field(default_factory=list)
    timing: dict = field(default_factory=dict)
    scanned: int = 0  # drafted positions the verify steps reached (accepted + first rejected)
    drafted: int = 0  # draft tokens sampled (per step: the batch's most drafts K)
    reached_by_position: list[int] = field(default_factory=list)  # n_j, j = 1..k
    accepted_by_position: list[int] = field(default_factory=list)  # steps that accepted draft j
    tree_ended: list[list[int]] = field(default_factory=list)  # [D][R] walks ended at rank r
    tree_reached: list[list[int]] = field(default_factory=list)  # [D][R] nodes with > r children
    nodes: int = 0  # tree nodes verified (a tree run), over every row's steps
    nll_measured: bool = True  # False: RunSettings.nll was off, no NLL

    @property
    def steps(self) -> int:
        """Verify steps over all rows (a row's step counts once; batch 1: verifier calls)."""
        return len(self.accepted)

    @property
    def alpha_by_position(self) -> list[float]:
        """α_j = (steps that accepted draft j) / (steps that reached it), j = 1..k, over the
        whole run (``DecodeResult.alpha_by_position`` pooled over batches); NaN where no
        step reached j."""
        return [
            taken / reached if reached else float("nan")
            for taken, reached in zip(
                self.accepted_by_position, self.reached_by_position, strict=True
            )
        ]

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(self.seconds, 1e-12)

    @property
    def acceptance_length(self) -> float:
        """AL: mean accepted drafts per verify step (bonus excluded, as in the paper)."""
        return sum(self.accepted) / len(self.accepted) if self.accepted else 0.0

    @property
    def tokens_per_call(self) -> float:
        """Tokens per verifier call: AL + 1."""
        return 1.0 + self.acceptance_length

    @property
    def nll(self) -> float | None:
        """The verifier's NLL per generated token (nats); None when it was not measured."""
        return self.nll_sum / max(self.tokens, 1) if self.nll_measured else None

    @property
    def per_position_acceptance(self) -> float:
        """α̂ = accepted drafts / drafted positions reached: the estimate of a constant
        per-position acceptance α (the scan stops at the first rejection)."""
        return sum(self.accepted) / self.scanned if self.scanned else 0.0

    @property
    def metered(self) -> bool:
        return bool(self.sequence_kl)

    @property
    def kl_per_token(self) -> float | None:
        """Σ_rows Σ_t KL(μ_t ‖ q_t) / tokens (nats per generated token)."""
        return sum(self.sequence_kl) / max(self.tokens, 1) if self.metered else None

    @property
    def kl_per_sequence(self) -> float | None:
        """Mean over rows of Σ_t KL(μ_t ‖ q_t) (nats per sequence)."""
        return sum(self.sequence_kl) / len(self.sequence_kl) if self.metered else None

    @property
    def tv_per_token(self) -> float | None:
        return sum(self.sequence_tv) / max(self.tokens, 1) if self.metered else None

    def add(self, result, verifier, mask, tokenizer, nll: bool = True) -> None:
        """Add one batch's ``DecodeResult``; ``nll``: also its verifier NLL (one verifier
        forward over the batch's sequences)."""
        import torch

        from cactus_theory.decode import verifier_nll

        self.tokens += result.total_tokens
        self.seconds += result.timing["total"]
        self.verifier_calls += result.timing["verifier_calls"]
        for key, value in result.timing.items():
            self.timing[key] = self.timing.get(key, 0) + value
        active = result.accepted_lengths >= 0  # [steps, B]
        self.accepted.extend(result.accepted_lengths[active].tolist())
        reached = result.reached_by_position
        # α_j = taken_j / n_j exactly, so round(α_j n_j) recovers the integer taken_j.
        taken = [
            round(alpha * count) if count else 0
            for alpha, count in zip(result.alpha_by_position, reached, strict=True)
        ]
        _add_elementwise(self.reached_by_position, reached)
        _add_elementwise(self.accepted_by_position, taken)
        if result.draft_counts.numel() and result.tree_outcomes is None:
            drafts = result.draft_counts.clamp(min=0)  # [steps, B]
            reached = torch.minimum(result.accepted_lengths + 1, drafts)
            self.scanned += int(reached[active].sum())
            self.drafted += int(drafts.amax(dim=1).sum())
        if result.tree_outcomes is not None:
            from cactus_theory.decode.tree_stats import add_counts

            ended, reached_nodes = result.ends_by_rank
            add_counts(self.tree_ended, ended)
            add_counts(self.tree_reached, reached_nodes)
            self.nodes += int(result.draft_counts[active].sum())
        if result.sequence_kl is not None:
            self.sequence_kl.extend(result.sequence_kl.tolist())
            self.sequence_tv.extend(result.sequence_tv.tolist())
        self.nll_measured = self.nll_measured and nll
        if result.total_tokens and self.nll_measured:
            self.nll_sum += verifier_nll(verifier, result, mask) * result.total_tokens
        self.texts.extend(
            tokenizer.decode(tokens, skip_special_tokens=True) for tokens in result.new_tokens
        )


def _add_elementwise(total: list[int], values: list[int]) -> None:
    """total += values in place, position by position, growing total as needed."""
    total.extend([0] * (len(values) - len(total)))
    for index, value in enumerate(values):
        total[index] += value


def step_seconds(baseline_timing: dict) -> float:
    """T: the autoregressive baseline's seconds per step (one verifier call, a token per
    row) outside the prefill, (total − prefill) / verifier calls, from its
    ``DecodeResult.timing`` (or their sums over batches)."""
    calls = baseline_timing.get("verifier_calls", 0)
    if calls < 1:
        raise ValueError("baseline: no verifier call was timed")
    return (baseline_timing["total"] - baseline_timing.get("prefill", 0.0)) / calls


@dataclass(frozen=True)
class StepCosts:
    """A speculative run's costs in autoregressive steps T (``step_seconds``):

    - c (``draft_cost``) = (draft seconds / draft tokens) / T, Leviathan's cost ratio;
    - v (``verify_cost``) = (verify seconds / verifier calls) / T: a verify call of k + 1
      tokens, in steps (1 when it costs what a one-token step costs: memory-bound);
    - o (``other_cost``) = (total − prefill − draft − verify seconds) / verifier calls / T:
      the rest of a step (the rule's sampler, the divergence meter, bookkeeping);
    - the predicted speed-up (AL + 1) / (k c + v): tokens per call over the call's cost
      in steps, ignoring o and the prefill.
    """

    draft_cost: float
    verify_cost: float
    other_cost: float
    predicted_speedup: float


def step_costs(
    timing: dict, drafted: int, k: int, acceptance_length: float, step: float
) -> StepCosts:
    """``StepCosts`` of a speculative run's summed ``timing`` with ``drafted`` draft tokens,
    at most ``k`` drafts per step and AL ``acceptance_length``, against the baseline's
    seconds per step ``step``."""
    if step <= 0:
        raise ValueError(f"step: the baseline's seconds per step must be > 0, got {step}")
    calls = max(timing.get("verifier_calls", 0), 1)
    draft = timing.get("draft", 0.0) / max(drafted, 1) / step
    verify = timing.get("verify", 0.0) / calls / step
    rest = timing.get("total", 0.0) - timing.get("prefill", 0.0)
    rest -= timing.get("draft", 0.0) + timing.get("verify", 0.0)
    predicted = (acceptance_length + 1.0) / max(k * draft + verify, 1e-12)
    return StepCosts(draft, verify, rest / calls / step, predicted)


def run_prompts(
    setup: Setup, run: RunSettings, rule, k: int | None, *, baseline: bool, progress=True
):
    """Decode every prompt batch: speculative with ``rule`` and ``k``, or the baseline."""
    import torch
    from tqdm.auto import tqdm

    totals = Totals()
    generator = torch.Generator().manual_seed(run.seed)
    shape = f"tree {run.tree}" if run.tree else f"k={k}"
    label = "baseline" if baseline else f"{rule.label} {shape}"
    count = -(-len(setup.prompts) // run.batch_size)
    for _, input_ids, mask in tqdm(
        batches(setup, run.batch_size), total=count, desc=label, disable=not progress
    ):
        result = decode_batch(setup, run, rule, k, baseline, generator, input_ids, mask)
        totals.add(result, setup.verifier, mask, setup.tokenizer, nll=run.nll)
    return totals


def run_paired(setup: Setup, run: RunSettings, rule, k: int, *, progress=True):
    """(speculative ``Totals``, baseline ``Totals``, per-batch speed-ups): each batch is
    decoded speculatively and then by the baseline before the next batch (interleaved, so
    a slow spell hits both), each kind with its own generator seeded as ``run_prompts``
    seeds it (so the tokens are the same as two separate runs'); a batch's speed-up is its
    speculative tokens/s over its baseline tokens/s."""
    import torch
    from tqdm.auto import tqdm

    speculative, baseline, ratios = Totals(), Totals(), []
    generators = [torch.Generator().manual_seed(run.seed) for _ in range(2)]
    count = -(-len(setup.prompts) // run.batch_size)
    for _, input_ids, mask in tqdm(
        batches(setup, run.batch_size), total=count, desc="paired", disable=not progress
    ):
        speeds = []
        for totals, is_baseline, generator in (
            (speculative, False, generators[0]),
            (baseline, True, generators[1]),
        ):
            result = decode_batch(setup, run, rule, k, is_baseline, generator, input_ids, mask)
            totals.add(result, setup.verifier, mask, setup.tokenizer, nll=run.nll)
            speeds.append(result.total_tokens / max(result.timing["total"], 1e-12))
        ratios.append(speeds[0] / max(speeds[1], 1e-12))
    return speculative, baseline, ratios


def decode_batch(setup: Setup, run: RunSettings, rule, k, baseline: bool, generator, ids, mask):
    """One batch ``ids`` [B, P] (``mask`` [B, P]) decoded with ``rule`` and ``k``, or by the
    autoregressive baseline: a ``DecodeResult``."""
    from cactus_theory import decode

    function = decode.autoregressive_generate if baseline else decode.speculative_generate
    return function(
        setup.verifier,
        setup.draft,
        ids,
        rule=rule,
        k=k,
        max_new_tokens=run.max_new_tokens,
        temperature=run.sampling.temperature,
        top_k=run.sampling.top_k,
        top_p=run.sampling.top_p,
        eos_token_id=setup.tokenizer.eos_token_id,
        pad_token_id=setup.tokenizer.pad_token_id,
        generator=generator,
        attention_mask=mask,
        divergence=run.divergence and not baseline,
        max_kl=None if baseline else run.max_kl,
        **({} if baseline or run.tree is None else {"tree": run.tree, "children": run.children}),
    )


def warm_up(setup: Setup, run: RunSettings, rule, k: int) -> None:
    """One short generation of each kind (4 tokens of ``decode_batch``), so one-time costs
    stay out of the timings."""
    import torch

    _, input_ids, mask = next(batches(setup, min(run.batch_size, 2)))
    short = replace(run, max_new_tokens=4)
    for baseline in (False, True):
        decode_batch(setup, short, rule, k, baseline, torch.Generator(), input_ids, mask)
