"""Every bad input gets a ValueError that names the argument."""

from __future__ import annotations

import numpy as np
import pytest

from cactus_theory import divergences, law, rules
from cactus_theory.core import block, gamma, validate

GOOD_TARGET = np.array([0.5, 0.3, 0.2])
GOOD_DRAFT = np.array([0.2, 0.3, 0.5])


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ([0.5, np.nan, 0.5], "target: contains NaN or inf"),
        ([0.5, np.inf, 0.5], "target: contains NaN or inf"),
        ([0.7, -0.2, 0.5], "target: contains negative values"),
        ([0.5, 0.3, 0.3], "target: rows must sum to 1"),
        ([], "target: is empty"),
        (0.5, "target: must have a vocabulary axis"),
        (["a", "b", "c"], "target: must be an array of probabilities"),
    ],
)
def test_bad_target_rows(target, message):
    rule = rules.make("sps")
    with pytest.raises(ValueError, match=message):
        rule.accept_prob(target=target, draft=GOOD_DRAFT, token=0)
    with pytest.raises(ValueError, match=message.replace("target", "target", 1)):
        law.output_law(rule, target, GOOD_DRAFT)


def test_bad_draft_rows_name_the_draft():
    with pytest.raises(ValueError, match="draft: contains NaN"):
        law.acceptance(rules.make("sps"), GOOD_TARGET, [np.nan, 0.5, 0.5])


def test_shape_and_vocabulary_mismatch():
    with pytest.raises(ValueError, match="draft: shape"):
        law.output_law(rules.make("sps"), GOOD_TARGET, [0.5, 0.5])
    with pytest.raises(ValueError, match="draft: shape"):
        law.output_law(rules.make("sps"), np.tile(GOOD_TARGET, (2, 1)), GOOD_DRAFT)


def test_rows_within_tolerance_are_accepted_and_renormalised():
    almost = GOOD_TARGET * (1 + 5e-7)
    row = validate.distribution("target", almost)
    assert row.sum() == pytest.approx(1.0, abs=1e-15)
    with pytest.raises(ValueError, match="target: rows must sum to 1 within 1e-06"):
        validate.distribution("target", GOOD_TARGET * (1 + 5e-6))
    # Validating a validated row changes nothing (idempotent).
    assert np.array_equal(validate.distribution("target", row), row)


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (3, r"token: token id 3 is out of range \[0, 3\)"),
        (-1, r"token: token id -1 is out of range"),
        (1.0, "token: must be an integer token id"),
        (True, "token: must be an integer token id"),
        ("0", "token: must be an integer token id"),
    ],
)
def test_bad_token(token, message):
    with pytest.raises(ValueError, match=message):
        rules.make("cactus", delta=0.5).residual(target=GOOD_TARGET, draft=GOOD_DRAFT, token=token)


def test_token_with_zero_draft_probability_cannot_have_been_drafted():
    with pytest.raises(ValueError, match="token: draft probability of token 1 is 0"):
        rules.make("sps").accept_prob(target=GOOD_TARGET, draft=[0.5, 0.0, 0.5], token=1)


