"""The V1 accept step on synthetic tensors in vLLM's flattened layout.

``accept_flat`` must make exactly the decisions of ``sampler.verify`` from the same uniforms
(ragged rows, zero drafts, -1 placeholders), never emit an id outside [0, V), and its emitted
law on one-draft batches must match the numpy ``law.output_law`` (chi-square at
``goodness_of_fit.LEVEL`` = 1e-3, fixed seeds, with a negative control that must be caught).
SpS must also match vLLM's own kernel in law.
"""

import numpy as np
import pytest
import torch

pytest.importorskip(
    "vllm.v1.sample.rejection_sampler",
    reason="vLLM is not installed here (scripts/test.sh runs tests/vllm)",
)

from goodness_of_fit import LEVEL, chi_square_pvalue  # noqa: E402

from cactus_theory import law, rules, sampler  # noqa: E402
from cactus_theory.vllm import accept, config, metrics  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPECS = [
    "sps",
    "cactus:delta=0.5",
    "cactus-exact:delta=0.5",
    "frontier:delta=0.5",
    "pareto:spread=1.0",
    "interp:alpha=0.3",
    "tas",
    "topk:k=3",
    "greedy",
    # The engines' rules (cactus_theory.engines) run on the generic adapter.
    "sglang:threshold_single=0.3,threshold_acc=0.5",
    "relaxed:top_k=10,delta=0.6",
    "relaxed-ratio:top_k=3,ratio=0.3",
]


def random_rows(count, vocab, generator, sharp=2.0):
    """[count, V] float32 rows with some exact zeros."""
    logits = torch.randn(count, vocab, generator=generator, dtype=torch.float64) * sharp
    probs = logits.softmax(-1)
    probs[probs < 0.01] = 0
    return (probs / probs.sum(-1, keepdim=True)).to(torch.float32)


def ragged_case(counts, vocab=11, seed=0):
    """A flattened batch: ids [N], target [N, V], draft [N, V], bonus laws [B, V]."""
    generator = torch.Generator().manual_seed(seed)
    total = sum(counts)
    target = random_rows(total, vocab, generator)
    draft = random_rows(total, vocab, generator)
    ids = torch.multinomial(draft.double(), 1, generator=generator)[:, 0]
    bonus_laws = random_rows(len(counts), vocab, generator)
    return ids, target, draft, bonus_laws


def reference_rows(rule, counts, ids, target, draft, bonus_laws, accept_u, sample_u):
    """Each row verified alone by ``sampler.verify`` with its own k and its bonus law."""
    rows = []
    start = 0
    for b, count in enumerate(counts):
        block = torch.cat([target[start : start + count], bonus_laws[b : b + 1]])[None]
        tokens, accepted = sampler.verify(
            block,
            draft[start : start + count][None],
            ids[start : start + count][None],
            rule,
            uniforms=(accept_u[b : b + 1, :count], sample_u[b : b + 1]),
        )
        rows.append((tokens[0].tolist(), int(accepted[0])))
        start += count
    return rows


@pytest.mark.parametrize("spec", SPECS)
def test_same_uniforms_same_tokens_as_verify_on_ragged_rows(spec):
    rule = rules.parse(spec)
    counts = [3, 0, 2, 1, 3, 3, 0, 2]
    ids, target, draft, bonus_laws = ragged_case(counts, seed=len(spec))
    generator = torch.Generator().manual_seed(7)
    accept_u = torch.rand(len(counts), 3, dtype=torch.float64, generator=generator)
    sample_u = torch.rand(len(counts), dtype=torch.float64, generator=generator)
    # vLLM samples the bonus itself: the token verify would draw from the bonus law.
    bonus = sampler.inverse_cdf(bonus_laws, sample_u)
    result = accept.accept_flat(
        rule, ids, counts, target, draft, bonus, width=6, uniforms=(accept_u, sample_u), check=True
    )
    assert result.token_ids.shape == (len(counts), 6)
    assert result.token_ids.dtype == torch.int32
    wanted = reference_rows(rule, counts, ids, target, draft, bonus_laws, accept_u, sample_u)
    for b, (tokens, accepted) in enumerate(wanted):
        row = result.token_ids[b].tolist()
        assert row[: len(tokens)] == tokens, (b, row, tokens)
        assert row[len(tokens) :] == [accept.PAD_ID] * (6 - len(tokens))
        assert int(result.num_accepted[b]) == accepted
    zero = [b for b, n in enumerate(counts) if n == 0]
    assert result.token_ids[zero, 0].tolist() == bonus[zero].tolist()


