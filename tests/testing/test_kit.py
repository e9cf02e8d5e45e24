"""The property-test kit catches what it claims to catch (a negative control per check),
reports without raising, and refuses bad arguments by name."""

import numpy as np
import pytest
from rule_examples import EntropyGamma

from cactus_theory import rules
from cactus_theory.cli import dispatch
from cactus_theory.core.rules.cactus import Cactus
from cactus_theory.sampler.rules import TorchCactus, TorchSpS, register_adapter
from cactus_theory.testing import CHECKS, check_rule, parametrize_with_rule_checks


class EntropyGammaClaimingMass(EntropyGamma):
    """γ reads the row's entropy, yet declares γ from q_n alone."""

    name = "test-liar-gamma"
    gamma_from_mass = True


class OverAccepting(rules.Rule):
    """Acceptance 1.5 where q_n > 0.3 (not a probability)."""

    name = "test-over-accepting"

    def accept_probs(self, target_probs, draft_probs):
        return np.where(draft_probs > 0, np.where(target_probs > 0.3, 1.5, 0.0), 0.0)

    def residuals_for(self, target_probs, draft_probs, tokens):
        return target_probs


class DoubleCactus(Cactus):
    """Cactus with 2δ inside the root, wrongly given cactus's torch half."""

    name = "test-double-cactus"

    def raised_mass(self, target_mass, cap=None):
        raised = np.minimum(
            1.0, target_mass + np.sqrt(4 * self.delta * target_mass * (1 - target_mass))
        )
        return raised if cap is None else np.minimum(raised, cap)


register_adapter(DoubleCactus, TorchCactus)


class UniformResidualSpS(TorchSpS):
    """SpS's torch half with a biased residual: uniform instead of (q − p)_+."""

    def residual(self, target_row, draft_row, draft_id, state):
        return (target_row >= 0).to(target_row.dtype)


class BiasedSpS(rules.SpS):
    name = "test-biased-sps"


register_adapter(BiasedSpS, UniformResidualSpS)


class InterpClaims(rules.Interp):
    """interp with false declarations: lossless at α = 0.5, greedy-consistent, and
    acceptance decreasing in α."""

    name = "test-interp-claims"
    lossless_at = {"alpha": 0.5}
    greedy_consistent = True
    tunable = rules.Tunable("alpha", 0.0, 1.0, increasing=False)


def failed(report):
    return {result.name for result in report.failures}


def test_a_false_gamma_declaration_is_caught_with_a_counterexample():
    report = check_rule(EntropyGammaClaimingMass(), examples=40)
    assert {"gamma-from-mass", "torch-decisions-equal-numpy"} <= failed(report)
    failure = next(r for r in report.failures if r.name == "gamma-from-mass")
    assert set(failure.counterexample) == {"target", "draft"}
    assert "γ of the whole row and γ of each q_n differ" in failure.detail
    assert "gamma-from-mass" in str(report) and "target = [" in str(report)


def test_an_acceptance_above_one_is_caught_and_shrunk():
    report = check_rule(OverAccepting(), only=["acceptance-in-unit-interval"], examples=40)
    (failure,) = report.failures
    assert "outside [0, 1]" in failure.detail
    assert len(failure.counterexample["target"]) <= 3  # shrunk to a small row


def test_a_torch_half_that_disagrees_is_caught():
    report = check_rule(
        DoubleCactus(0.5), only=["torch-decisions-equal-numpy", "torch-law-equals-numpy"]
    )
    assert failed(report) == {"torch-decisions-equal-numpy", "torch-law-equals-numpy"}


def test_the_chi_square_catches_a_biased_sampler():
    # Negative control of the statistical check: the residual is uniform, not (q − p)_+.
    biased = check_rule(BiasedSpS(), only=["sampler-law-chi-square"])
    assert failed(biased) == {"sampler-law-chi-square"}
    assert "p = " in biased.failures[0].detail
    assert check_rule(rules.SpS(), only=["sampler-law-chi-square"]).passed


def test_false_declarations_and_broken_budgets_are_caught():
    report = check_rule(
        InterpClaims(0.3), only=["lossless-at", "greedy-consistent", "tunable-monotone"]
    )
    assert failed(report) == {"lossless-at", "greedy-consistent", "tunable-monotone"}
    over = check_rule("cactus:delta=1.0", max_kl=0.01, only=["max-kl"], examples=30)
    assert failed(over) == {"max-kl"}
    within = check_rule("frontier:delta=0.05", max_kl=0.05, max_tv=1.0, only=["max-kl", "max-tv"])
    assert within.passed and [r.status for r in within.results] == ["passed", "passed"]