def test_per_token_api_needs_one_row():
    with pytest.raises(ValueError, match="target: expected one row"):
        rules.make("sps").accept_prob(
            target=np.tile(GOOD_TARGET, (2, 1)), draft=np.tile(GOOD_DRAFT, (2, 1)), token=0
        )


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("cactus", {"delta": -0.1}, "delta: must be >= 0"),
        ("cactus", {"delta": float("nan")}, "delta: must be finite"),
        ("cactus", {"delta": float("inf")}, "delta: must be finite"),
        ("cactus", {"delta": "half"}, "delta: expected a number, got 'half'"),  # "0.5" is 0.5
        ("cactus-exact", {"delta": -1.0}, "delta: must be >= 0"),
        ("cactus-exact", {"delta": 0.5, "divergence": "wasserstein"}, "divergence: unknown"),
        ("frontier", {"delta": -1e-9}, "delta: must be >= 0"),
        ("interp", {"alpha": 1.5}, r"alpha: must lie in \[0, 1\]"),
        ("interp", {"alpha": -0.1}, r"alpha: must lie in \[0, 1\]"),
        ("tas", {"epsilon": 0.0}, "epsilon: must be > 0"),
        ("tas", {"epsilon": 0.09, "alpha": -1.0}, "alpha: must be > 0"),
        ("topk", {"k": 0}, "k: must be >= 1"),
        ("topk", {"k": 2.5}, "k: must be an integer"),
        ("cactus", {}, "delta: rule 'cactus' needs this parameter"),
        ("sps", {"delta": 0.5}, "delta: not a parameter of rule 'sps'"),
        ("cactus", {"delta": 0.5, "alpha": 0.1}, "alpha: not a parameter of rule 'cactus'"),
        ("nonsense", {}, "name: unknown rule 'nonsense'"),
    ],
)
def test_bad_rule_parameters(name, params, message):
    with pytest.raises(ValueError, match=message):
        rules.make(name, **params)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("cactus:delta", "spec: expected key=value"),
        ("cactus:delta=abc", "delta: expected a number"),
        ("", "spec: expected"),
        ("topk:k=-3", "k: must be >= 1"),
        ("cactus:delta=0.5,delta=1", "delta: given twice"),
        ("cactus-exact:divergence=kl,delta=1,divergence=js", "divergence: given twice"),
        ("pareto:spread=1,spread=1", "spread: given twice"),
    ],
)
def test_bad_rule_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        rules.parse(spec)


def test_spec_round_trip():
    for spec in [
        "sps",
        "cactus:delta=0.5",
        "cactus-exact:delta=0.1,divergence=hellinger",
        "topk:k=5",
        "pareto:spread=1.0",
    ]:
        assert rules.spec_of(rules.parse(spec)) == spec


def test_law_needs_a_rule():
    with pytest.raises(ValueError, match="rule: expected a rule"):
        law.output_law("cactus", GOOD_TARGET, GOOD_DRAFT)


def test_decision_rules_have_no_branch_divergence():
    with pytest.raises(ValueError, match="rule: tas is a decision rule"):
        law.branch_divergence(rules.make("tas"), GOOD_TARGET, GOOD_DRAFT)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: block.expected_accepted(1.2, 3), r"alpha: values must lie in \[0, 1\]"),
        (lambda: block.expected_accepted(-0.1, 3), r"alpha: values must lie in \[0, 1\]"),
        (lambda: block.expected_accepted(np.nan, 3), "alpha: contains NaN or inf"),
        (lambda: block.expected_accepted(0.5, 0), "k: must be >= 1"),
        (lambda: block.expected_accepted(0.5), "k: needed when alpha is a single number"),
        (lambda: block.expected_accepted([0.5, 0.6], 3), "k: 3 does not match the 2"),
        (lambda: block.speedup(0.5, 3, cost_ratio=-1), "cost_ratio: must be >= 0"),
        (lambda: block.leviathan_speedup(1.5, 3, 0.1), r"alpha: must lie in \[0, 1\]"),
        (lambda: block.best_k(0.5, 0.1, k_max=0), "k_max: must be >= 1"),
    ],
)
def test_bad_block_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_bad_divergence_inputs():
    with pytest.raises(ValueError, match="b: shape"):
        divergences.kl([0.5, 0.5], [1.0])
    with pytest.raises(ValueError, match="a: contains negative"):
        divergences.tv([1.5, -0.5], [0.5, 0.5])
    with pytest.raises(ValueError, match="divergence: unknown divergence"):
        divergences.divergence("l2", [0.5, 0.5], [0.5, 0.5])


def test_bad_gamma_inputs():
    with pytest.raises(ValueError, match="delta: must be >= 0"):
        gamma.exact_raised_mass([0.5], -0.1)
    with pytest.raises(ValueError, match=r"target_mass: values must be finite probabilities"):
        gamma.exact_raised_mass([1.5], 0.1)
    with pytest.raises(ValueError, match=r"target_mass: values must be finite probabilities"):
        gamma.closed_form_raised_mass([np.nan], 0.1)
