"""Exact-decision properties: every accept/reject decision and every emitted token of the
engine, for injected randomness, against the claimed rule's decisions (``reference``).

Each property searches drawn blocks (``cases``) with the kit's hypothesis search
(``search.search``: seeded, shrunk on failure); a block passes when every row's tokens and
accepted count equal the reference's, except rows whose randomness lies within the
near-tie window of the engine's precision (``reference.tolerance``), which are counted as
excused. A failure's counterexample is the shrunk block as plain lists, the engine's
output and the rule's.

============================  =============================================================
property                      blocks (B <= 4 rows, k <= 3 drafts, V <= 24)
============================  =============================================================
exact-decisions               rows of every kind, disjoint supports, ids drawn from p
exact-zero-draft              a drafted token with p_n = 0 (must be rejected; the residual
                              (q − p)_+ may then be all zero: the rule emits from q)
exact-zero-target             a drafted token with q_n = 0 < p_n and accept uniforms 0 or
                              1e-300: never accepted (SGLang #35771's coin boundary); half
                              with p = q but for 1e-12 there (an excess below float32)
exact-ties                    rows with tied probabilities
exact-one-hot                 one-hot and near-one-hot rows
exact-truncated               rows after temperature, top-k and top-p (exact zeros)
exact-ragged                  num_drafts per row in [0, k] (declared ``ragged``)
exact-float16/-bfloat16       dyadic rows given in float16 / bfloat16
exact-logits                  target logits with per-row temperature (0 included), top-k,
                              top-p through the engine's own metadata (``logits``)
seeded-batch-invariance       a row with its own generator emits the same tokens alone and
                              in any batch of seeded and unseeded rows (vllm #51226)
============================  =============================================================
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from cactus_theory.core import rules
from cactus_theory.core.rules.base import Rule
from cactus_theory.testing.conformance import cases
from cactus_theory.testing.conformance.adapter import DTYPES, Adapter, LayoutLog, call
from cactus_theory.testing.conformance.reference import Decisions, decide, tolerance
from cactus_theory.testing.conformance.report import NOT_APPLICABLE, PropertyResult
from cactus_theory.testing.search import FAILED, PASSED, plain, search

#: Block strategy keywords of each probability-path property.
BLOCKS: dict[str, dict[str, Any]] = {
    "exact-decisions": {"kind": "any"},
    "exact-zero-draft": {"kind": "any", "ids": "zero-draft"},
    "exact-zero-target": {"kind": "any", "ids": "zero-target"},
    "exact-ties": {"kind": "ties"},
    "exact-one-hot": {"kind": "one-hot"},
    "exact-truncated": {"kind": "truncated"},
    "exact-ragged": {"kind": "any", "ragged": True},
    "exact-float16": {"kind": "dyadic", "dtype": "float16"},
    "exact-bfloat16": {"kind": "dyadic", "dtype": "bfloat16"},
}
EXACT_PROPERTIES = (*BLOCKS, "exact-logits", "seeded-batch-invariance")


def _applicable(name: str, adapter: Adapter) -> str | None:
    """Why ``name`` does not apply to ``adapter``, or None."""
    if name == "seeded-batch-invariance":
        return None if adapter.row_generators else "the engine takes no per-row generators"
    if name == "exact-logits":
        if adapter.logits is None:
            return "the engine takes probabilities, not logits with sampling metadata"
        if not adapter.logits_injects:
            return "the engine's logits path takes no injected randomness"
        return None
    if not adapter.injects:
        return "the engine takes no injected randomness (its law tests still run)"
    if name == "exact-ragged" and not adapter.ragged:
        return "the engine verifies k drafts in every row"
    dtype = BLOCKS[name].get("dtype")
    if dtype is not None and dtype not in adapter.dtypes:
        return f"the engine takes no {dtype} inputs"
    return None


def run_block(
    adapter: Adapter, block: cases.Block, log: LayoutLog, where: str, generator: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """The engine's (token_ids, num_accepted) for ``block`` with its injected uniforms."""
    generator = torch.Generator().manual_seed(0) if generator is None else generator
    dtype = DTYPES[block.dtype]
    draft = torch.as_tensor(block.draft).to(dtype)
    ids = torch.as_tensor(block.ids, dtype=torch.int64)
    if block.logits is not None:
        logits = torch.as_tensor(block.logits, dtype=torch.float32)
        return call(
            adapter.logits, log, where, logits, draft, ids, block.settings, generator,
            uniforms=block.uniforms,
        )  # fmt: skip
    target = torch.as_tensor(block.target).to(dtype)
    return call(
        adapter.verify, log, where, target, draft, ids, generator,
        uniforms=block.uniforms, num_drafts=block.num_drafts,
    )  # fmt: skip


