"""``model.generate(custom_generate=cactus_generate, ...)``: generate()'s interface around the
decoder's loop (``cactus_theory.decode.hf``).

- Greedy equals plain ``model.generate(do_sample=False)`` token for token on a left-padded
  ragged batch of 5 (float64 models, as test_decode_greedy), with rules that accept only
  the verifier's argmax at temperature 0, a perturbed copy, a GPT-2 pair, a feature draft,
  and an EOS that stops rows at different lengths.
- Sampled: with the same seed (``generator=`` or ``torch.manual_seed``) it emits the tokens
  of ``speculative_generate``; the law of a sampled run is checked exactly (chi-square at
  LEVEL with fixed seeds, and a negative control the test must reject).
- Stop strings, other stopping criteria and streamers act where and as generate() does.
- Options it cannot honour are ValueErrors naming them.
- The hub layout: ``custom_generate=<repository root>``, ``trust_remote_code=True``,
  offline, through the same function.
"""

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch_tiny_models as tiny
from goodness_of_fit import LEVEL, chi_square_pvalue
from transformers import StoppingCriteria, StoppingCriteriaList, StopStringCriteria, TextStreamer
from transformers.generation.streamers import BaseStreamer

from cactus_theory import decode, law, rules
from cactus_theory.core.processors import SamplingSettings
from cactus_theory.decode.feature_draft import FeatureDraft, FeatureDraftConfig
from cactus_theory.decode.hf import CactusGenerateOutput, cactus_generate
from cactus_theory.sampler.processors import process_logits

MAX_NEW = 20
REPOSITORY = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def verifier():
    return tiny.llama(seed=0, vocab=99)


@pytest.fixture(scope="module")
def draft(verifier):
    return tiny.perturbed(verifier)


@pytest.fixture(scope="module")
def prompts():
    return tiny.left_padded_prompts(vocab=99)


@pytest.fixture(scope="module")
def tokenizer():
    """The character-level tokenizer, decoding characters without separators (as
    ``StopStringCriteria`` needs)."""
    from tokenizers import decoders

    characters = tiny.chatml_tokenizer()
    characters.backend_tokenizer.decoder = decoders.Fuse()
    return characters


def plain(model, prompts, **options):
    ids, mask = prompts
    options = {"do_sample": False, "max_new_tokens": MAX_NEW, "pad_token_id": 0, **options}
    return model.generate(input_ids=ids, attention_mask=mask, **options)


def ours(model, draft, prompts, **options):
    return plain(model, prompts, custom_generate=cactus_generate, draft_model=draft, **options)


# --- greedy equality -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "k"),
    [("sps", 1), ("cactus:delta=1.0", 3), ("frontier:delta=0.5", 4), ("tas", 2)],
)
def test_greedy_equals_generate_on_a_ragged_batch(verifier, draft, prompts, rule, k):
    expected = plain(verifier, prompts)
    output = ours(verifier, draft, prompts, rule=rule, k=k, return_dict_in_generate=True)
    assert isinstance(output, CactusGenerateOutput)
    assert output.sequences.device == prompts[0].device
    assert torch.equal(output.sequences, expected)
    # Ragged for real: in some step the rows accepted different numbers of drafts.
    steps = output.accepted_lengths
    active = steps >= 0
    assert any(len(set(row[keep].tolist())) > 1 for row, keep in zip(steps, active, strict=True))
    assert output.num_generated.tolist() == [MAX_NEW] * 5
    assert torch.all(output.sequence_kl == 0)  # greedy: every emitted law is q


def test_greedy_with_a_rule_object_an_eos_and_a_generation_config(verifier, draft, prompts):
    from transformers import GenerationConfig

    unbounded = plain(verifier, prompts)
    eos = int(unbounded[1, prompts[0].shape[1] + 4])  # a token row 1 emits fifth
    config = GenerationConfig(
        do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=0
    )
    ids, mask = prompts
    expected = verifier.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    assert expected.shape[1] < unbounded.shape[1] or bool((expected == eos).any())
    output = verifier.generate(
        input_ids=ids,
        attention_mask=mask,
        generation_config=config,
        custom_generate=cactus_generate,
        draft_model=draft,
        rule=rules.make("cactus", delta=0.5),
        k=3,
    )
    assert torch.equal(output, expected)


