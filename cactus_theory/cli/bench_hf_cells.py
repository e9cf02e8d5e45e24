"""``cactus bench hf``, what one cell decodes: the pairs (a verifier, its prompts and
drafts: ``load_groups``), the configs run on them (``Config``: plain, theirs, sps, sps hf,
cactus hf, sps hf bB), one config's decoding of every prompt in one round
(``decode_cell`` -> ``Cell``: tokens, seconds, verify steps, accepted drafts, texts), and
what transformers' assisted generation does with the assistant's processors
(``assistant_processing``). The command, its timing and its tables:
``cactus_theory.cli.bench_hf``.
"""

from __future__ import annotations

import argparse
import copy
import time
from dataclasses import dataclass

from cactus_theory.core.processors import PAPER_SETTING, SamplingSettings

PAIRS = ("stdlib", "smollm2")
SETTINGS = {"sampled": PAPER_SETTING, "greedy": SamplingSettings(temperature=0.0)}
CACTUS = "cactus:delta=1.0"


@dataclass(frozen=True)
class Config:
    """One row: how to decode (``kind``), with which draft, rule and batch size."""

    kind: str  # "plain", "theirs", "direct" (speculative_generate), "hf" (cactus_generate)
    draft: str | None = None  # "standalone" or "feature"
    rule: str | None = None
    batch: int = 1

    @property
    def label(self) -> str:
        if self.kind in ("plain", "theirs"):
            return self.kind
        name = "sps" if self.rule == "sps" else "cactus δ=1"
        return (
            name
            + ("" if self.kind == "direct" else " hf")
            + (f" b{self.batch}" if self.batch > 1 else "")
        )


@dataclass
class Cell:
    """One config's decoding of every prompt in one round."""

    tokens: int
    seconds: float
    steps: int  # verify steps (plain: tokens)
    accepted: int  # accepted drafts over those steps
    texts: list  # generated token ids per prompt (for the greedy check)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(self.seconds, 1e-12)

    @property
    def acceptance_length(self) -> float:
        return self.accepted / self.steps if self.steps else 0.0


@dataclass
class Group:
    """A verifier, its prompts and its drafts (by kind), and the configs run on them."""

    name: str
    setup: object  # decode.runs.Setup (verifier, tokenizer, prompts, chat)
    drafts: dict
    configs: list

    def draft_description(self, kind: str) -> str:
        return self.setup.extra.get(f"{kind}_description", kind)


def truncated_draft(verifier, layers: int):
    """A standalone draft: a copy of ``verifier`` keeping its first ``layers`` layers (with
    its embedding, final norm and head; no training)."""
    draft = copy.deepcopy(verifier)
    model = draft.model
    model.layers = model.layers[:layers]
    draft.config.num_hidden_layers = layers
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:layers]
    return draft.eval()


def configs_for(drafts: dict, batch: int) -> list[Config]:
    configs = [Config("plain")]
    for kind in drafts:
        if kind == "standalone":
            configs.append(Config("theirs", kind))
        configs += [
            Config("direct", kind, "sps"),
            Config("hf", kind, "sps"),
            Config("hf", kind, CACTUS),
        ]
        if batch > 1:
            configs.append(Config("hf", kind, "sps", batch))
    return configs


def load_groups(args: argparse.Namespace) -> list[Group]:
    import torch

    from cactus_theory.cli.decode import device_from_args
    from cactus_theory.decode.feature_draft import FeatureDraft
    from cactus_theory.decode.runs import Pair, load_setup

    device = device_from_args(args.device)
    if args.verifier or args.draft or args.prompts:
        if not (args.verifier and args.draft and args.prompts):
            raise ValueError("verifier: give --verifier, --draft and --prompts together")
        pairs = [("custom", Pair(args.verifier, args.draft, args.prompts), None)]
    else:
        pairs = [(name, *default_pairs(name, args.dataset)) for name in args.pairs]
    groups = []
    for name, pair, prompts in pairs:
        setup = load_setup(pair, device, args.dtype, prompts, args.num_prompts)
        kind = "feature" if isinstance(setup.draft, FeatureDraft) else "standalone"
        drafts = {kind: setup.draft}
        setup.extra[f"{kind}_description"] = f"{kind} draft {pair.draft}"
        if name == "smollm2":
            drafts = {"standalone": truncated_draft(setup.verifier, args.draft_layers), **drafts}
            setup.extra["standalone_description"] = (
                f"standalone draft: the verifier's first {args.draft_layers} layers"
            )
        for model in drafts.values():
            model.to(device)
        groups.append(Group(name, setup, drafts, configs_for(drafts, args.batch_size)))
    torch.manual_seed(args.seed)
    return groups


def default_pairs(name: str, dataset: str):
    """(Pair, prompt file or None) of a named pair (prompts: ``cactus_theory.real.datasets``)."""
    from cactus_theory.cli import dispatch

    if name == "stdlib":
        return dispatch.stdlib_pair(), None
    from cactus_theory.real.datasets import prompt_file

    return dispatch.default_pair(), str(prompt_file(dataset))


def generate_keywords(sampling: SamplingSettings) -> dict:
    """generate()'s sampling keywords for a setting (greedy: do_sample=False)."""
    if sampling.temperature == 0:
        return {"do_sample": False}
    return {
        "do_sample": True,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k or 0,
        "top_p": sampling.top_p,
    }


def generated_count(row: list[int], eos: set[int]) -> int:
    """Tokens a row generated: up to and including its first EOS, else all."""
    for index, token in enumerate(row):
        if token in eos:
            return index + 1
    return len(row)