def expected_decisions(adapter: Adapter, rule: Rule, block: cases.Block) -> Decisions:
    """The claimed rule's decisions for ``block`` (temperature-0 rows of a logits block by
    ``adapter.greedy_rule`` when the adapter declares one)."""
    floor = tolerance(adapter.compute_dtype(block.dtype))
    expected = decide(
        rule, block.target, block.draft, block.ids, block.uniforms, adapter.recovery,
        block.num_drafts, floor,
    )  # fmt: skip
    if block.settings is None or adapter.greedy_rule is None:
        return expected
    greedy = np.array([settings.temperature == 0 for settings in block.settings])
    if greedy.any():
        other = decide(
            rules.parse(adapter.greedy_rule), block.target, block.draft, block.ids,
            block.uniforms, adapter.recovery, block.num_drafts, floor,
        )  # fmt: skip
        fields = ("token_ids", "num_accepted", "margin", "emit_law", "accept_probs", "dust")
        for field in (*fields, "allowed"):
            getattr(expected, field)[greedy] = getattr(other, field)[greedy]
    return expected


def search_tolerating_flakiness(strategy, problem, examples: int, seed: int):
    """The kit's ``search``; when the engine is not reproducible (the same block fails,
    then passes: hypothesis's Flaky error while shrinking, e.g. uninitialised memory), the
    first failing block of an unshrunk search, its message saying so."""
    try:
        return search(strategy, problem, examples, seed)
    except Exception as error:
        if "Flaky" not in type(error).__name__:
            raise
    import random

    from cactus_theory.testing.search import hypothesis_module, raised

    hypothesis = hypothesis_module()
    seen: list[tuple[str, Any]] = []

    def record(example: Any) -> bool:
        try:
            message = problem(example)
        except Exception as error:  # the engine raised
            message = raised(error)
        if message is not None and not seen:
            seen.append((message, example))
        return message is not None

    settings = hypothesis.settings(
        max_examples=examples,
        database=None,
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
        phases=[hypothesis.Phase.generate],
    )
    try:
        hypothesis.find(strategy, record, settings=settings, random=random.Random(seed))
    except Exception:  # NoSuchExample or Flaky again: what was recorded is the answer
        pass
    if not seen:
        return None
    message, example = seen[0]
    note = "not reproducible: the same block gives other outputs on other runs"
    return f"{message} ({note})", example


def _dust_tie(tokens: np.ndarray, accepted: np.ndarray, expected: Decisions) -> np.ndarray:
    """[B] bool: rows rejected with a residual at the rounding floor (``Decisions.dust``)
    whose decisions up to the emitted token agree and whose emitted token lies in h's or the
    residual's support (``reference`` module docstring)."""
    if tokens.shape != expected.token_ids.shape or not expected.dust.any():
        return np.zeros(accepted.shape, dtype=bool)
    rows = np.arange(tokens.shape[0])
    before = np.arange(tokens.shape[1])[None, :] < expected.num_accepted[:, None]
    agree = (accepted == expected.num_accepted) & np.all(
        np.where(before, tokens == expected.token_ids, True), axis=-1
    )
    emitted = tokens[rows, np.clip(accepted, 0, tokens.shape[1] - 1)]
    inside = (emitted >= 0) & (emitted < expected.allowed.shape[-1])
    allowed = inside & expected.allowed[rows, np.clip(emitted, 0, expected.allowed.shape[-1] - 1)]
    return expected.dust & agree & allowed


class Tally:
    """Rows compared and rows excused as near-ties over a property's draws."""

    def __init__(self) -> None:
        self.rows = 0
        self.excused = 0


def _compare(
    adapter: Adapter, rule: Rule, block: cases.Block, log: LayoutLog, name: str, tally: Tally
) -> str | None:
    tokens, accepted = run_block(adapter, block, log, name)
    expected = expected_decisions(adapter, rule, block)
    window = tolerance(adapter.compute_dtype(block.dtype))
    differs = (tokens.shape != expected.token_ids.shape) or np.any(
        tokens != expected.token_ids, axis=-1
    )
    differs = np.asarray(differs) | (accepted != expected.num_accepted)
    near = (expected.margin <= window) | _dust_tie(tokens, accepted, expected)
    tally.rows += int(accepted.shape[0])
    tally.excused += int((differs & near).sum())
    wrong = np.flatnonzero(differs & ~near)
    if wrong.size == 0:
        return None
    row = int(wrong[0])
    return (
        f"row {row}: the engine emitted {tokens[row].tolist()} ({int(accepted[row])} accepted), "
        f"the rule emits {expected.token_ids[row].tolist()} "
        f"({int(expected.num_accepted[row])} accepted; a_n of the drafts "
        f"{np.round(expected.accept_probs[row], 9).tolist()}, margin "
        f"{expected.margin[row]:.3g})"
    )