def test_greedy_gpt2_and_an_exact_copy(prompts):
    verifier = tiny.gpt2(seed=2, vocab=99)
    expected = plain(verifier, prompts)
    assert torch.equal(ours(verifier, tiny.perturbed(verifier), prompts, k=3), expected)
    assert torch.equal(ours(verifier, copy.deepcopy(verifier), prompts, k=4), expected)


def test_a_feature_draft_is_a_draft_model(verifier, prompts):
    config = FeatureDraftConfig(
        hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64
    )
    feature_draft = FeatureDraft.build(verifier, config, seed=3)
    output = ours(verifier, feature_draft, prompts, rule="cactus:delta=1.0", k=3)
    assert torch.equal(output, plain(verifier, prompts))


# --- sampling --------------------------------------------------------------------------------


SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 30, "top_p": 0.9}


def direct(verifier, draft, prompts, rule, k, generator, max_new=MAX_NEW):
    ids, mask = prompts
    return decode.speculative_generate(
        verifier, draft, ids, rule=rule, k=k, max_new_tokens=max_new, temperature=0.8,
        top_k=30, top_p=0.9, eos_token_id=[], pad_token_id=0, attention_mask=mask,
        generator=generator,
    )  # fmt: skip


def test_same_seed_same_tokens_as_speculative_generate(verifier, draft, prompts):
    rule = "cactus:delta=1.0"
    expected = direct(verifier, draft, prompts, rule, 3, torch.Generator().manual_seed(5))
    output = ours(
        verifier, draft, prompts, rule=rule, k=3, generator=torch.Generator().manual_seed(5),
        return_dict_in_generate=True, **SAMPLING,
    )  # fmt: skip
    assert torch.equal(output.sequences.cpu(), expected.sequences)
    assert torch.equal(output.sequence_kl, expected.sequence_kl)
    assert torch.equal(output.accepted_lengths, expected.accepted_lengths)
    assert bool((output.sequence_kl > 0).all())  # a lossy rule, measured per row
    # torch.manual_seed: the global generator, as speculative_generate with generator=None.
    torch.manual_seed(11)
    seeded = ours(verifier, draft, prompts, rule=rule, k=3, **SAMPLING)
    torch.manual_seed(11)
    again = direct(verifier, draft, prompts, rule, 3, None)
    assert torch.equal(seeded.cpu(), again.sequences)
    assert not torch.equal(seeded.cpu(), expected.sequences)  # another seed, other tokens


def test_num_return_sequences_decodes_each_copy_on_its_own(verifier, draft):
    ids = torch.tensor([[5, 9, 14, 3]], device=tiny.DEVICE)
    output = ours(
        verifier, draft, (ids, torch.ones_like(ids)), k=2, num_return_sequences=3,
        generator=torch.Generator().manual_seed(2), **SAMPLING,
    )  # fmt: skip
    assert output.shape == (3, 4 + MAX_NEW)
    assert len({tuple(row) for row in output[:, 4:].tolist()}) == 3


# The law: a vocabulary-8 pair, T = 1, top-k 6, top-p 0.97; a row decodes 3 tokens with
# k = 2, so x1 and x2 sit at verified positions and x3 is a plain or bonus token (law q):
# P(x1, x2, x3) = μ(x1) μ(x2 | x1) q(x3 | x1 x2), μ = law.output_law of the rule.
VOCAB = 8
ROWS = 12_000
LAW_SETTINGS = SamplingSettings(temperature=1.0, top_k=6, top_p=0.97)
PROMPT = [5, 1, 6, 2]


