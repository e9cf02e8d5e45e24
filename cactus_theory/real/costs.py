"""The costs that turn acceptance into speed: the draft cost c and the verify cost v_k,
both in autoregressive steps of the verifier, measured with the decoder itself.

Leviathan et al.'s speed-up of k drafts per verify call is (E[L] + 1)/(k c + v_k), with
E[L] the accepted drafts per call (``core.block``), c the cost of one draft token and v_k
the cost of one verify call of k + 1 tokens, both divided by T, the cost of one plain
autoregressive step. Their model takes v_k = 1 (verifying k + 1 tokens costs one step,
true when the device is memory-bound); on a CPU or at a large batch the verifier is
compute-bound and v_k grows towards k + 1, which is why the same acceptance buys less.

``measure_costs(setup, ks)`` decodes the same few prompts with plain autoregressive
decoding and with SpS at each k (``decode.autoregressive_generate`` and
``decode.speculative_generate``: the real loop, its caches and its sampler), in ``rounds``
interleaved rounds after one warm-up, and reads each run's ``timing``:

    T   = (total − prefill) / verifier calls          of the autoregressive run
    c   = draft seconds / drafted tokens / T          (SpS runs, pooled over k)
    v_k = (total − prefill − draft) / verify steps / T   (SpS at k)

so v_k charges a verify step everything it does besides drafting: the verifier forward of
k + 1 tokens, the processors, the sampler, the commit and the cache rollback (``cactus
decode``'s summary splits it into v, the forward, and o, the rest: ``decode.runs``). Each is the
median over rounds. The acceptance of SpS does not enter (only per-call and per-token
times), so the costs hold for any rule whose sampler costs about as much as SpS's
(``cactus bench sampler`` measures that).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from cactus_theory.core.processors import PAPER_SETTING, SamplingSettings


@dataclass(frozen=True)
class Costs:
    """c and v_k (module docstring), the step time T in seconds, and how they were
    measured (``settings``: prompts, tokens, rounds, device, dtype)."""

    draft_cost: float
    verify_costs: dict[int, float]
    step_seconds: float
    settings: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        data = asdict(self)
        data["verify_costs"] = {str(k): value for k, value in self.verify_costs.items()}
        return data


def costs_from_timings(baseline: dict, speculative: dict[int, dict]) -> Costs:
    """``Costs`` from one autoregressive run's ``timing`` and, per k, one SpS run's
    ``timing`` with the count of ``drafted`` tokens added (module docstring). The
    per-run terms are ``decode.runs.step_costs``' (the numbers ``cactus decode`` prints):
    v_k here is its verify cost plus the rest of the step, o."""
    from cactus_theory.decode.runs import step_costs, step_seconds

    step = step_seconds(baseline)
    if not step > 0:
        raise ValueError("baseline: its step time is not positive")
    drafted = sum(timing["drafted"] for timing in speculative.values())
    if not drafted:
        raise ValueError("speculative: the runs drafted no token")
    draft_seconds = sum(timing["draft"] for timing in speculative.values())
    verify = {}
    for k, timing in sorted(speculative.items()):
        found = step_costs(timing, timing["drafted"], k, 0.0, step)
        verify[k] = found.verify_cost + found.other_cost
    return Costs(draft_seconds / drafted / step, verify, step)


def measure_costs(
    setup,
    ks,
    *,
    num_prompts: int = 2,
    max_new_tokens: int = 24,
    sampling: SamplingSettings = PAPER_SETTING,
    rounds: int = 3,
    seed: int = 0,
    progress=None,
) -> Costs:
    """c and v_k for every k of ``ks`` on ``setup`` (a ``decode.runs.Setup``), measured
    with the decoder (module docstring); the median of ``rounds`` interleaved rounds.
    ``progress(text)`` is told what runs."""
    import torch

    from cactus_theory import decode, rules
    from cactus_theory.decode.runs import encode

    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1:
        raise ValueError(f"ks: draft lengths must be >= 1, got {ks}")
    for name, value in (("num_prompts", num_prompts), ("max_new_tokens", max_new_tokens),
                        ("rounds", rounds)):  # fmt: skip
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
    prompts = setup.prompts[:num_prompts]
    if not prompts:
        raise ValueError("prompts: measuring the costs needs at least one prompt")
    input_ids, mask = encode(setup, prompts)
    input_ids, mask = input_ids.to(setup.device), mask.to(setup.device)
    sps = rules.make("sps")

    def run(k: int | None, tokens: int) -> dict:
        common = dict(
            attention_mask=mask,
            max_new_tokens=tokens,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            eos_token_id=[],  # every run generates the same number of tokens
            generator=torch.Generator().manual_seed(seed),
            divergence=False,
        )
        if k is None:
            result = decode.autoregressive_generate(setup.verifier, input_ids=input_ids, **common)
            return dict(result.timing)
        result = decode.speculative_generate(
            setup.verifier, setup.draft, input_ids, rule=sps, k=k, **common
        )
        drafted = int(result.draft_counts.clamp(min=0).sum())
        return {**result.timing, "drafted": drafted}

    run(None, 4)  # warm-up: first calls allocate and pick kernels
    run(ks[-1], 4)
    measured: list[Costs] = []
    for index in range(rounds):
        if progress is not None:
            progress(f"costs: round {index + 1}/{rounds} (autoregressive, sps at k = {ks})")
        baseline = run(None, max_new_tokens)
        measured.append(costs_from_timings(baseline, {k: run(k, max_new_tokens) for k in ks}))
    return Costs(
        draft_cost=statistics.median(cost.draft_cost for cost in measured),
        verify_costs={k: statistics.median(cost.verify_costs[k] for cost in measured) for k in ks},
        step_seconds=statistics.median(cost.step_seconds for cost in measured),
        settings={
            "num_prompts": len(prompts),
            "max_new_tokens": max_new_tokens,
            "rounds": rounds,
            "sampling": sampling.label,
            "device": str(setup.device),
            "dtype": str(next(setup.verifier.parameters()).dtype).replace("torch.", ""),
            "threads": torch.get_num_threads(),
        },
    )