def _result(
    name: str,
    found: tuple[str, Any] | None,
    tally: Tally,
    examples: int,
    detail: str,
    extra: Callable[[Any], dict] | None = None,
) -> PropertyResult:
    if found is None:
        return PropertyResult(
            name,
            PASSED,
            f"{detail}: {tally.rows} rows over {examples} draws, {tally.excused} near-ties excused",
            decisions=tally.rows,
            excused=tally.excused,
        )
    message, block = found
    example = block.plain() if isinstance(block, cases.Block) else {"example": plain(block)}
    if extra is not None:
        example.update(extra(block))
    return PropertyResult(
        name, FAILED, message, example, decisions=tally.rows, excused=tally.excused
    )


def exact_property(
    name: str, adapter: Adapter, rule: Rule, examples: int, seed: int, log: LayoutLog
) -> PropertyResult:
    """One exact-decision property (module docstring) of ``adapter`` against ``rule``."""
    reason = _applicable(name, adapter)
    if reason is not None:
        return PropertyResult(name, NOT_APPLICABLE, reason)
    if name == "seeded-batch-invariance":
        return seeded_batch_invariance(adapter, examples, seed, log)
    tally = Tally()
    strategy = (
        cases.logits_block_strategy()
        if name == "exact-logits"
        else cases.block_strategy(**BLOCKS[name])
    )
    found = search_tolerating_flakiness(
        strategy, lambda block: _compare(adapter, rule, block, log, name, tally), examples, seed
    )

    def outputs(block: cases.Block) -> dict:
        try:
            tokens, accepted = run_block(adapter, block, LayoutLog(), name)
        except Exception as error:  # the engine raised: the message says so already
            return {"engine_raised": f"{type(error).__name__}: {error}"}
        expected = expected_decisions(adapter, rule, block)
        return {
            "engine_token_ids": tokens.tolist(),
            "rule_token_ids": expected.token_ids.tolist(),
        }

    detail = "same decisions as the rule from the same randomness"
    return _result(name, found, tally, examples, detail, outputs)


def seeded_batch_invariance(
    adapter: Adapter, examples: int, seed: int, log: LayoutLog
) -> PropertyResult:
    """A seeded row alone, then at a drawn place in a drawn batch of seeded and unseeded
    rows (with the engine's default randomness moved on in between): same tokens."""
    from cactus_theory.testing import strategies
    from cactus_theory.testing.conformance.adapter import generators_for

    name = "seeded-batch-invariance"
    st = strategies.st
    tally = Tally()

    @st.composite
    def draw_case(draw):
        block = draw(cases.block_strategy("any"))
        batch = block.ids.shape[0]
        row = draw(st.integers(0, batch - 1))
        own = draw(st.integers(0, 2**31 - 1))
        others = [draw(st.sampled_from([None, 1, 2, 3])) for _ in range(batch)]
        background = draw(st.integers(0, 2**31 - 1))
        return block, row, own, others, background

    def problem(case) -> str | None:
        block, row, own, others, background = case
        dtype = DTYPES[block.dtype]
        target = torch.as_tensor(block.target).to(dtype)
        draft = torch.as_tensor(block.draft).to(dtype)
        ids = torch.as_tensor(block.ids, dtype=torch.int64)
        torch.manual_seed(background)
        alone = call(
            adapter.verify, log, name, target[row : row + 1], draft[row : row + 1],
            ids[row : row + 1], generators_for([own]),
        )  # fmt: skip
        seeds = [None if s is None else own + 7919 * s for s in others]
        seeds[row] = own
        torch.manual_seed(background + 1)
        batched = call(adapter.verify, log, name, target, draft, ids, generators_for(seeds))
        tally.rows += 1
        if np.array_equal(alone[0][0], batched[0][row]):
            return None
        return (
            f"row {row} (seed {own}) emits {alone[0][0].tolist()} alone and "
            f"{batched[0][row].tolist()} in a batch with row seeds {seeds}"
        )

    found = search(draw_case(), problem, examples, seed)
    if found is not None:
        message, (block, row, own, others, background) = found
        example = {**block.plain(), "row": row, "row_seed": own, "others": others}
        return PropertyResult(name, FAILED, message, example, decisions=tally.rows)
    return PropertyResult(
        name,
        PASSED,
        f"a seeded row's tokens do not depend on its batch ({examples} draws)",
        decisions=tally.rows,
    )
