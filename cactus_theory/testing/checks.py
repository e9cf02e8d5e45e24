"""``check_rule``: every property a rule must have, searched by hypothesis, with shrunk
counterexamples.

Each check is a property of the rule searched over drawn inputs with ``hypothesis.find``
(``examples`` draws, seeded, shrunk on failure), or a statistical test at a stated level.
Which checks run follows what the rule declares (``rules.base``): a property the rule does
not declare is skipped, and says so.

============================  =============================================================
check                         what must hold (q = target, p = draft, n = drafted token)
============================  =============================================================
law-is-a-distribution         ``law.output_law`` is finite, >= 0 and sums to 1
acceptance-in-unit-interval   0 <= a_n <= 1 for every n, and a_n = 0 where p_n = 0
residuals-are-laws            every r^n a rejection can reach is finite, >= 0, mass > 0
fast-law-equals-enumerated    the closed form (or batched sum) equals the per-token sum
                              Σ_n p_n [a_n e_n + (1 − a_n) r^n], small and large V
support-only                  (declared) zeros inserted where p = q = 0 change no law
gamma-from-mass               (declared, branch rules) γ of a whole row = γ of each q_n
lossless-at                   (declared) at those parameters the emitted law is q
greedy-consistent             (declared) with a one-hot q the emitted law is q
tunable-monotone              (declared) mean acceptance is monotone in the parameter
max-kl / max-tv               (asked) KL / TV of the emitted law within the budget
torch-decisions-equal-numpy   ``sampler.verify`` = ``core.verify.verify_block`` token for
                              token on float64 rows and shared uniforms (near-ties within
                              1e-9 of a_n excused)
torch-law-equals-numpy        the torch law and the meter's KL equal numpy's (1e-9)
sampler-law-chi-square        the sampler's emitted token, 12,000 draws per pair on 3
                              pairs, against the exact law: chi-square, level 1e-3 in all
============================  =============================================================

The torch checks run when torch is installed (else they are skipped, saying why), on
``device``. Tolerances are absolute on probabilities (1e-9) and relative on divergences.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cactus_theory.core import divergences, law, rules
from cactus_theory.core.rules.base import Rule, exact_family
from cactus_theory.core.verify import inverse_cdf, verify_block

#: Absolute tolerance on probabilities (laws, acceptances).
ATOL = 1e-9
#: Significance level of the sampler's chi-square test (over all its pairs, Bonferroni).
LEVEL = 1e-3
#: One draw in this many of ``examples`` goes to vocabularies up to 10^5.
LARGE_FRACTION = 12
#: Draws per pair and pairs of the chi-square test.
SAMPLES = 12_000
CHI_SQUARE_PAIRS = 3
#: A decision whose uniform lies this close to a_n may differ between numpy and torch.
NEAR_TIE = 1e-9

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass
class CheckResult:
    """One check of one rule: its status, what it checked (or why it failed or was
    skipped), the shrunk counterexample of a failure (plain lists, so it can be pasted),
    and its time."""

    name: str
    status: str
    detail: str = ""
    counterexample: dict[str, Any] | None = None
    seconds: float = 0.0


@dataclass
class RuleReport:
    """What ``check_rule`` found: ``passed`` (no check failed), ``failures``, every result,
    and a readable table (``str(report)``)."""

    rule: Rule
    results: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[CheckResult]:
        return [result for result in self.results if result.status == FAILED]

    def assert_passed(self) -> None:
        """Raise AssertionError with the report when a check failed (for pytest)."""
        if not self.passed:
            raise AssertionError(str(self))

    def __str__(self) -> str:
        width = max(len(result.name) for result in self.results) if self.results else 10
        verdict = "passed" if self.passed else "FAILED"
        total = sum(result.seconds for result in self.results)
        lines = [f"check_rule({rules.spec_of(self.rule)}): {verdict} ({total:.1f} s)"]
        for result in self.results:
            lines.append(
                f"  {result.name:<{width}}  {result.status:<7} {result.seconds:5.1f} s  "
                f"{result.detail}"
            )
            if result.counterexample is not None:
                for key, value in result.counterexample.items():
                    lines.append(f"  {'':<{width}}    {key} = {value}")
        return "\n".join(lines)


# --- what every check shares --------------------------------------------------------------


def _hypothesis():
    try:
        import hypothesis
    except ImportError as error:  # pragma: no cover - exercised only without hypothesis
        raise ImportError(
            'cactus_theory.testing needs hypothesis: pip install "cactus-theory[testing]"'
        ) from error
    return hypothesis


def _plain(value: Any) -> Any:
    """A counterexample part as plain Python (lists of floats with full precision)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _search(
    strategy, problem: Callable[[Any], str | None], examples: int, seed: int
) -> tuple[str, Any] | None:
    """(message, shrunk example) of a drawn example where ``problem`` says what is wrong,
    or None when ``examples`` draws find none. An exception inside the rule is a problem."""
    hypothesis = _hypothesis()

    def guarded(example: Any) -> str | None:
        try:
            return problem(example)
        except Exception as error:  # the rule raised: report it, do not crash the report
            return f"raised {type(error).__name__}: {error}"

    settings = hypothesis.settings(
        max_examples=examples,
        database=None,
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
        phases=[hypothesis.Phase.generate, hypothesis.Phase.shrink],
    )
    try:
        found = hypothesis.find(
            strategy,
            lambda example: guarded(example) is not None,
            settings=settings,
            random=random.Random(seed),
        )
    except hypothesis.errors.NoSuchExample:
        return None
    return guarded(found), found