def next_laws(model, prefixes):
    ids = torch.tensor(prefixes, device=tiny.DEVICE)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, -1]
    return process_logits(logits, LAW_SETTINGS).double().cpu().numpy()  # [len, V]


def exact_joint(verifier, draft, rule) -> np.ndarray:
    ones = [PROMPT + [a] for a in range(VOCAB)]
    twos = [PROMPT + [a, b] for a in range(VOCAB) for b in range(VOCAB)]
    first = law.output_law(rule, next_laws(verifier, [PROMPT])[0], next_laws(draft, [PROMPT])[0])
    second = law.output_law(rule, next_laws(verifier, ones), next_laws(draft, ones))  # [x1, x2]
    third = next_laws(verifier, twos).reshape(VOCAB, VOCAB, VOCAB)
    return (first[:, None, None] * second[:, :, None] * third).reshape(-1)


def test_a_sampled_runs_law_is_the_exact_law():
    verifier = tiny.llama(seed=10, vocab=VOCAB, hidden=16, init=0.3)
    draft = tiny.llama(seed=11, vocab=VOCAB, hidden=16, layers=1, init=0.3)
    rule = rules.parse("cactus:delta=0.3")
    ids = torch.tensor([PROMPT], device=tiny.DEVICE)
    output = verifier.generate(
        input_ids=ids, custom_generate=cactus_generate, draft_model=draft, rule=rule, k=2,
        do_sample=True, temperature=1.0, top_k=6, top_p=0.97, max_new_tokens=3,
        num_return_sequences=ROWS, eos_token_id=None, pad_token_id=0,
        generator=torch.Generator().manual_seed(41),
    )  # fmt: skip
    new = output[:, -3:].cpu().numpy()
    cells = (new[:, 0] * VOCAB + new[:, 1]) * VOCAB + new[:, 2]
    counts = np.bincount(cells, minlength=VOCAB**3)
    assert chi_square_pvalue(counts, exact_joint(verifier, draft, rule)) > LEVEL
    # Negative control: the lossless law (what SpS would emit) is rejected.
    assert chi_square_pvalue(counts, exact_joint(verifier, draft, rules.parse("sps"))) < LEVEL


# --- stopping and streaming ------------------------------------------------------------------


#: An EOS id the tiny verifier does not emit here (<|im_start|>). generate() pads a row
#: that a stop string or another criterion stopped only when an EOS criterion exists
#: (``_sample``'s ``has_eos_stopping_criteria``; without one the row goes on decoding
#: until every row has stopped); with it, both pad from the stop on.
EOS = 1


def stop_string_of(verifier, prompts, tokenizer) -> str:
    """Two characters row 2 generates at its 7th and 8th new tokens."""
    unbounded = plain(verifier, prompts)
    return tokenizer.decode(unbounded[2, prompts[0].shape[1] + 6 : prompts[0].shape[1] + 8])


def test_a_stop_string_stops_the_row_where_generate_does(verifier, draft, prompts, tokenizer):
    stop = stop_string_of(verifier, prompts, tokenizer)
    expected = plain(verifier, prompts, stop_strings=[stop], tokenizer=tokenizer, eos_token_id=EOS)
    start = prompts[0].shape[1]
    assert bool((expected[2, start + 8 :] == 0).all())  # row 2 stopped after 8 tokens
    assert bool((expected[2, start + 7] != 0).all())
    criteria = StoppingCriteriaList([StopStringCriteria(tokenizer, [stop])])
    output = ours(verifier, draft, prompts, k=4, stopping_criteria=criteria, eos_token_id=EOS)
    assert torch.equal(output, expected)
    # Without an EOS id cactus_generate still pads a stopped row (generate() would not).
    output = ours(verifier, draft, prompts, k=4, stopping_criteria=criteria)
    assert torch.equal(output[2], expected[2])


class StopAfterToken(StoppingCriteria):
    """Stops a row right after it emits ``token``; counts its calls."""

    def __init__(self, token: int) -> None:
        self.token, self.calls = token, 0

    def __call__(self, input_ids, scores, **kwargs):
        self.calls += 1
        assert scores is None  # as generate() passes it without output_scores
        return input_ids[:, -1] == self.token