def test_zero_drafts_everywhere_places_the_bonus_tokens():
    vocab = 7
    bonus = torch.tensor([[3], [6], [0]])
    result = accept.accept_flat(
        rules.parse("cactus:delta=1.0"),
        torch.zeros(0, dtype=torch.int32),
        [0, 0, 0],
        torch.zeros(0, vocab),
        None,  # vLLM passes no draft probabilities when nothing was drafted
        bonus,
        width=4,
    )
    assert result.token_ids.tolist() == [[3, -1, -1, -1], [6, -1, -1, -1], [0, -1, -1, -1]]
    assert result.num_accepted.tolist() == [0, 0, 0]


def test_placeholder_ids_end_the_row_and_the_token_there_is_from_the_target():
    """A -1 draft at position i: drafts after it are ignored, and the token at i is a sample
    from q there (verify of the row cut to i drafts, with q_i as its last law)."""
    rule = rules.parse("cactus:delta=0.5")
    counts = [3, 3]
    ids, _, draft, bonus_laws = ragged_case(counts, seed=3)
    target = draft.clone()  # q = p: every real draft is accepted with a uniform of 0
    ids[1] = -1  # row 0: position 1 is a placeholder
    generator = torch.Generator().manual_seed(1)
    accept_u = torch.zeros(2, 3, dtype=torch.float64)  # accept every real draft
    sample_u = torch.rand(2, dtype=torch.float64, generator=generator)
    bonus = sampler.inverse_cdf(bonus_laws, sample_u)
    result = accept.accept_flat(
        rule, ids, counts, target, draft, bonus, uniforms=(accept_u, sample_u)
    )
    assert result.num_drafts.tolist() == [1, 3]
    assert result.num_accepted.tolist() == [1, 3]
    emitted = int(sampler.inverse_cdf(target[1:2], sample_u[:1])[0])
    assert result.token_ids[0].tolist() == [int(ids[0]), emitted, -1, -1]
    assert result.token_ids[1].tolist() == [*ids[3:6].tolist(), int(bonus[1])]


@pytest.mark.parametrize("spec", ["sps", "cactus:delta=2.0", "frontier:delta=1.0", "topk:k=2"])
def test_ids_always_in_range_on_hostile_rows(spec):
    """Rows with huge vocab-edge mass, zero draft mass at the drafted id, and placeholders:
    every emitted id is in [0, V) and every row has its emitted token."""
    vocab = 13
    generator = torch.Generator().manual_seed(5)
    counts = [4] * 40
    total = sum(counts)
    target = torch.zeros(total, vocab)
    target[:, -1] = 1.0  # all mass on the last id
    draft = random_rows(total, vocab, generator)
    ids = torch.randint(-1, vocab, (total,), generator=generator)
    bonus = torch.full((len(counts),), vocab - 1)
    result = accept.accept_flat(rules.parse(spec), ids, counts, target, draft, bonus, width=5)
    tokens = result.token_ids
    real = tokens[tokens != accept.PAD_ID]
    assert bool(((real >= 0) & (real < vocab)).all())
    emitted = tokens.gather(1, result.num_accepted[:, None])[:, 0]
    assert bool((emitted == vocab - 1).all())  # q puts all mass there


def test_one_hot_drafts_are_refused_for_rules_that_need_p_and_allowed_for_sps():
    counts = [2, 1]
    ids, target, _, _ = ragged_case(counts)
    bonus = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="draft_probs.*probabilistic"):
        accept.accept_flat(rules.parse("cactus:delta=1.0"), ids, counts, target, None, bonus)
    for spec in ("sps", "tas", "greedy"):
        accept.accept_flat(rules.parse(spec), ids, counts, target, None, bonus)


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        (lambda a: a.update(num_draft_tokens=[2, 2]), "num_draft_tokens"),
        (lambda a: a.update(target_probs=a["target_probs"][:, None]), "target_probs"),
        (lambda a: a.update(draft_probs=a["draft_probs"][:, :3]), "draft_probs"),
        (lambda a: a.update(bonus_token_ids=torch.tensor([0, 99])), "bonus_token_ids"),
        (lambda a: a.update(draft_token_ids=a["draft_token_ids"].double()), "draft_token_ids"),
        (lambda a: a.update(width=2), "width"),
    ],
)
def test_bad_input_is_a_value_error_naming_the_argument(change, argument):
    ids, target, draft, _ = ragged_case([2, 1])
    arguments = dict(
        draft_token_ids=ids,
        num_draft_tokens=[2, 1],
        target_probs=target,
        draft_probs=draft,
        bonus_token_ids=torch.tensor([0, 1]),
    )
    change(arguments)
    with pytest.raises(ValueError, match=argument):
        accept.accept_flat(rules.parse("sps"), **arguments)


# --- the emitted law -------------------------------------------------------------------

