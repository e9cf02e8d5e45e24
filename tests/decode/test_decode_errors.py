"""Bad decoder inputs raise a ValueError that names the argument."""

import pytest
import torch
import torch_tiny_models as tiny

from cactus_theory import decode

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def models():
    verifier = tiny.llama(seed=0)
    return verifier, tiny.perturbed(verifier)


def ids(batch=2, length=4):
    return torch.randint(3, 97, (batch, length), generator=torch.Generator().manual_seed(0)).to(
        tiny.DEVICE
    )


@pytest.mark.parametrize(
    ("argument", "overrides"),
    [
        ("input_ids", {"input_ids": ids().float()}),
        ("input_ids", {"input_ids": ids()[0]}),
        ("input_ids", {"input_ids": ids()[:, :0]}),
        ("input_ids", {"input_ids": ids() + 200}),
        ("input_ids", {"input_ids": [[1, 2, 3]]}),
        ("attention_mask", {"attention_mask": torch.ones(2, 3, dtype=torch.int64)}),
        ("attention_mask", {"attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])}),
        ("attention_mask", {"attention_mask": torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]])}),
        ("attention_mask", {"attention_mask": torch.full((2, 4), 2)}),
        ("max_new_tokens", {"max_new_tokens": -1}),
        ("max_new_tokens", {"max_new_tokens": 2.5}),
        ("k", {"k": 0}),
        ("k", {"k": 1.5}),
        ("rule", {"rule": "nonsense"}),
        ("rule", {"rule": 3}),
        ("delta", {"rule": "cactus"}),
        ("delta", {"rule": "cactus:delta=-1"}),
        ("temperature", {"temperature": -0.5}),
        ("top_k", {"top_k": -2}),
        ("top_p", {"top_p": 1.5}),
        ("top_p", {"top_p": 0.0}),
        ("eos_token_id", {"eos_token_id": 500}),
        ("eos_token_id", {"eos_token_id": [1, -1]}),
        ("pad_token_id", {"pad_token_id": "x"}),
        ("generator", {"generator": 7}),
    ],
)
def test_bad_arguments_name_themselves(models, argument, overrides):
    verifier, draft = models
    arguments = {"input_ids": ids(), "rule": "sps", "k": 2, "max_new_tokens": 3, **overrides}
    with pytest.raises(ValueError, match=f"^{argument}"):
        decode.speculative_generate(verifier, draft, **arguments)


def test_mismatched_vocabularies_and_non_models(models):
    verifier, _ = models
    other = tiny.llama(seed=1, vocab=50)
    with pytest.raises(ValueError, match="^draft: vocabulary size 50"):
        decode.speculative_generate(verifier, other, ids(), rule="sps")
    with pytest.raises(ValueError, match="^verifier"):
        decode.speculative_generate(object(), other, ids(), rule="sps")
    with pytest.raises(ValueError, match="^input_ids"):
        decode.autoregressive_generate(verifier, None, ids() * 0 - 1)


def test_the_baseline_takes_the_same_keywords_and_names_any_other(models):
    """``autoregressive_generate`` reads the generation keywords as one settings object:
    a bad value names its keyword as for ``speculative_generate``; an unknown keyword is
    named too (a typo is never silently ignored)."""
    verifier, _ = models
    with pytest.raises(ValueError, match="^temperature: must be >= 0"):
        decode.autoregressive_generate(verifier, None, ids(), temperature=-0.5)
    with pytest.raises(ValueError, match="^max_new_token: not a generate keyword"):
        decode.autoregressive_generate(verifier, None, ids(), max_new_token=3)
    generator = torch.Generator().manual_seed(0)
    result = decode.autoregressive_generate(
        verifier, None, ids(), max_new_tokens=3, top_k=5, eos_token_id=[], generator=generator
    )
    assert result.num_generated.tolist() == [3, 3]