def _property(
    name: str,
    strategy,
    problem: Callable[[Any], str | None],
    keys: tuple[str, ...],
    detail: str,
    examples: int,
    seed: int,
) -> CheckResult:
    found = _search(strategy, problem, examples, seed)
    if found is None:
        return CheckResult(name, PASSED, f"{detail} ({examples} draws)")
    message, example = found
    parts = example if isinstance(example, tuple) else (example,)
    return CheckResult(name, FAILED, message, dict(zip(keys, map(_plain, parts), strict=False)))


def _close(actual: np.ndarray, expected: np.ndarray, what: str) -> str | None:
    gap = float(np.max(np.abs(np.asarray(actual) - np.asarray(expected)), initial=0.0))
    if not math.isfinite(gap) or gap > ATOL:
        return f"{what} differ by {gap:.3g} (tolerance {ATOL:g})"
    return None


def _everyday_pairs(strategies):
    """Pairs of every kind (V up to 32) and pairs after the processors (V up to 64)."""
    return strategies.st.one_of(strategies.pairs(1, 32), strategies.processed_pairs(2, 64))


def _law(rule: Rule, target: np.ndarray, draft: np.ndarray) -> np.ndarray:
    return law.output_law(rule, target, draft)


# --- the numpy checks ---------------------------------------------------------------------


def _law_is_a_distribution(rule: Rule, strategies, examples: int, seed: int) -> CheckResult:
    def problem(pair):
        emitted = _law(rule, *pair)
        if not np.all(np.isfinite(emitted)):
            return "the law has NaN or inf entries"
        if emitted.min() < -ATOL:
            return f"the law has a negative entry {emitted.min():.3g}"
        if abs(emitted.sum() - 1.0) > ATOL:
            return f"the law sums to {emitted.sum():.12g}"
        return None

    drawn = _everyday_pairs(strategies)
    return _property(
        "law-is-a-distribution",
        drawn,
        problem,
        ("target", "draft"),
        "finite, >= 0, sums to 1",
        examples,
        seed,
    )


