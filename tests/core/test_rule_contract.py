"""What a rule's own methods return is checked on every call (``core.rules.contract``): a
residual that is not a law, an acceptance outside [0, 1], a target or recovery that is not
a law, a γ outside [0, 1] is a ValueError naming the rule and the method, in every law
function, the per-token API and the torch sampler; never a renormalised or clipped number.
"""

import numpy as np
import pytest

from cactus_theory import law, rules
from cactus_theory.core.rules import contract

TARGET = np.array([0.5, 0.3, 0.15, 0.05])
DRAFT = np.array([0.1, 0.2, 0.3, 0.4])


class ScaledResidual(rules.Rule):
    """SpS's acceptance; its residual (q − p)_+ / Σ (q − p)_+ times ``scale``."""

    name = "test-scaled-residual"

    def __init__(self, scale: float = 0.5) -> None:
        self.scale = scale

    def params(self):
        return {"scale": self.scale}

    def accept_probs(self, target_probs, draft_probs):
        return rules.gsps_accept(target_probs, draft_probs)

    def residuals_for(self, target_probs, draft_probs, tokens):
        return self.scale * rules.gsps_residual(target_probs, draft_probs)


class ShiftedResidual(ScaledResidual):
    """A residual with one entry moved by ``scale`` (negative entry, or NaN)."""

    name = "test-shifted-residual"

    def residuals_for(self, target_probs, draft_probs, tokens):
        residual = rules.gsps_residual(target_probs, draft_probs).copy()
        residual[..., 0] += self.scale
        residual[..., 1] -= self.scale
        return residual


class ConstantAcceptance(rules.Rule):
    """Acceptance ``value`` for every drafted token; the residual is q."""

    name = "test-constant-acceptance"

    def __init__(self, value: float = 3.0) -> None:
        self.value = value

    def params(self):
        return {"value": self.value}

    def accept_probs(self, target_probs, draft_probs):
        return np.where(draft_probs > 0, self.value, 0.0)

    def residuals_for(self, target_probs, draft_probs, tokens):
        return target_probs


class HalfTarget(rules.TargetRule):
    name = "test-half-target"

    def target_law(self, target_probs, draft_probs):
        return 0.5 * target_probs


class ConstantGamma(rules.BranchRule):
    name = "test-constant-gamma"

    def __init__(self, value: float = -0.2) -> None:
        self.value = value

    def params(self):
        return {"value": self.value}

    def raised_mass(self, target_mass, cap=None):
        raised = np.full_like(target_mass, self.value)
        return raised if cap is None else np.minimum(raised, cap)


class DoubleRecovery(rules.DecisionRule):
    name = "test-double-recovery"

    def accept_mask(self, target_probs):
        return target_probs >= target_probs.max(axis=-1, keepdims=True)

    def recovery(self, target_probs):
        return 2.0 * target_probs


def law_functions():
    """Every public law function and the per-token API, called on the page's pair."""
    return {
        "output_law": lambda rule: law.output_law(rule, TARGET, DRAFT),
        "emitted_divergence": lambda rule: law.emitted_divergence(rule, TARGET, DRAFT),
        "output_law_enumerated": lambda rule: law.output_law_enumerated(rule, TARGET, DRAFT),
        "frontier_gap": lambda rule: law.frontier_gap(rule, TARGET, DRAFT),
        "residual": lambda rule: rule.residual(target=TARGET, draft=DRAFT, token=3),
    }


@pytest.mark.parametrize("function", list(law_functions()))
@pytest.mark.parametrize(
    ("rule", "what"),
    [
        (ScaledResidual(0.5), "sums to 0.5"),
        (ScaledResidual(2.0), "sums to 2"),
        (ShiftedResidual(0.3), "negative entry"),
        (ShiftedResidual(np.nan), "NaN or inf"),
        (ShiftedResidual(np.inf), "NaN or inf"),
    ],
    ids=["half", "double", "negative", "nan", "inf"],
)
def test_a_residual_that_is_not_a_law_is_a_value_error_everywhere(rule, what, function):
    with pytest.raises(ValueError, match=rf"^rule '{rule.name}:.*': residuals_for .*{what}"):
        law_functions()[function](rule)


@pytest.mark.parametrize("value", [3.0, -0.5, np.nan])
def test_an_acceptance_outside_the_unit_interval_is_a_value_error_everywhere(value):
    rule = ConstantAcceptance(value)
    calls = {
        **law_functions(),
        "acceptance": lambda rule: law.acceptance(rule, TARGET, DRAFT),
        "accept_prob": lambda rule: rule.accept_prob(target=TARGET, draft=DRAFT, token=1),
    }
    calls.pop("residual")
    for call in calls.values():
        with pytest.raises(ValueError, match=r"^rule 'test-constant-acceptance:.*': accept_probs"):
            call(rule)