def test_a_users_stopping_criterion_sees_each_token(verifier, draft, prompts):
    unbounded = plain(verifier, prompts)
    token = int(unbounded[0, prompts[0].shape[1] + 3])
    criteria = {"stopping_criteria": [StopAfterToken(token)], "eos_token_id": EOS}
    expected = plain(verifier, prompts, **criteria)
    criterion = StopAfterToken(token)
    output = ours(verifier, draft, prompts, k=4, stopping_criteria=[criterion], eos_token_id=EOS)
    assert torch.equal(output, expected)
    assert criterion.calls >= int((output[:, prompts[0].shape[1] :] != 0).sum()) // 2


class Recorder(BaseStreamer):
    def __init__(self) -> None:
        self.calls = []

    def put(self, value):
        self.calls.append(value.clone())

    def end(self):
        self.calls.append("end")


def test_a_streamer_gets_what_generate_gives_it(verifier, draft, prompts):
    eos = int(plain(verifier, prompts)[3, prompts[0].shape[1] + 2])
    reference, streamed = Recorder(), Recorder()
    expected = plain(verifier, prompts, eos_token_id=eos, streamer=reference)
    output = ours(verifier, draft, prompts, k=4, eos_token_id=eos, streamer=streamed)
    assert torch.equal(output, expected)
    assert len(streamed.calls) == len(reference.calls)
    assert streamed.calls[-1] == reference.calls[-1] == "end"
    for got, wanted in zip(streamed.calls[:-1], reference.calls[:-1], strict=True):
        assert torch.equal(got.cpu(), wanted.cpu())  # the prompt, then [B] per column


class CollectingTextStreamer(TextStreamer):
    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer, skip_prompt=True)
        self.text = ""

    def on_finalized_text(self, text: str, stream_end: bool = False):
        self.text += text


def test_a_text_streamer_receives_the_tokens_in_order(verifier, draft, tokenizer):
    ids = torch.tensor([[5, 40, 41, 42, 43]], device=tiny.DEVICE)
    prompt = (ids, torch.ones_like(ids))
    reference, streamed = CollectingTextStreamer(tokenizer), CollectingTextStreamer(tokenizer)
    expected = plain(verifier, prompt, streamer=reference)
    output = ours(verifier, draft, prompt, k=3, streamer=streamed)
    assert torch.equal(output, expected)
    assert streamed.text == reference.text == tokenizer.decode(expected[0, 5:])
    assert len(streamed.text) > 0


def test_the_decoders_hooks_are_the_same_in_both_loops(verifier, draft, prompts):
    """The stopping hook and the streamer of speculative_generate and
    autoregressive_generate (greedy: the same tokens)."""
    ids, mask = prompts
    stop_token = int(plain(verifier, prompts)[4, ids.shape[1] + 5])
    streams = []
    for function in (decode.speculative_generate, decode.autoregressive_generate):
        recorder = Recorder()
        result = function(
            verifier, draft, ids, rule="sps", k=3, max_new_tokens=MAX_NEW, temperature=0,
            eos_token_id=[], pad_token_id=0, attention_mask=mask, streamer=recorder,
            stopping=lambda row, generated: generated[-1] == stop_token,
        )  # fmt: skip
        new = result.sequences[:, ids.shape[1] :]
        for row, count in enumerate(result.num_generated.tolist()):
            tokens = new[row, :count].tolist()
            assert stop_token not in tokens[:-1]
            assert tokens[-1] == stop_token or count == MAX_NEW
        columns = torch.stack(recorder.calls[1:-1], dim=1)  # [B, T]
        assert torch.equal(columns, new)
        assert torch.equal(recorder.calls[0], ids.cpu())
        streams.append(result.sequences)
    assert torch.equal(streams[0], streams[1])