def _acceptance_in_unit_interval(rule: Rule, strategies, examples: int, seed: int):
    def problem(pair):
        target, draft = pair
        accept = np.asarray(rule.accept_probs(target, draft), dtype=np.float64)
        if accept.shape != target.shape:
            return f"accept_probs has shape {accept.shape}, expected {target.shape}"
        if not np.all(np.isfinite(accept)):
            return "accept_probs has NaN or inf"
        if accept.min() < -ATOL or accept.max() > 1 + ATOL:
            return f"accept_probs outside [0, 1]: [{accept.min():.6g}, {accept.max():.6g}]"
        if np.any(accept[draft == 0] > 0):
            return "a token with p = 0 has a positive acceptance"
        return None

    return _property(
        "acceptance-in-unit-interval",
        strategies.pairs(1, 32),
        problem,
        ("target", "draft"),
        "0 <= a_n <= 1, a_n = 0 where p_n = 0",
        examples,
        seed,
    )


def _residuals_are_laws(rule: Rule, strategies, examples: int, seed: int):
    def problem(pair):
        target, draft = pair
        accept = rule.accept_probs(target, draft)
        for token in np.flatnonzero((draft > 0) & (accept < 1)):
            residual = rule.residual(target=target, draft=draft, token=int(token))
            if residual.shape != target.shape or not np.all(np.isfinite(residual)):
                return f"residual of token {token} has bad shape or NaN/inf"
            if residual.min() < -ATOL or residual.sum() <= 0:
                return f"residual of token {token} is not a law (min {residual.min():.3g})"
        return None

    return _property(
        "residuals-are-laws",
        strategies.pairs(1, 24),
        problem,
        ("target", "draft"),
        "r^n finite, >= 0, positive mass where rejection can happen",
        examples,
        seed,
    )


