"""A real vLLM engine (in-process, CPU) on a tiny random draft-model pair, vocabulary 128.

One engine serves every test; rules are chosen per request (``SamplingParams.extra_args``),
so vLLM's own sampler ("vllm") and each rule run in the same engine. Chi-square tests use
``goodness_of_fit.LEVEL`` = 1e-3 with the engine's fixed seed.
"""

import numpy as np
import pytest
import torch

pytest.importorskip(
    "vllm.v1.sample.rejection_sampler",
    reason="vLLM is not installed here (scripts/test.sh runs tests/vllm)",
)

from goodness_of_fit import LEVEL, chi_square_pvalue  # noqa: E402

from cactus_theory.vllm import accept, engine, metrics  # noqa: E402

PROMPT = [5, 17, 33, 40]
K = 3


@pytest.fixture(scope="module")
def llm(tiny_pair):
    verifier, draft = tiny_pair
    return engine.cactus_llm(
        verifier,
        draft,
        rule="sps",
        k=K,
        enforce_eager=True,
        dtype="float32",
        max_model_len=256,
        skip_tokenizer_init=True,
        seed=0,
        max_num_seqs=256,
    )


def generate(llm, prompts, rule, **params):
    from vllm.inputs import TokensPrompt

    params = {"temperature": 1.0, "ignore_eos": True, "detokenize": False, **params}
    sampling = engine.sampling_params(rule=rule, **params)
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts], sampling, use_tqdm=False
    )
    return [list(output.outputs[0].token_ids) for output in outputs]


def run_and_read(llm, prompts, rule, **params):
    metrics.reset(llm)
    tokens = generate(llm, prompts, rule, **params)
    return tokens, metrics.read(llm)


def second_token_law(verifier_dir):
    """The exact law of the second generated token after PROMPT under the verifier at T = 1:
    Σ_t q(t | PROMPT) q(· | PROMPT, t), from Hugging Face forwards in float64."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(verifier_dir, dtype=torch.float64).eval()
    with torch.no_grad():
        first = model(torch.tensor([PROMPT])).logits[0, -1].softmax(-1)  # [V]
        vocab = first.shape[0]
        extended = torch.cat(
            [torch.tensor(PROMPT)[None].expand(vocab, -1), torch.arange(vocab)[:, None]], 1
        )
        second = model(extended).logits[:, -1].softmax(-1)  # [V, V]
    return (first @ second).numpy()


def test_sps_emits_the_target_law_and_a_lossy_rule_is_caught(llm, tiny_pair):
    """The second token is emitted at the first verified draft position. Under SpS its law is
    exactly the verifier's; cactus δ = 1 on the same prompts must fail the same test."""
    wanted = second_token_law(tiny_pair[0])
    samples = 3000
    sps = generate(llm, [PROMPT] * samples, "sps", max_tokens=2)
    counts = np.bincount([row[1] for row in sps], minlength=len(wanted))
    assert chi_square_pvalue(counts, wanted) > LEVEL
    lossy = generate(llm, [PROMPT] * samples, "cactus:delta=1.0", max_tokens=2)
    lossy_counts = np.bincount([row[1] for row in lossy], minlength=len(wanted))
    assert chi_square_pvalue(lossy_counts, wanted) < LEVEL  # negative control


def test_delta_zero_keeps_vllms_accepted_length_and_delta_one_raises_it(llm):
    prompts = [[3 + i, 9, 27, 81 % 128] for i in range(48)]
    lengths = {}
    for rule in ("vllm", "cactus:delta=0.0", "cactus:delta=1.0"):
        _, read = run_and_read(llm, prompts, rule, max_tokens=48)
        lengths[rule] = read[rule]["accepted_length"]
        assert read[rule]["steps"] > 400
    # ~600 verify steps each: the standard error of an AL is about 0.04.
    assert abs(lengths["cactus:delta=0.0"] - lengths["vllm"]) < 0.2
    assert lengths["cactus:delta=1.0"] > lengths["vllm"] + 0.5


def test_metrics_match_vllms_own_counters_and_bound_the_kl(llm):
    before = spec_counters(llm)
    tokens, read = run_and_read(llm, [[7, 8, 9, 10]] * 16, "frontier:delta=0.05", max_tokens=32)
    after = spec_counters(llm)
    ours = read["frontier:delta=0.05"]
    assert ours["accepted"] == after["accepted"] - before["accepted"]
    assert ours["drafts"] == after["draft_tokens"] - before["draft_tokens"]
    assert 0 < ours["kl_per_token"] <= 0.05 + 1e-9  # frontier: KL <= δ at every position
    assert all(0 <= t < 128 for row in tokens for t in row)
    _, read = run_and_read(llm, [[7, 8, 9, 10]] * 4, "sps", max_tokens=16)
    assert read["sps"]["kl_per_token"] == 0.0


def spec_counters(llm):
    wanted = {
        "vllm:spec_decode_num_accepted_tokens": "accepted",
        "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    }
    found = {}
    for metric in llm.get_metrics():
        if metric.name in wanted:
            found[wanted[metric.name]] = found.get(wanted[metric.name], 0) + metric.value
    return found


def test_temperature_zero_output_is_the_verifiers_greedy_text(llm, tiny_pair):
    """Greedy rows keep vLLM's own path: the engine's rule (here a lossy one) changes
    nothing, and the text equals Hugging Face's greedy decoding of the verifier."""
    from transformers import AutoModelForCausalLM

    prompts = [[11, 12, 13, 14], [50, 60, 70, 80], [99, 3, 99, 3]]
    _, read = run_and_read(llm, prompts, "cactus:delta=1.0", temperature=0.0, max_tokens=20)
    assert set(read) == {"vllm-greedy"}
    ours = generate(llm, prompts, "cactus:delta=1.0", temperature=0.0, max_tokens=20)
    theirs = generate(llm, prompts, "vllm", temperature=0.0, max_tokens=20)
    assert ours == theirs
    model = AutoModelForCausalLM.from_pretrained(tiny_pair[0], dtype=torch.float32).eval()
    for prompt, row in zip(prompts, ours, strict=True):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            for _ in range(20):
                ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
        assert row == ids[0, len(prompt) :].tolist()


def test_bad_configuration_is_refused_in_the_caller(tiny_pair):
    with pytest.raises(ValueError, match="draft_sample_method"):
        engine.cactus_llm(*tiny_pair, rule="cactus:delta=1.0", draft_sample_method="greedy")
    with pytest.raises(ValueError, match="name"):
        engine.sampling_params(rule="nonsense:delta=1")
    with pytest.raises(ValueError, match="k"):
        engine.speculative_config("draft", 0)


def test_placeholder_constant_is_vllms():
    from vllm.v1.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID

    assert accept.PAD_ID == PLACEHOLDER_TOKEN_ID