SAMPLES = 100_000
TARGET = np.array([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
DRAFT = np.array([0.05, 0.10, 0.15, 0.05, 0.45, 0.20])


def first_tokens(spec, seed, samples=SAMPLES):
    """The first emitted token of ``samples`` one-draft rows (drafts drawn from DRAFT)."""
    generator = torch.Generator().manual_seed(seed)
    target = torch.tensor(TARGET, dtype=torch.float32)[None].expand(samples, -1)
    draft = torch.tensor(DRAFT, dtype=torch.float32)[None].expand(samples, -1)
    ids = torch.multinomial(torch.tensor(DRAFT), samples, replacement=True, generator=generator)
    accept_u = torch.rand(samples, 1, dtype=torch.float64, generator=generator)
    sample_u = torch.rand(samples, dtype=torch.float64, generator=generator)
    result = accept.accept_flat(
        rules.parse(spec),
        ids,
        [1] * samples,
        target,
        draft,
        torch.zeros(samples, dtype=torch.int64),
        uniforms=(accept_u, sample_u),
    )
    return result.token_ids[:, 0].numpy()


@pytest.mark.parametrize(
    "spec",
    [
        "sps",
        "cactus:delta=0.1",
        "cactus-exact:delta=0.1",
        "frontier:delta=0.3",
        "sglang:threshold_single=0.2,threshold_acc=0.3",
        "relaxed:top_k=4,delta=0.5",
    ],
)
def test_emitted_law_matches_the_exact_numpy_law(spec):
    wanted = law.output_law(rules.parse(spec), target=TARGET, draft=DRAFT)
    tokens = first_tokens(spec, seed=11)
    counts = np.bincount(tokens, minlength=len(TARGET))
    assert chi_square_pvalue(counts, wanted) > LEVEL
    if spec != "sps":
        # Negative control: the same samples are not from q (the lossless law).
        assert chi_square_pvalue(counts, TARGET) < LEVEL


def vllm_sps_first_tokens(samples, seed):
    """vLLM's own rejection sampler (its CPU kernels) on the same one-draft batches."""
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    if current_platform.is_cpu():
        current_platform.register_triton_kernel_overrides()
    torch.manual_seed(seed)
    ids = torch.multinomial(torch.tensor(DRAFT), samples, replacement=True).to(torch.int32)
    target_logits = torch.tensor(TARGET, dtype=torch.float32).log()[None].repeat(samples, 1)
    draft_probs = torch.tensor(DRAFT, dtype=torch.float32)[None].repeat(samples, 1)
    metadata = fake_metadata(samples, all_random=True)
    original = getattr(rejection_sampler.rejection_sample, "__wrapped__", None)
    function = original or rejection_sampler.rejection_sample
    tokens = function(
        ids,
        [1] * samples,
        1,
        torch.arange(1, samples + 1, dtype=torch.int32),
        draft_probs,
        target_logits,
        torch.zeros(samples, 1, dtype=torch.int64),
        metadata,
    )
    return tokens[:, 0].numpy()


def fake_metadata(batch, all_random=False, all_greedy=False, temperature=None, generators=None):
    """The fields of vLLM's SamplingMetadata that the accept step reads."""
    from types import SimpleNamespace

    if temperature is None:
        temperature = torch.zeros(batch) if all_greedy else torch.ones(batch)
    return SimpleNamespace(
        all_greedy=all_greedy,
        all_random=all_random,
        temperature=temperature,
        generators=generators or {},
    )


def test_sps_matches_vllms_own_kernel_in_law():
    ours = np.bincount(first_tokens("sps", seed=3, samples=50_000), minlength=len(TARGET))
    theirs = np.bincount(vllm_sps_first_tokens(50_000, seed=4), minlength=len(TARGET))
    assert chi_square_pvalue(theirs, TARGET) > LEVEL  # vLLM's kernel is lossless here
    assert chi_square_pvalue(ours, TARGET) > LEVEL
    table = np.stack([ours, theirs])
    from scipy import stats

    assert stats.chi2_contingency(table).pvalue > LEVEL  # the same law


# --- the drop-in: routing, greedy rows, generators, metrics ------------------------------


class FakeOriginal:
    """Stands for vLLM's function: fills every row with 99 and records the call."""

    def __init__(self):
        self.calls = 0

    def __call__(self, ids, counts, max_spec_len, *rest, **kwargs):
        self.calls += 1
        return torch.full((len(counts), max_spec_len + 1), 99, dtype=torch.int32)


def call_drop_in(specs, metadata, counts=(2, 1, 2), original=None, vocab=11):
    ids, target, draft, _ = ragged_case(list(counts), vocab=vocab)
    cumulative = torch.tensor(np.cumsum(counts), dtype=torch.int32)
    original = original or FakeOriginal()
    with config.batch_rules(specs):
        tokens = accept.rejection_sample(
            original,
            ids.to(torch.int32),
            list(counts),
            3,
            cumulative,
            draft,
            target.clamp_min(1e-30).log(),
            torch.tensor([[1], [2], [3]]),
            metadata,
        )
    return tokens, original


def test_no_rule_means_vllms_own_function_alone():
    tokens, original = call_drop_in([None, None, None], fake_metadata(3, all_random=True))
    assert original.calls == 1 and bool((tokens == 99).all())


def test_greedy_rows_keep_vllms_path_and_the_rest_use_the_rule():
    metrics.recorder().reset()
    temperature = torch.tensor([0.0, 1.0, 1.0])
    metadata = fake_metadata(3, temperature=temperature)
    tokens, original = call_drop_in(["sps", "sps", "cactus:delta=1.0"], metadata)
    assert original.calls == 1
    assert bool((tokens[0] == 99).all())
    assert not bool((tokens[1:] == 99).any())
    snapshot = metrics.recorder().snapshot()
    assert set(snapshot) == {"vllm-greedy", "sps", "cactus:delta=1.0"}
    assert snapshot["sps"]["steps"] == 1 and snapshot["sps"]["drafts"] == 1
    assert snapshot["cactus:delta=1.0"]["kl_measured"]


def test_all_greedy_batches_never_reach_the_rule():
    tokens, original = call_drop_in(["sps"] * 3, fake_metadata(3, all_greedy=True))
    assert original.calls == 1 and bool((tokens == 99).all())


def test_per_request_generators_make_a_row_reproducible_whatever_its_neighbours():
    rows = []
    for neighbours_seed in (0, 1):
        torch.manual_seed(neighbours_seed)  # the unseeded rows' draws differ
        generators = {1: torch.Generator().manual_seed(42)}
        metadata = fake_metadata(3, all_random=True, generators=generators)
        tokens, _ = call_drop_in(["cactus:delta=0.3"] * 3, metadata, vocab=50)
        rows.append(tokens[1].tolist())
    assert rows[0] == rows[1]


def test_metrics_summaries():
    recorder = metrics.Recorder()
    recorder.add("cactus:delta=1.0", drafts=[3, 3], accepted=[3, 1], kl=[0.2, 0.1])
    recorder.add("sps", drafts=[2], accepted=[0], kl=None)
    summary = recorder.snapshot()
    assert summary["cactus:delta=1.0"]["accepted_length"] == 2.0
    assert summary["cactus:delta=1.0"]["tokens"] == 6
    assert summary["cactus:delta=1.0"]["kl_per_token"] == pytest.approx(0.3 / 6)
    assert summary["sps"]["kl_per_token"] == 0.0  # SpS is lossless: KL 0 without a meter
    with pytest.raises(ValueError, match="accepted"):
        recorder.add("sps", drafts=[1, 2], accepted=[1], kl=None)


def test_the_engine_meter_switch_turns_kl_off():
    metrics.recorder().reset()
    ids, target, draft, _ = ragged_case([2, 1])
    with config.batch_rules(["cactus:delta=1.0"] * 2, meter=False):
        accept.rejection_sample(
            FakeOriginal(),
            ids.to(torch.int32),
            [2, 1],
            2,
            torch.tensor([2, 3], dtype=torch.int32),
            draft,
            target.clamp_min(1e-30).log(),
            torch.tensor([[1], [2]]),
            fake_metadata(2, all_random=True),
        )
    summary = metrics.recorder().snapshot()["cactus:delta=1.0"]
    assert summary["steps"] == 2 and summary["kl_per_token"] is None


def test_the_runner_hook_resolves_each_rows_rule():
    """``plugin.row_specs``: extra_args, else additional_config, else the environment;
    "vllm" means vLLM's own sampler; the meter switch comes from additional_config."""
    from types import SimpleNamespace

    from cactus_theory.vllm import plugin

    def request(extra):
        return SimpleNamespace(sampling_params=SimpleNamespace(extra_args=extra))

    runner = SimpleNamespace(
        vllm_config=SimpleNamespace(
            additional_config={"cactus_rule": "cactus:delta=0.5", "cactus_meter": False}
        ),
        input_batch=SimpleNamespace(req_ids=["a", "b", "c"]),
        requests={
            "a": request(None),
            "b": request({"cactus_rule": "frontier:delta=1.0"}),
            "c": request({"cactus_rule": "vllm"}),
        },
    )
    assert plugin.row_specs(runner) == ["cactus:delta=0.5", "frontier:delta=1.0", None]
    assert plugin.engine_meter(runner) is False
    runner.vllm_config.additional_config = {}
    assert plugin.engine_meter(runner) is None
    assert plugin.row_specs(runner)[0] == config.env_default()