class ForwardCounter:
    """Counts a model's forward calls while active (the verifier's verify steps)."""

    def __init__(self, model) -> None:
        self.model, self.calls, self.handle = model, 0, None

    def __enter__(self):
        self.handle = self.model.register_forward_hook(self._count)
        return self

    def _count(self, *_) -> None:
        self.calls += 1

    def __exit__(self, *_) -> None:
        self.handle.remove()


def decode_cell(group: Group, config: Config, sampling, args) -> Cell:
    """Every prompt of ``group`` decoded by ``config`` (module docstring)."""
    import torch

    from cactus_theory.decode import speculative_generate
    from cactus_theory.decode.hf import cactus_generate
    from cactus_theory.decode.runs import batches

    setup = group.setup
    verifier, tokenizer = setup.verifier, setup.tokenizer
    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    pad = tokenizer.pad_token_id
    keywords = generate_keywords(sampling)
    draft = group.drafts.get(config.draft)
    tokens = steps = accepted = 0
    seconds = 0.0
    texts = []
    for index, (_, ids, mask) in enumerate(batches(setup, config.batch)):
        ids, mask = ids.to(setup.device), mask.to(setup.device)
        seed = args.seed * 100_003 + index
        common = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": args.max_new_tokens}
        common.update(pad_token_id=pad, eos_token_id=sorted(eos) or None)
        if config.kind in ("plain", "theirs"):
            extra = {} if config.kind == "plain" else {"assistant_model": draft}
            torch.manual_seed(seed)
            with ForwardCounter(verifier) as counter:
                start = time.perf_counter()
                output = verifier.generate(**common, **keywords, **extra)
                seconds += time.perf_counter() - start
            rows = output[:, ids.shape[1] :].tolist()
            counts = [generated_count(row, eos) for row in rows]
            tokens += sum(counts)
            steps += counter.calls
            accepted += sum(counts) - counter.calls
            texts += [row[:count] for row, count in zip(rows, counts, strict=True)]
            continue
        generator = torch.Generator().manual_seed(seed)
        start = time.perf_counter()
        if config.kind == "direct":
            result = speculative_generate(
                verifier, draft, ids, rule=config.rule, k=args.k,
                max_new_tokens=args.max_new_tokens, temperature=sampling.temperature,
                top_k=sampling.top_k, top_p=sampling.top_p, eos_token_id=sorted(eos),
                pad_token_id=pad, generator=generator, attention_mask=mask,
            )  # fmt: skip
            seconds += time.perf_counter() - start
            counts, lengths = result.num_generated, result.accepted_lengths
        else:
            result = verifier.generate(
                **common, **keywords, custom_generate=cactus_generate, draft_model=draft,
                rule=config.rule, k=args.k, generator=generator, return_dict_in_generate=True,
            )  # fmt: skip
            seconds += time.perf_counter() - start
            counts, lengths = result.num_generated, result.accepted_lengths
        active = lengths >= 0  # [steps, B]
        tokens += int(counts.sum())
        steps += int(active.sum())
        accepted += int(lengths[active].sum())
        rows = result.sequences[:, ids.shape[1] :].tolist()
        texts += [row[:count] for row, count in zip(rows, counts.tolist(), strict=True)]
    return Cell(tokens, seconds, steps, accepted, texts)


def set_assistant(draft, k: int) -> None:
    """Assisted generation with k fixed: k drafts per step, constant, no confidence stop."""
    config = draft.generation_config
    config.num_assistant_tokens = k
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = None


def assistant_processing(group: Group, sampling: SamplingSettings, args) -> dict:
    """How often transformers applies the sampling processors to the assistant: the law of
    its first draft after the first prompt against its logits through the processors
    once and twice (max |difference| of the probabilities)."""
    import torch
    from transformers.generation import candidate_generator
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    from cactus_theory.decode.runs import batches

    setup, draft = group.setup, group.drafts["standalone"]
    _, ids, mask = next(batches(setup, 1))
    ids, mask = ids.to(setup.device), mask.to(setup.device)
    seen = []
    original = candidate_generator.AssistedCandidateGenerator._generate_candidates

    def spy(self, arguments):
        candidates, logits = original(self, arguments)
        seen.append(logits[:, 0].float())  # [1, V] the processed scores of draft 1
        return candidates, logits

    candidate_generator.AssistedCandidateGenerator._generate_candidates = spy
    try:
        torch.manual_seed(args.seed)
        setup.verifier.generate(
            input_ids=ids, attention_mask=mask, assistant_model=draft, max_new_tokens=2,
            pad_token_id=setup.tokenizer.pad_token_id, **generate_keywords(sampling),
        )  # fmt: skip
    finally:
        candidate_generator.AssistedCandidateGenerator._generate_candidates = original
    with torch.no_grad():
        logits = draft(input_ids=ids, attention_mask=mask).logits[:, -1].float()  # [1, V]
    warpers = [
        TemperatureLogitsWarper(sampling.temperature),
        TopKLogitsWarper(sampling.top_k),
        TopPLogitsWarper(sampling.top_p),
    ]
    applied = {}
    for times in (1, 2):
        scores = logits.clone()
        for _ in range(times):
            for warper in warpers:
                scores = warper(ids, scores)
        difference = (scores.softmax(-1) - seen[0].softmax(-1)).abs().max()
        applied[f"{times}x"] = float(difference)
    return applied