def _fast_law_equals_enumerated(rule: Rule, strategies, examples: int, seed: int):
    def problem(pair):
        return _close(
            _law(rule, *pair),
            law.output_law_enumerated(rule, *pair),
            f"the {exact_family(rule)} law and the enumerated law",
        )

    family = exact_family(rule)
    small = strategies.st.one_of(strategies.pairs(1, 24), strategies.processed_pairs(2, 48))
    result = _property(
        "fast-law-equals-enumerated",
        small,
        problem,
        ("target", "draft"),
        f"{family} law = Σ_n p_n [a_n e_n + (1 − a_n) r^n]",
        examples,
        seed,
    )
    if result.status == FAILED:
        return result
    # Large vocabularies (up to 10^5) with a draft on 16 tokens: the enumeration is 16
    # residuals of size V, so a few draws suffice.
    draws = max(2, examples // LARGE_FRACTION)
    large = _property(
        "fast-law-equals-enumerated",
        strategies.large_pairs(draft_support=16),
        problem,
        ("target", "draft"),
        "",
        draws,
        seed,
    )
    if large.status == FAILED:
        return large
    result.detail = (
        f"{family} law = Σ_n p_n [a_n e_n + (1 − a_n) r^n] "
        f"({examples} draws V <= 64, {draws} draws V <= 10^5)"
    )
    return result


def _support_only(rule: Rule, strategies, examples: int, seed: int) -> CheckResult:
    name = "support-only"
    if not getattr(rule, "support_only", False):
        return CheckResult(name, SKIPPED, "not declared: rows are never packed to their support")
    st = strategies.st

    @st.composite
    def padded(draw):
        target, draft = draw(strategies.pairs(1, 24))
        extra = draw(st.integers(1, 40))
        places = draw(st.lists(st.integers(0, target.size), min_size=extra, max_size=extra))
        return target, draft, sorted(places)

    def problem(example):
        target, draft, places = example
        wide_target = np.insert(target, places, 0.0)
        wide_draft = np.insert(draft, places, 0.0)
        kept = np.ones(wide_target.size, dtype=bool)
        kept[np.array(places) + np.arange(len(places))] = False
        wide = _law(rule, wide_target, wide_draft)
        if np.any(wide[~kept] > ATOL):
            return "the padded law puts mass on a token with p = q = 0"
        return _close(wide[kept], _law(rule, target, draft), "laws with and without padding")

    return _property(
        name,
        padded(),
        problem,
        ("target", "draft", "zeros_inserted_at"),
        "zeros where p = q = 0 change no law",
        examples,
        seed,
    )


def _gamma_from_mass(rule: Rule, strategies, examples: int, seed: int) -> CheckResult:
    name = "gamma-from-mass"
    if exact_family(rule) != "branch" or not getattr(rule, "gamma_from_mass", False):
        return CheckResult(name, SKIPPED, "not declared (or not a branch rule)")

    def problem(pair):
        target, draft = pair
        whole = rule.raised_masses(target, draft)
        each = np.array([rule.raised_mass(np.array([mass]))[0] for mass in target])
        return _close(whole, each, "γ of the whole row and γ of each q_n")

    return _property(
        name,
        strategies.pairs(1, 24),
        problem,
        ("target", "draft"),
        "γ_n depends on q_n alone",
        examples,
        seed,
    )


def _lossless_at(rule: Rule, strategies, examples: int, seed: int) -> CheckResult:
    name = "lossless-at"
    lossless = getattr(rule, "lossless_at", None)
    if lossless is None:
        return CheckResult(name, SKIPPED, "not declared: no parameters make this rule lossless")
    lossless_rule = rule.with_params(**lossless) if lossless else rule

    def problem(pair):
        target, _ = pair
        return _close(_law(lossless_rule, *pair), target, "the emitted law and q")

    return _property(
        name,
        strategies.pairs(1, 32),
        problem,
        ("target", "draft"),
        f"{rules.spec_of(lossless_rule)} emits q exactly",
        examples,
        seed,
    )


def _greedy_consistent(rule: Rule, strategies, examples: int, seed: int) -> CheckResult:
    name = "greedy-consistent"
    if not getattr(rule, "greedy_consistent", False):
        return CheckResult(name, SKIPPED, "not declared: at temperature 0 it may emit a non-argmax")
    st = strategies.st

    @st.composite
    def one_hot_targets(draw):
        size = draw(st.integers(1, 32))
        target = np.eye(size)[draw(st.integers(0, size - 1))]
        return target, draw(strategies.rows(size))

    def problem(pair):
        return _close(_law(rule, *pair), pair[0], "the emitted law and the one-hot q")

    return _property(
        name,
        one_hot_targets(),
        problem,
        ("target", "draft"),
        "one-hot q (temperature 0): emits argmax q whatever the draft",
        examples,
        seed,
    )


def _tunable_values(tunable) -> list[float]:
    if tunable.log:
        low = max(tunable.low, 0.0)
        grid = [low] + [value for value in (1e-4, 1e-3, 1e-2, 0.1, 0.5, 1.0, 4.0, 30.0)]
        return [value for value in grid if tunable.low <= value <= tunable.high]
    return list(np.linspace(tunable.low, tunable.high, 7))


def _tunable_monotone(rule: Rule, strategies, examples: int, seed: int) -> CheckResult:
    name = "tunable-monotone"
    tunable = getattr(rule, "tunable", None)
    if tunable is None:
        return CheckResult(name, SKIPPED, "not declared: no tunable parameter")
    kind = type(rule.params().get(tunable.parameter, 0.0))
    values = _tunable_values(tunable)
    st = strategies.st

    def problem(pool):
        target = np.stack([pair[0] for pair in pool])
        draft = np.stack([pair[1] for pair in pool])
        means = []
        for value in values:
            changed = rule.with_params(**{tunable.parameter: kind(value)})
            means.append(float(law.acceptance_rows(changed, target, draft).mean()))
        steps = np.diff(means) * (1.0 if tunable.increasing else -1.0)
        if np.any(steps < -ATOL):
            where = int(np.argmin(steps))
            return (
                f"mean acceptance moves the wrong way between {tunable.parameter}="
                f"{values[where]:g} ({means[where]:.9g}) and {values[where + 1]:g} "
                f"({means[where + 1]:.9g})"
            )
        return None

    @st.composite
    def pools(draw):
        size = draw(st.integers(1, 16))
        return [(draw(strategies.rows(size)), draw(strategies.rows(size))) for _ in range(4)]

    direction = "non-decreasing" if tunable.increasing else "non-increasing"
    return _property(
        name,
        pools(),
        problem,
        ("pool",),
        f"mean acceptance {direction} in {tunable.parameter} over {len(values)} values",
        max(4, examples // 4),
        seed,
    )


def _budget(rule, strategies, examples, seed, divergence: str, bound: float) -> CheckResult:
    name = f"max-{divergence}"

    def problem(pair):
        target, draft = pair
        emitted = _law(rule, target, draft)
        value = float(divergences.rows(divergence, emitted / emitted.sum(), target))
        if not value <= bound * (1 + 1e-9) + 1e-15:
            return f"{divergence.upper()}(emitted law, q) = {value:.9g} > {bound:g}"
        return None

    drawn = _everyday_pairs(strategies)
    return _property(
        name,
        drawn,
        problem,
        ("target", "draft"),
        f"{divergence.upper()}(emitted law, q) <= {bound:g}",
        examples,
        seed,
    )


# --- the torch checks ---------------------------------------------------------------------


def _torch_missing() -> str | None:
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch is not installed"
    return None


def _blocks(strategies):
    """(target [B, k+1, V], draft [B, k, V], ids [B, k], accept_u [B, k], sample_u [B])."""
    st = strategies.st

    @st.composite
    def block(draw):
        size = draw(st.integers(1, 24))
        batch, steps = draw(st.integers(1, 4)), draw(st.integers(1, 3))
        target = np.stack(
            [
                np.stack([draw(strategies.rows(size)) for _ in range(steps + 1)])
                for _ in range(batch)
            ]
        )
        draft = np.stack(
            [np.stack([draw(strategies.rows(size)) for _ in range(steps)]) for _ in range(batch)]
        )
        generator = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        ids = inverse_cdf(draft, generator.random((batch, steps)))
        return target, draft, ids, generator.random((batch, steps)), generator.random(batch)

    return block()


def _torch_decisions(rule: Rule, strategies, examples: int, seed: int, device: str):
    name = "torch-decisions-equal-numpy"
    missing = _torch_missing()
    if missing:
        return CheckResult(name, SKIPPED, missing)
    import torch

    from cactus_theory import sampler

    def problem(block):
        target, draft, ids, accept_u, sample_u = block
        expected, _ = verify_block(rule, target, draft, ids, accept_u, sample_u)
        tensors = [torch.as_tensor(part, device=device) for part in block]
        tokens, _ = sampler.verify(
            tensors[0], tensors[1], tensors[2], rule, uniforms=(tensors[3], tensors[4])
        )
        got = tokens.cpu().numpy()
        if np.array_equal(got, expected):
            return None
        accept = rule.accept_probs(target[:, :-1], draft)
        drafted = np.take_along_axis(accept, ids[..., None], axis=-1)[..., 0]
        if np.min(np.abs(drafted - accept_u)) < NEAR_TIE:
            return None  # a uniform within rounding of a_n: either decision is right
        return f"torch emitted {got.tolist()}, numpy {expected.tolist()}"

    return _property(
        name,
        _blocks(strategies),
        problem,
        ("target", "draft", "draft_ids", "accept_uniforms", "sample_uniforms"),
        f"same tokens from the same uniforms ({type(_adapter(rule)).__name__}, {device})",
        examples,
        seed,
    )


def _adapter(rule: Rule):
    from cactus_theory.sampler.rules import for_rule

    return for_rule(rule)


def _torch_law(rule: Rule, strategies, examples: int, seed: int, device: str) -> CheckResult:
    name = "torch-law-equals-numpy"
    missing = _torch_missing()
    if missing:
        return CheckResult(name, SKIPPED, missing)
    import torch

    from cactus_theory.sampler import law as torch_law

    def problem(pair):
        target, draft = pair
        expected = _law(rule, target, draft)
        rows = [torch.as_tensor(part, device=device)[None] for part in pair]
        got = torch_law.output_law(rule, *rows)[0].cpu().numpy()
        message = _close(got, expected, "the torch law and the numpy law")
        if message:
            return message
        kl, _ = torch_law.emitted_divergence(rule, *rows)
        wanted = float(divergences.kl(expected / expected.sum(), target))
        metered = float(kl[0])
        if not (
            (math.isinf(wanted) and math.isinf(metered))
            or abs(metered - wanted) <= 1e-9 * max(1.0, abs(wanted))
        ):
            return f"the meter's KL {metered:.12g} differs from numpy's {wanted:.12g}"
        return None

    drawn = _everyday_pairs(strategies)
    return _property(
        name,
        drawn,
        problem,
        ("target", "draft"),
        f"torch law and meter KL = numpy ({device})",
        examples,
        seed,
    )


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Pearson's chi-square p-value of ``counts`` against ``probs`` (bins expecting fewer
    than ``min_expected`` pooled; a count where the law is 0 gives 0)."""
    from scipy import stats

    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    if np.any(counts[probs <= 0] > 0):
        return 0.0
    expected = probs * counts.sum()
    big = expected >= min_expected
    observed, wanted = list(counts[big]), list(expected[big])
    if (~big).any() and expected[~big].sum() > 0:
        observed.append(counts[~big].sum())
        wanted.append(expected[~big].sum())
    if len(observed) < 2:
        return 1.0
    wanted_array = np.asarray(wanted) * (np.sum(observed) / np.sum(wanted))
    return float(stats.chisquare(observed, wanted_array).pvalue)


def sampled_first_tokens(rule: Rule, target, draft, samples: int, seed: int, device: str):
    """Counts [V] of the token the torch sampler emits first (the accepted draft or the
    residual's token) over ``samples`` draws of n ~ draft, k = 1."""
    import torch

    from cactus_theory import sampler

    vocab = target.shape[-1]
    generator = torch.Generator().manual_seed(seed)
    target_rows = torch.as_tensor(np.stack([target, target]), device=device)
    draft_rows = torch.as_tensor(draft, device=device)[None]
    target_block = target_rows[None].expand(samples, 2, vocab)
    draft_block = draft_rows[None].expand(samples, 1, vocab)
    ids = torch.multinomial(
        torch.as_tensor(draft).expand(samples, vocab), 1, True, generator=generator
    )
    tokens, _ = sampler.verify(target_block, draft_block, ids.to(device), rule, generator=generator)
    return np.bincount(tokens[:, 0].cpu().numpy(), minlength=vocab)


def _sampler_law(rule: Rule, strategies, seed: int, device: str) -> CheckResult:
    name = "sampler-law-chi-square"
    missing = _torch_missing()
    if missing:
        return CheckResult(name, SKIPPED, missing)
    generator = np.random.default_rng(seed)
    pairs = []
    for index in range(CHI_SQUARE_PAIRS):
        size = (4, 8, 12)[index % 3]
        concentration = (0.3, 1.0, 0.1)[index % 3]
        pairs.append(
            (
                generator.dirichlet(np.full(size, concentration)),
                generator.dirichlet(np.full(size, concentration)),
            )
        )
    level = LEVEL / len(pairs)
    for index, (target, draft) in enumerate(pairs):
        expected = _law(rule, target, draft)
        counts = sampled_first_tokens(rule, target, draft, SAMPLES, seed + index, device)
        pvalue = chi_square_pvalue(counts, expected)
        if pvalue < level:
            return CheckResult(
                name,
                FAILED,
                f"sampled tokens do not follow the exact law (p = {pvalue:.3g} < {level:.3g})",
                {"target": target.tolist(), "draft": draft.tolist(), "counts": counts.tolist()},
            )
    return CheckResult(
        name,
        PASSED,
        f"{len(pairs)} pairs x {SAMPLES:,} draws, chi-square level {LEVEL:g} ({device})",
    )


# --- the entry point ----------------------------------------------------------------------

#: Every check, in the order ``check_rule`` runs them.
CHECKS = (
    "law-is-a-distribution",
    "acceptance-in-unit-interval",
    "residuals-are-laws",
    "fast-law-equals-enumerated",
    "support-only",
    "gamma-from-mass",
    "lossless-at",
    "greedy-consistent",
    "tunable-monotone",
    "max-kl",
    "max-tv",
    "torch-decisions-equal-numpy",
    "torch-law-equals-numpy",
    "sampler-law-chi-square",
)


def _one(name: str, rule: Rule, strategies, options: dict[str, Any]) -> CheckResult:
    examples, seed, device = options["examples"], options["seed"], options["device"]
    numpy_checks = {
        "law-is-a-distribution": _law_is_a_distribution,
        "acceptance-in-unit-interval": _acceptance_in_unit_interval,
        "residuals-are-laws": _residuals_are_laws,
        "fast-law-equals-enumerated": _fast_law_equals_enumerated,
        "support-only": _support_only,
        "gamma-from-mass": _gamma_from_mass,
        "lossless-at": _lossless_at,
        "greedy-consistent": _greedy_consistent,
        "tunable-monotone": _tunable_monotone,
    }
    if name in numpy_checks:
        return numpy_checks[name](rule, strategies, examples, seed)
    if name in ("max-kl", "max-tv"):
        bound = options["max_kl" if name == "max-kl" else "max_tv"]
        if bound is None:
            return CheckResult(name, SKIPPED, "no budget asked for")
        return _budget(rule, strategies, examples, seed, name[4:], bound)
    if name == "torch-decisions-equal-numpy":
        return _torch_decisions(rule, strategies, examples, seed, device)
    if name == "torch-law-equals-numpy":
        return _torch_law(rule, strategies, examples, seed, device)
    return _sampler_law(rule, strategies, seed, device)


def _checked_options(
    rule: object,
    max_kl: float | None,
    max_tv: float | None,
    examples: int,
    seed: int,
    device: str,
    only: Iterable[str] | None,
) -> tuple[Rule, list[str]]:
    if isinstance(rule, str):
        rule = rules.parse(rule)
    if not isinstance(rule, Rule):
        raise ValueError(f"rule: expected a rules.Rule or a spec string, got {type(rule).__name__}")
    for key, bound in (("max_kl", max_kl), ("max_tv", max_tv)):
        if bound is not None and (
            isinstance(bound, bool) or not isinstance(bound, int | float) or not bound >= 0
        ):
            raise ValueError(f"{key}: must be a number >= 0, got {bound!r}")
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
        raise ValueError(f"examples: must be an integer >= 1, got {examples!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: must be an integer, got {seed!r}")
    if not isinstance(device, str) or device.split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device: expected 'cpu' or 'cuda[:N]', got {device!r}")
    chosen = list(CHECKS if only is None else only)
    unknown = [name for name in chosen if name not in CHECKS]
    if unknown:
        raise ValueError(f"only: unknown check {unknown[0]!r}; choose from {CHECKS}")
    return rule, chosen


def check_rule(
    rule: Rule | str,
    *,
    max_kl: float | None = None,
    max_tv: float | None = None,
    examples: int = 60,
    seed: int = 0,
    device: str = "cpu",
    only: Iterable[str] | None = None,
) -> RuleReport:
    """Check every property of ``rule`` (a ``rules.Rule`` or a spec; module docstring).

    ``max_kl`` / ``max_tv``: budgets the emitted law must keep (nats / total variation),
    checked when given. ``examples``: hypothesis draws per property. ``seed``: fixes every
    draw. ``device``: where the torch checks run. ``only``: a subset of ``CHECKS``.
    Returns a ``RuleReport``; a failing property is a failed result with its shrunk
    counterexample, never an exception. Bad arguments are a ValueError naming them.
    """
    rule, chosen = _checked_options(rule, max_kl, max_tv, examples, seed, device, only)
    from cactus_theory.testing import strategies

    options = {"max_kl": max_kl, "max_tv": max_tv, "examples": examples, "seed": seed}
    options["device"] = device
    report = RuleReport(rule)
    for name in chosen:
        started = time.perf_counter()
        result = _one(name, rule, strategies, options)
        result.seconds = time.perf_counter() - started
        report.results.append(result)
    return report
