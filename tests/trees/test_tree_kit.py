"""The kit on tree rules: ``check_rule`` takes tree rules (every registered one passes, a
wrong declaration or a broken method fails with a counterexample), and ``cactus check
--rule`` takes tree specs."""

import numpy as np
import pytest

from cactus_theory import trees
from cactus_theory.cli import dispatch
from cactus_theory.testing import TREE_CHECKS, check_rule, parametrize_with_rule_checks


def _spec(name: str) -> str:
    return f"{name}:delta=0.5" if name.startswith("cactus") else name


@pytest.mark.parametrize("name", trees.names())
def test_every_registered_tree_rule_passes_the_kit(name):
    report = check_rule(_spec(name), examples=15)
    report.assert_passed()
    assert [result.name for result in report.results] == list(TREE_CHECKS)


class ClaimsLossless(trees.Walk):
    """Declares lossless but halves the first acceptance: the law leaves q."""

    name = "test-false-lossless"

    def sibling_accepts(self, target_probs, proposals, children):
        accepts = super().sibling_accepts(target_probs, proposals, children).copy()
        accepts[..., 0] *= 0.5
        return accepts

    def final_residual(self, target_probs, proposals, children):
        return target_probs  # q, not q without the children: the law moves


class AcceptsTooMuch(trees.Walk):
    name = "test-accepts-too-much"
    lossless = False
    lossless_at = None

    def sibling_accepts(self, target_probs, proposals, children):
        return 1.5 * super().sibling_accepts(target_probs, proposals, children)


def test_a_wrong_declaration_and_a_broken_method_fail_with_counterexamples():
    report = check_rule(ClaimsLossless(), examples=30, only=["lossless"])
    assert not report.passed and report.failures[0].counterexample["node"]
    report = check_rule(AcceptsTooMuch(), examples=30, only=["node-law-is-a-distribution"])
    assert not report.passed
    budget = check_rule("sglang-tree:threshold_acc=0.3", max_kl=1e-3, only=["max-kl"])
    assert not budget.passed and "kl of the node law" in budget.failures[0].detail


class InheritsLosslessClosedForm(trees.Walk):
    """A lossy walk that keeps the walk's closed form (the law q): the kit must say so."""

    name = "test-stale-closed-form"
    lossless = False
    lossless_at = None

    def sibling_accepts(self, target_probs, proposals, children):
        return 0.5 * super().sibling_accepts(target_probs, proposals, children)


def test_a_stale_closed_form_is_caught():
    report = check_rule(
        InheritsLosslessClosedForm(), examples=20, only=["closed-forms-equal-enumerated"]
    )
    assert not report.passed
    assert "closed-form and enumerated laws differ" in report.failures[0].detail


def test_the_sampler_check_catches_a_decision_that_disagrees_with_the_law(monkeypatch):
    """Negative control for the chi-square: decisions taken with 1 − u instead of u."""
    from cactus_theory.core.trees import sample

    original = sample.decide
    monkeypatch.setattr(sample, "decide", lambda accepts, u: original(accepts, 1.0 - u) * 0)
    report = check_rule("rrs", only=["sampler-law-chi-square"])
    assert not report.passed


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="^only: unknown check 'torch-law-equals-numpy'"):
        check_rule("walk", only=["torch-law-equals-numpy"])
    with pytest.raises(ValueError, match="^rule: expected a rules.Rule, a trees.TreeRule"):
        check_rule(np.zeros(3))


@parametrize_with_rule_checks(["cactus-tree:delta=1.0"], checks=["lossless", "support-only"])
def test_one_pytest_item_per_tree_check(rule, check):
    check(rule)


def test_cactus_check_takes_tree_rules(capsys):
    assert dispatch.main(["check", "--rule", "walk", "--examples", "10"]) == 0
    assert "check_rule(walk): passed" in capsys.readouterr().out
    code = dispatch.main(
        [
            "check",
            "--rule",
            "sglang-tree:threshold_acc=0.3",
            "--max-kl",
            "0.001",
            "--only",
            "max-kl",
        ]
    )
    assert code == 1