@pytest.mark.parametrize(
    ("rule", "method"),
    [
        (HalfTarget(), "target_law"),
        (ConstantGamma(-0.2), "raised_mass"),
        (DoubleRecovery(), "recovery"),
    ],
)
def test_each_familys_own_method_is_checked(rule, method):
    for call in (law.output_law, law.acceptance, law.emitted_divergence):
        if method == "recovery" and call is law.acceptance:
            continue  # a decision rule's acceptance does not read its recovery
        with pytest.raises(ValueError, match=rf"^rule '{rules.spec_of(rule)}': {method} "):
            call(rule, TARGET, DRAFT)


def test_a_gamma_above_one_is_refused_where_it_is_read_uncapped():
    """The laws read min(γ_n, p_n) (a branch with γ_n >= p_n accepts, whatever γ_n), so
    γ = 1.5 is seen, and refused, where γ itself is read: h^n and its divergence."""
    rule = ConstantGamma(1.5)
    for call in (
        lambda: law.branch_divergence(rule, TARGET, DRAFT),
        lambda: rule.adjusted_target(target=TARGET, draft=DRAFT, token=0),
        lambda: law.adjusted_targets(rule, TARGET, DRAFT),
    ):
        with pytest.raises(ValueError, match=r"^rule 'test-constant-gamma:value=1.5': raised_m"):
            call()


def test_the_tolerance_is_stated_and_rounding_passes():
    """|Σ r − 1| <= 1e-9 on float64 passes (and is used as it is); 2e-9 does not."""
    assert contract.LAW_RTOL == 1e-9 and contract.ACCEPT_ATOL == 1e-9
    within = ScaledResidual(1 + 5e-10)
    beyond = ScaledResidual(1 + 2e-9)
    emitted = law.output_law(within, TARGET, DRAFT)
    np.testing.assert_allclose(emitted, TARGET, atol=1e-12)  # normalised by the law
    with pytest.raises(ValueError, match="sums to 1.000000002"):
        law.output_law(beyond, TARGET, DRAFT)
    # an acceptance within 1e-9 of [0, 1] is clipped to it, beyond is refused
    assert law.acceptance(ConstantAcceptance(1 + 5e-10), TARGET, DRAFT) == 1.0
    with pytest.raises(ValueError, match="outside \\[0, 1\\]"):
        law.acceptance(ConstantAcceptance(1 + 2e-9), TARGET, DRAFT)


def test_lower_precision_results_get_their_own_tolerance():
    """A float32 law sums to 1 only within float32 rounding: √ε, stated."""
    row = np.full(11, 1 / 11, dtype=np.float32)  # sums to 1 + 1.2e-7 in float32
    assert abs(float(row.sum()) - 1) > 1e-9
    assert contract.law_tolerance(row.dtype) == pytest.approx(np.finfo(np.float32).eps ** 0.5)
    contract.check_laws(rules.make("sps"), "target_law", row)
    torch = pytest.importorskip("torch")
    tensor = torch.as_tensor(row)
    contract.check_laws(rules.make("sps"), "target_law", tensor)  # torch's float32 too
    with pytest.raises(ValueError, match="sums to 0.5"):
        contract.check_laws(rules.make("sps"), "target_law", tensor / 2)


def test_built_in_rules_pass_on_large_rows():
    """Every registered rule's law on V = 49,152 rows (a draft on 64 tokens, as after
    top-k) passes the contract."""
    generator = np.random.default_rng(1)
    target = generator.dirichlet(np.full(49_152, 0.05), size=2)
    draft = np.zeros_like(target)
    for row in range(2):
        support = generator.choice(49_152, size=64, replace=False)
        draft[row, support] = generator.dirichlet(np.full(64, 0.3))
    for name in rules.names():
        cls = rules.rule_class(name)
        rule = rules.parse(name) if not _required(cls) else None
        if rule is None:
            continue
        emitted = law.output_law(rule, target, draft)
        np.testing.assert_allclose(emitted.sum(axis=-1), 1.0, atol=1e-9)


def _required(cls):
    import inspect

    parameters = inspect.signature(cls.__init__).parameters.values()
    return any(p.default is inspect.Parameter.empty for p in list(parameters)[1:])


def test_the_torch_sampler_refuses_the_same_rules():
    torch = pytest.importorskip("torch")
    from cactus_theory import sampler

    target = torch.as_tensor(np.stack([TARGET, TARGET]))[None]  # [1, 2, V]
    draft = torch.as_tensor(DRAFT)[None, None]  # [1, 1, V]
    ids = torch.tensor([[3]])
    uniforms = (torch.tensor([[0.99]], dtype=torch.float64), torch.tensor([0.5]))
    for rule, method in (
        (ScaledResidual(0.5), "residuals_for"),
        (ConstantAcceptance(3.0), "accept_probs"),
    ):
        with pytest.raises(ValueError, match=rf"^rule '{rule.name}:.*': {method}"):
            sampler.verify(target, draft, ids, rule, uniforms=uniforms)
