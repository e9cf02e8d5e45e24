"""What a chain run has, for trees: the same seed gives a row the same tokens batched or
alone, stopping hooks, exact lengths, the KL cap, the meter's refusals, ``tree="auto"``,
bad shapes and unsupported models."""

import pytest
import torch
import torch_tiny_models as tiny
import transformers

from cactus_theory import decode, trees
from cactus_theory.decode.tree_shape import parse_tree

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SAMPLING = dict(temperature=1.0, top_k=8, top_p=0.95)


@pytest.fixture(scope="module")
def pair():
    verifier = tiny.llama(seed=0, vocab=16, init=0.3)
    return verifier, tiny.perturbed(verifier, scale=0.3)


def sampled(pair, ids, mask, seed=None, generator=None, **extra):
    verifier, draft = pair
    settings = dict(rule="lift:cactus:delta=0.5", tree="3,2", max_new_tokens=12, eos_token_id=[])
    return decode.speculative_generate(
        verifier, draft, ids, attention_mask=mask,
        generator=generator or torch.Generator().manual_seed(seed), **(settings | extra),
        **SAMPLING,
    )  # fmt: skip


def test_the_same_seed_gives_a_row_its_tokens_batched_or_alone(pair):
    """Each row draws from its own stream, seeded from the generator in row order: the
    batch's rows equal the rows decoded one by one with the same generator (the first row
    alone with a fresh seed), although their trees and paths differ."""
    ids, mask = tiny.left_padded_prompts(batch=3, vocab=16, pads=(0, 2, 5))
    batched = sampled(pair, ids, mask, seed=7)
    generator = torch.Generator().manual_seed(7)
    alone = []
    for row in range(3):
        prompt = ids[row][mask[row] == 1][None]
        alone += sampled(pair, prompt, torch.ones_like(prompt), generator=generator).new_tokens
    assert batched.new_tokens == alone
    assert len({tuple(tokens) for tokens in alone}) == 3
    assert batched.new_tokens != sampled(pair, ids, mask, seed=8).new_tokens


def test_a_stopping_hook_stops_a_row_at_its_token(pair):
    ids, mask = tiny.left_padded_prompts(batch=3, vocab=16, pads=(0, 2, 5))
    calls = []

    def stop(row, generated):
        calls.append((row, len(generated)))
        return row == 1 and len(generated) == 5

    result = sampled(pair, ids, mask, seed=1, stopping=stop)
    assert result.num_generated.tolist() == [12, 5, 12]
    assert all(length <= 5 for row, length in calls if row == 1)


@pytest.mark.parametrize("cap", [0.0, 1.5])
def test_the_kl_cap_holds_on_every_row(pair, cap):
    ids, mask = tiny.left_padded_prompts(batch=4, vocab=16, pads=(0, 1, 2, 3))
    free = sampled(pair, ids, mask, seed=3, rule="lift:cactus:delta=2.0", max_new_tokens=16)
    assert float(free.sequence_kl.max()) > 1.5  # uncapped, some row spends more
    capped = sampled(
        pair, ids, mask, seed=3, rule="lift:cactus:delta=2.0", max_new_tokens=16, max_kl=cap
    )
    assert bool((capped.sequence_kl <= cap + 1e-12).all())
    assert capped.num_generated.tolist() == [16] * 4


def test_the_meter_refuses_what_it_cannot_compute(pair):
    ids, mask = tiny.left_padded_prompts(batch=2, vocab=16)
    with pytest.raises(ValueError, match="^divergence: the exact law of lift"):
        sampled(pair, ids, mask, seed=0, children=trees.WITH_REPLACEMENT)
    quiet = sampled(pair, ids, mask, seed=0, children=trees.WITH_REPLACEMENT, divergence=False)
    assert quiet.token_kl is None and quiet.num_generated.tolist() == [12, 12]
    lossless = sampled(pair, ids, mask, seed=0, rule="rrs", children=trees.WITHOUT_REPLACEMENT)
    assert float(lossless.token_kl.abs().max()) == 0.0
    with pytest.raises(ValueError, match="^max_kl: needs the divergence meter"):
        sampled(pair, ids, mask, seed=0, divergence=False, max_kl=1.0)