def test_undeclared_properties_are_skipped_and_say_so():
    report = check_rule("interp:alpha=0.3", only=["greedy-consistent", "gamma-from-mass"])
    assert report.passed
    assert [r.status for r in report.results] == ["skipped", "skipped"]
    assert "not declared" in report.results[0].detail


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"rule": 3}, "^rule: expected"),
        ({"rule": "cactus:delta=1", "examples": 0}, "^examples: must be an integer >= 1"),
        ({"rule": "cactus:delta=1", "max_kl": -1.0}, "^max_kl: must be a number >= 0"),
        ({"rule": "cactus:delta=1", "max_tv": "x"}, "^max_tv: must be a number >= 0"),
        ({"rule": "cactus:delta=1", "device": "tpu"}, "^device: expected 'cpu' or 'cuda"),
        ({"rule": "cactus:delta=1", "only": ["nope"]}, "^only: unknown check 'nope'"),
        ({"rule": "no-such-rule"}, "^name: unknown rule"),
    ],
)
def test_bad_arguments_are_value_errors(kwargs, message):
    rule = kwargs.pop("rule")
    with pytest.raises(ValueError, match=message):
        check_rule(rule, **kwargs)


@parametrize_with_rule_checks(
    ["cactus:delta=0.5"], checks=["law-is-a-distribution", "lossless-at", "max-kl"], examples=20
)
def test_one_pytest_item_per_check(rule, check):
    check(rule)  # max-kl is skipped (no budget asked for), the others pass


def test_parametrize_names_each_item_and_refuses_unknown_checks():
    mark = parametrize_with_rule_checks(["sps"], checks=CHECKS[:2])
    assert mark.kwargs["ids"] == [f"sps-{CHECKS[0]}", f"sps-{CHECKS[1]}"]
    with pytest.raises(ValueError, match="^checks: unknown check"):
        parametrize_with_rule_checks(["sps"], checks=["nope"])


def test_cactus_check_rule_exit_codes(tmp_path, capsys):
    module = tmp_path / "kit_rules.py"
    module.write_text(
        "import numpy as np\nfrom cactus_theory import rules\n\n"
        "class Over(rules.Rule):\n    name = 'test-kit-over'\n\n"
        "    def accept_probs(self, target_probs, draft_probs):\n"
        "        return np.where(draft_probs > 0, 2.0, 0.0)\n\n"
        "    def residuals_for(self, target_probs, draft_probs, tokens):\n"
        "        return target_probs\n\n"
        "rules.register(Over)\n"
    )
    only = ["--only", "acceptance-in-unit-interval", "law-is-a-distribution"]
    good = ["check", "--rule", "sglang:threshold_single=0.5", "--examples", "10", *only]
    assert dispatch.main(good) == 0
    assert (
        "check_rule(sglang:threshold_single=0.5,threshold_acc=1.0): passed"
        in capsys.readouterr().out
    )
    bad = ["check", "--rules-module", str(module), "--rule", "test-kit-over", *only]
    try:
        assert dispatch.main(bad) == 1
        out = capsys.readouterr().out
        assert "FAILED" in out and "outside [0, 1]" in out and "target = [" in out
    finally:
        rules.REGISTRY.pop("test-kit-over", None)
    assert dispatch.main(["check", "--rule", "nope"]) == 2
    assert "unknown rule 'nope'" in capsys.readouterr().err


class Raising(rules.Rule):
    """Raises from its acceptance, as a half-written rule does."""

    name = "test-kit-raising"

    def accept_probs(self, target_probs, draft_probs):
        raise ZeroDivisionError("half-written acceptance")

    def residuals_for(self, target_probs, draft_probs, tokens):
        return target_probs


def test_a_rule_that_raises_is_reported_by_every_check_and_the_report_is_kept(capsys):
    only = ["law-is-a-distribution", "sampler-law-chi-square"]
    report = check_rule(Raising(), examples=5, only=only)
    assert [result.name for result in report.failures] == only
    for result in report.failures:
        assert result.detail == "raised ZeroDivisionError: half-written acceptance"
    rules.register(Raising)
    try:
        assert dispatch.main(["check", "--rule", "test-kit-raising", "--only", *only]) == 1
    finally:
        rules.REGISTRY.pop("test-kit-raising", None)
    out = capsys.readouterr().out
    assert "check_rule(test-kit-raising): FAILED" in out
    assert out.count("raised ZeroDivisionError: half-written acceptance") == 2


class HalfResidual(rules.Rule):
    """SpS's acceptance with half its residual: r^n sums to 0.5."""

    name = "test-kit-half-residual"

    def accept_probs(self, target_probs, draft_probs):
        return rules.gsps_accept(target_probs, draft_probs)

    def residuals_for(self, target_probs, draft_probs, tokens):
        return 0.5 * rules.gsps_residual(target_probs, draft_probs)


def test_a_residual_that_is_not_a_law_fails_its_check_and_every_law_check():
    checks = ["residuals-are-laws", "law-is-a-distribution", "fast-law-equals-enumerated"]
    report = check_rule(HalfResidual(), examples=20, only=checks)
    assert failed(report) == set(checks)
    residuals = next(r for r in report.failures if r.name == "residuals-are-laws")
    assert "residuals_for returned a row that sums to 0.5" in residuals.detail
    assert residuals.counterexample is not None
