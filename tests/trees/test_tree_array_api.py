"""Tree rules declaring ``array_api`` run unchanged on torch tensors and agree with numpy
(the torch tree sampler and the decoder call them as they are)."""

import numpy as np
import pytest
from nodes import random_node

from cactus_theory import trees

torch = pytest.importorskip("torch")

SPECS = [
    "walk",
    "rrs",
    "lift:sglang:threshold_single=0.7,threshold_acc=0.5",
    "sglang-tree:threshold_single=0.7,threshold_acc=0.5",
]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("scheme", [trees.DETERMINISTIC, trees.WITHOUT_REPLACEMENT, trees.HUB])
def test_torch_and_numpy_give_the_same_acceptances_and_residuals(spec, scheme, one_torch_thread):
    rule = trees.parse(spec)
    assert rule.array_api
    if scheme not in rule.schemes:
        pytest.skip(f"{spec} is not defined for {scheme}")
    rng = np.random.default_rng(11)
    for _ in range(10):
        node = random_node(rng, 7, 3, scheme)
        children = trees.drafted_tuples(node)  # [T, K]
        shape = (children.shape[0], node.vocab_size)
        target = np.broadcast_to(node.target, shape)
        rows = trees.proposals(np.broadcast_to(node.draft, shape), children, scheme)
        accepts = rule.sibling_accepts(target, rows, children)
        residual = rule.final_residual(target, rows, children)
        as_torch = [torch.as_tensor(np.array(a)) for a in (target, children)]
        torch_rows = trees.proposals(
            torch.as_tensor(np.array(np.broadcast_to(node.draft, shape))),
            as_torch[1],
            scheme,
        )
        np.testing.assert_allclose(torch_rows.numpy(), rows, atol=1e-15)
        torch_accepts = rule.sibling_accepts(as_torch[0], torch_rows, as_torch[1])
        torch_residual = rule.final_residual(as_torch[0], torch_rows, as_torch[1])
        np.testing.assert_allclose(torch_accepts.numpy(), accepts, atol=1e-14)
        np.testing.assert_allclose(
            torch.broadcast_to(torch_residual, shape).numpy(),
            np.broadcast_to(residual, shape),
            atol=1e-14,
        )
        uniforms = rng.random(children.shape[0])
        np.testing.assert_array_equal(
            trees.decide(torch_accepts, torch.as_tensor(uniforms)).numpy(),
            trees.decide(np.asarray(accepts), uniforms),
        )