def test_tree_auto_chooses_a_template_and_decodes_greedy_exactly(pair):
    from cactus_theory.core.processors import SamplingSettings
    from cactus_theory.decode.tree_auto import choose_for_prompts

    verifier, draft = pair
    ids, mask = tiny.left_padded_prompts(batch=2, vocab=16)
    choice = choose_for_prompts(
        verifier, draft, ids, mask, "walk", "auto:8", trees.DETERMINISTIC,
        SamplingSettings(1.0, 8, 0.95),
    )  # fmt: skip
    assert choice.shape.spec.startswith("parents:") and 1 <= choice.choice.nodes <= 8
    table = choice.acceptance
    assert len(table) == 6 and all(0 <= value <= 1 for row in table for value in row)
    assert 0 < table[0][0] and "tree auto: parents:" in choice.describe()
    reference = verifier.generate(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=10, pad_token_id=0
    )
    result = decode.speculative_generate(
        verifier, draft, ids, rule="walk", tree="auto:8", max_new_tokens=10, temperature=0,
        attention_mask=mask, pad_token_id=0, eos_token_id=[],
    )  # fmt: skip
    assert torch.equal(result.sequences, reference)


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ("", "tree: expected a spec"),
        ("4,x", "every width must be a positive integer"),
        ("parents:0,2", "node 2's parent 2 must be an earlier node"),
        ("parents:0,1,0", "breadth-first"),
        ("dynamic:50,depth=2,top=3", "keeps more nodes than its 12 candidates"),
        ("dynamic:4,width=2", "dynamic takes depth= and top="),
        ("9,9,9", "more than 256 nodes"),
        ("auto:0", "auto's node budget must be a positive integer"),
    ],
)
def test_bad_shapes_name_tree(tree, message):
    with pytest.raises(ValueError, match=message):
        parse_tree(tree)


def test_static_widths_and_templates():
    shape = parse_tree("4,2,1")
    assert shape.nodes == 20 and shape.depth == 3 and shape.widths() == [4, 8, 8]
    assert shape.parents[:6] == (0, 0, 0, 0, 1, 1)
    assert parse_tree("parents:0,0,1").widths() == [2, 1]
    dynamic = parse_tree("dynamic:16")
    assert dynamic.dynamic and dynamic.nodes == 16 and (dynamic.depth, dynamic.top) == (5, 4)


def test_models_whose_masks_a_tree_would_break_are_refused():
    ids = torch.tensor([[3, 4, 5]], device=tiny.DEVICE)
    windowed = transformers.MistralConfig(
        vocab_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, sliding_window=4,
    )  # fmt: skip
    model = transformers.MistralForCausalLM(windowed).to(tiny.DEVICE).eval()
    with pytest.raises(ValueError, match="sliding window of 4 positions would cut"):
        decode.speculative_generate(model, model, ids, rule="walk", tree="2", max_new_tokens=4)
    decode.speculative_generate(model, model, ids, rule="walk", tree="2", max_new_tokens=1)
    bloom = transformers.BloomConfig(vocab_size=16, hidden_size=32, n_layer=1, n_head=4)
    other = transformers.BloomForCausalLM(bloom).to(tiny.DEVICE).eval()
    with pytest.raises(ValueError, match="architecture 'bloom' is not one whose custom 4D"):
        decode.speculative_generate(other, other, ids, rule="walk", tree="2", max_new_tokens=4)
    llama = tiny.llama(seed=0, vocab=16)
    llama.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="uses 'flash_attention_2' attention"):
        decode.speculative_generate(llama, llama, ids, rule="walk", tree="2", max_new_tokens=4)


def test_a_streamer_gets_every_column_as_generate_feeds_it(pair):
    ids, mask = tiny.left_padded_prompts(batch=3, vocab=16, pads=(0, 2, 5))

    class Recorder:
        def __init__(self):
            self.puts, self.ended = [], False

        def put(self, values):
            self.puts.append(values.clone())

        def end(self):
            self.ended = True

    streamer = Recorder()
    result = sampled(pair, ids, mask, seed=2, streamer=streamer, eos_token_id=5)
    assert torch.equal(streamer.puts[0], ids.cpu()) and streamer.ended
    columns = torch.stack(streamer.puts[1:], dim=1)  # [B, T]
    assert torch.equal(columns, result.sequences[:, ids.shape[1] :])
