"""The public API the README promises (the numpy core, the sampler and the decoder) exists
and works together."""

import numpy as np

from cactus_theory import divergences, law, rules


def test_public_api_round_trip():
    target = np.array([0.5, 0.3, 0.2])
    draft = np.array([0.2, 0.3, 0.5])
    rule = rules.make("cactus", delta=0.5)
    assert 0.0 <= rule.accept_prob(target=target, draft=draft, token=2) <= 1.0
    assert rule.residual(target=target, draft=draft, token=2).shape == (3,)
    assert rule.adjusted_target(target=target, draft=draft, token=2).shape == (3,)
    assert np.isclose(law.output_law(rule, target=target, draft=draft).sum(), 1.0)
    assert 0.0 <= law.acceptance(rule, target=target, draft=draft) <= 1.0
    assert divergences.kl(target, target) == 0.0
    assert divergences.tv(target, draft) == 0.3
