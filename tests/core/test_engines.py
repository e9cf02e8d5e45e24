"""The engines' relaxed rules against independent references written from the engines'
own definitions (plain loops, no rule methods), exact values on hand-worked rows, and the
settings the engines publish."""

import numpy as np
import pytest

from cactus_theory import divergences, law, rules


def sglang_reference(target, draft, threshold_single, threshold_acc):
    """SGLang's chain verify as a loop over the drafted token n: accept if q_n >= t_s, else
    with probability min(1, q_n / t_a); on rejection sample (q − e_n)_+ renormalised."""
    out = np.zeros_like(target)
    for n, p_n in enumerate(draft):
        if p_n == 0:
            continue
        accept = 1.0 if target[n] >= threshold_single else min(1.0, target[n] / threshold_acc)
        out[n] += p_n * accept
        residual = np.maximum(target - np.eye(target.size)[n], 0.0)
        if residual.sum() > 0:
            out += p_n * (1 - accept) * residual / residual.sum()
    return out


def trtllm_accepted(target, token, top_k, delta):
    """TensorRT-LLM's ``mtpRelaxedAcceptanceKernel`` for one position: walk the top-K
    candidates in order; the first always counts, later ones stop at q < q_top − δ."""
    order = np.argsort(-target, kind="stable")[:top_k]
    threshold = target[order[0]] - delta
    for place, candidate in enumerate(order):
        if place > 0 and threshold > target[candidate]:
            return False
        if candidate == token:
            return True
    return False


def decision_reference(target, draft, accepted):
    """p on the accepted tokens, the rest at argmax q."""
    out = np.where(accepted, draft, 0.0)
    out[int(np.argmax(target))] += draft[~accepted].sum()
    return out


def distinct_rows(seed, size, count):
    """Rows with no ties (so the engines' top-K order is unambiguous)."""
    generator = np.random.default_rng(seed)
    rows = generator.dirichlet(np.full(size, 0.3), size=count)
    assert all(np.unique(row).size == size for row in rows)
    return rows


@pytest.mark.parametrize("thresholds", [(1.0, 1.0), (0.3, 0.5), (0.0, 0.2), (0.9, 0.05)])
def test_sglang_law_equals_the_loop(thresholds):
    rule = rules.make("sglang", threshold_single=thresholds[0], threshold_acc=thresholds[1])
    targets, drafts = distinct_rows(1, 12, 40), distinct_rows(2, 12, 40)
    for target, draft in zip(targets, drafts, strict=True):
        expected = sglang_reference(target, draft, *thresholds)
        np.testing.assert_allclose(law.output_law(rule, target, draft), expected, atol=1e-14)


def test_sglang_by_hand_and_lossless_at_its_default():
    """q = (0.6, 0.3, 0.1), p = (0.2, 0.5, 0.3), t_s = 0.5, t_a = 0.6:
    a = (1, 0.5, 1/6); the law is p·a + Σ_n p_n (1 − a_n) q_{−n}/(1 − q_n)."""
    target, draft = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.5, 0.3])
    rule = rules.make("sglang", threshold_single=0.5, threshold_acc=0.6)
    np.testing.assert_allclose(rule.accept_probs(target, draft), [1.0, 0.5, 1 / 6])
    rejected_1 = 0.5 * 0.5 * np.array([0.6, 0.0, 0.1]) / 0.7
    rejected_2 = 0.3 * (5 / 6) * np.array([0.6, 0.3, 0.0]) / 0.9
    expected = np.array([0.2, 0.25, 0.05]) + rejected_1 + rejected_2
    np.testing.assert_allclose(law.output_law(rule, target, draft), expected, atol=1e-15)
    default = rules.make("sglang")
    np.testing.assert_allclose(law.output_law(default, target, draft), target, atol=1e-15)
    assert law.emitted_divergence(rule, target, draft) > 1e-3  # lossy below (1, 1)


@pytest.mark.parametrize("setting", [(10, 0.6), (8, 0.5), (1, 0.9), (3, 0.05), (20, 1.0)])
def test_relaxed_accepts_what_the_trtllm_kernel_accepts(setting):
    top_k, delta = setting
    rule = rules.make("relaxed", top_k=top_k, delta=delta)
    targets, drafts = distinct_rows(3, 30, 30), distinct_rows(4, 30, 30)
    for target, draft in zip(targets, drafts, strict=True):
        accepted = np.array([trtllm_accepted(target, n, top_k, delta) for n in range(30)])
        np.testing.assert_array_equal(rule.accept_mask(target), accepted)
        expected = decision_reference(target, draft, accepted)
        np.testing.assert_allclose(law.output_law(rule, target, draft), expected, atol=1e-15)


@pytest.mark.parametrize("setting", [(4, 0.5), (2, 0.1), (10, 0.0), (1, 1.0)])
def test_relaxed_ratio_by_its_definition(setting):
    top_k, ratio = setting
    rule = rules.make("relaxed-ratio", top_k=top_k, ratio=ratio)
    targets, drafts = distinct_rows(5, 25, 30), distinct_rows(6, 25, 30)
    for target, draft in zip(targets, drafts, strict=True):
        ranks = np.argsort(np.argsort(-target))
        accepted = (ranks < top_k) & (target >= ratio * target.max())
        expected = decision_reference(target, draft, accepted)
        np.testing.assert_allclose(law.output_law(rule, target, draft), expected, atol=1e-15)


def test_ties_at_the_kth_place_are_all_kept():
    target = np.array([0.4, 0.2, 0.2, 0.2])
    assert rules.make("relaxed", top_k=2, delta=0.3).accept_mask(target).tolist() == [True] * 4
    assert rules.make("relaxed-ratio", top_k=2, ratio=0.5).accept_mask(target).all()


def test_the_published_trtllm_setting_costs_divergence_cactus_bounds():
    """TensorRT-LLM's K = 10, δ = 0.6 on a flat-ish verifier: every top-10 token within 0.6
    of the top-1 is accepted, so the emitted law is far from q; the exact numbers are what
    the engine never reports."""
    target = np.array([0.3, 0.2, 0.15, 0.1, 0.08, 0.07, 0.05, 0.03, 0.01, 0.01])
    draft = np.full(10, 0.1)
    relaxed = rules.make("relaxed", top_k=10, delta=0.6)
    emitted = law.output_law(relaxed, target, draft)
    np.testing.assert_allclose(emitted, draft, atol=1e-15)  # everything accepted: law = p
    assert law.acceptance(relaxed, target, draft) == pytest.approx(1.0)
    assert law.emitted_divergence(relaxed, target, draft) == pytest.approx(
        divergences.kl(draft, target), rel=1e-12
    )
    # The frontier at the same KL accepts as much (h = p fits its budget).
    assert law.frontier_gap(relaxed, target, draft) == pytest.approx(0.0, abs=1e-12)


def test_bad_engine_parameters_name_the_argument():
    for spec, message in [
        ("sglang:threshold_single=1.5", "^threshold_single: must lie in"),
        ("sglang:threshold_acc=0", "^threshold_acc: must lie in"),
        ("relaxed:top_k=0", "^top_k: must be an integer >= 1"),
        ("relaxed:delta=-1", "^delta: must be a number >= 0"),
        ("relaxed-ratio:top_k=3,ratio=2", "^ratio: must lie in"),
        ("relaxed-ratio:ratio=0.5", "^top_k: rule 'relaxed-ratio' needs this parameter"),
    ]:
        with pytest.raises(ValueError, match=message):
            rules.parse(spec)