# --- what it refuses -------------------------------------------------------------------------


class Nudge:
    """A user logits processor (only the verifier would see it)."""

    def __call__(self, input_ids, scores):
        return scores


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"num_beams": 2}, "num_beams"),
        ({"do_sample": True, "num_beams": 2}, "num_beams"),
        ({"prompt_lookup_num_tokens": 3}, "prompt_lookup_num_tokens"),
        ({"repetition_penalty": 1.3}, "repetition_penalty"),
        ({"no_repeat_ngram_size": 2}, "no_repeat_ngram_size"),
        ({"do_sample": True, "min_p": 0.1}, "min_p"),
        ({"do_sample": True, "typical_p": 0.9}, "typical_p"),
        ({"logits_processor": [Nudge()]}, "logits_processor"),
        ({"suppress_tokens": [4]}, "suppress_tokens"),
        ({"output_scores": True, "return_dict_in_generate": True}, "output_scores"),
        ({"output_logits": True, "return_dict_in_generate": True}, "output_logits"),
        ({"rule": "cactus:delta=-1"}, "delta"),
        ({"rule": "nonsense"}, "rule"),
        ({"k": 0}, "k"),
        ({"draft_model": None}, "draft_model"),
    ],
)
def test_unsupported_options_are_value_errors_naming_them(verifier, draft, prompts, options, named):
    options = {"draft_model": draft, **options}
    with pytest.raises(ValueError, match=f"^{named}"):
        plain(verifier, prompts, custom_generate=cactus_generate, **options)


def test_assisted_generation_keywords_and_custom_positions_are_refused(verifier, draft, prompts):
    with pytest.raises(ValueError, match="^assistant_model"):
        ours(verifier, draft, prompts, assistant_model=draft)
    ids, mask = prompts
    positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids) + 3
    with pytest.raises(ValueError, match="^position_ids"):
        ours(verifier, draft, prompts, position_ids=positions)


def test_the_draft_must_share_the_vocabulary(verifier, prompts):
    with pytest.raises(ValueError, match="^draft"):
        ours(verifier, tiny.llama(seed=3, vocab=97), prompts)


# --- the hub layout --------------------------------------------------------------------------


def test_the_hub_folder_runs_offline_with_stop_strings_and_a_streamer(
    verifier, draft, prompts, tokenizer, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    readme = (REPOSITORY / "custom_generate" / "README.md").read_text(encoding="utf-8")
    for keyword in ("draft_model", "rule", "k", "generator", "divergence", "max_kl"):
        assert f"`{keyword}`" in readme
    hub = {"custom_generate": str(REPOSITORY), "trust_remote_code": True, "draft_model": draft}
    assert torch.equal(plain(verifier, prompts, k=3, **hub), plain(verifier, prompts))
    stop = stop_string_of(verifier, prompts, tokenizer)
    strings = {"stop_strings": [stop], "tokenizer": tokenizer, "eos_token_id": EOS}
    expected = plain(verifier, prompts, **strings)
    output = plain(verifier, prompts, **strings, **hub)
    assert torch.equal(output, expected)
    ids = torch.tensor([[5, 40, 41, 42, 43]], device=tiny.DEVICE)
    reference, streamed = CollectingTextStreamer(tokenizer), CollectingTextStreamer(tokenizer)
    plain(verifier, (ids, torch.ones_like(ids)), streamer=reference)
    plain(verifier, (ids, torch.ones_like(ids)), streamer=streamed, **hub)
    assert streamed.text == reference.text
    sampled = plain(
        verifier, prompts, rule="cactus:delta=1.0", generator=torch.Generator().manual_seed(5),
        return_dict_in_generate=True, max_new_tokens=MAX_NEW, **{**SAMPLING, **hub},
    )  # fmt: skip
    expected = direct(
        verifier, draft, prompts, "cactus:delta=1.0", 5, torch.Generator().manual_seed(5)
    )
    assert torch.equal(sampled.sequences.cpu(), expected.sequences)
