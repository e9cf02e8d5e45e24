"""The torch checks of a chain rule: the batched sampler (``cactus_theory.sampler``)
against the numpy reference.

- ``torch-decisions-equal-numpy``: ``sampler.verify`` emits the same tokens as
  ``core.verify.verify_block`` on float64 rows and shared uniforms (a uniform within
  ``NEAR_TIE`` of a_n excused: either decision is right);
- ``torch-law-equals-numpy``: the torch law equals ``law.output_law`` (ATOL) and the
  meter's KL(emitted law || q) equals numpy's (relative 1e-9);
- ``sampler-law-chi-square``: the first token the sampler emits (k = 1), ``SAMPLES`` draws
  on each of ``CHI_SQUARE_PAIRS`` fixed pairs, against the exact law: chi-square at
  family-wise level ``LEVEL``.

Each is skipped, saying why, when torch is not installed; torch is imported only here.
"""

from __future__ import annotations

import math

import numpy as np

from cactus_theory.core import divergences, law
from cactus_theory.core.rules.base import Rule
from cactus_theory.core.verify import inverse_cdf, verify_block
from cactus_theory.testing.search import (
    SKIPPED,
    CheckResult,
    chi_square_check,
    close,
    property_check,
)

#: Significance level of the sampler's chi-square test (over all its pairs, Bonferroni).
LEVEL = 1e-3
#: Draws per pair and pairs of the chi-square test.
SAMPLES = 12_000
CHI_SQUARE_PAIRS = 3
#: A decision whose uniform lies this close to a_n may differ between numpy and torch.
NEAR_TIE = 1e-9


def torch_missing() -> str | None:
    """Why the torch checks cannot run (torch not installed), or None."""
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


def torch_decisions_equal_numpy(rule: Rule, strategies, examples: int, seed: int, device: str):
    """``sampler.verify`` = ``verify_block`` token for token on shared uniforms."""
    name = "torch-decisions-equal-numpy"
    missing = torch_missing()
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

    return property_check(
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


def torch_law_equals_numpy(
    rule: Rule, strategies, examples: int, seed: int, device: str
) -> CheckResult:
    """The torch law and the meter's KL equal the numpy law and its KL."""
    name = "torch-law-equals-numpy"
    missing = torch_missing()
    if missing:
        return CheckResult(name, SKIPPED, missing)
    import torch

    from cactus_theory.sampler import law as torch_law

    def problem(pair):
        target, draft = pair
        expected = law.output_law(rule, target, draft)
        rows = [torch.as_tensor(part, device=device)[None] for part in pair]
        got = torch_law.output_law(rule, *rows)[0].cpu().numpy()
        message = close(got, expected, "the torch law and the numpy law")
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

    drawn = strategies.everyday_pairs()
    return property_check(
        name,
        drawn,
        problem,
        ("target", "draft"),
        f"torch law and meter KL = numpy ({device})",
        examples,
        seed,
    )


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


def sampler_law(rule: Rule, strategies, seed: int, device: str) -> CheckResult:
    """The sampler's first emitted token against the exact law (chi-square)."""
    name = "sampler-law-chi-square"
    missing = torch_missing()
    if missing:
        return CheckResult(name, SKIPPED, missing)
    generator = np.random.default_rng(seed)
    cases = []
    for index in range(CHI_SQUARE_PAIRS):
        size = (4, 8, 12)[index % 3]
        concentration = (0.3, 1.0, 0.1)[index % 3]
        target = generator.dirichlet(np.full(size, concentration))
        draft = generator.dirichlet(np.full(size, concentration))

        def sample(target=target, draft=draft, index=index):
            counts = sampled_first_tokens(rule, target, draft, SAMPLES, seed + index, device)
            return counts, law.output_law(rule, target, draft)

        cases.append(({"target": target, "draft": draft}, sample))
    return chi_square_check(
        name,
        cases,
        LEVEL,
        f"{len(cases)} pairs x {SAMPLES:,} draws, chi-square level {LEVEL:g} ({device})",
    )
