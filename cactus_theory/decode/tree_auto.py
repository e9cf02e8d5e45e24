"""``tree="auto"``: the tree chosen from the pair's own costs and acceptance (Sequoia-style).

1. **Acceptance by depth and rank**, α(d, r), measured by decoding a few prompts with a
   calibration tree (``calibration_shape``: a spine of depth L where the root and every
   rank-0 node have R children, so every depth is reached and every rank tried) with the
   run's rule, children and sampling (``decode.tree_stats``), each cell shrunk towards its
   rank's value over all depths by ``PRIOR_COUNT`` pseudo-counts (``shrunk_table``).
2. **Costs**, measured on the decoder's own caches: a draft forward over a frontier of F
   nodes (F = 1, 2, 4, 8, 16) and a verifier forward over n tree nodes (n = 1, 2, 4, ...,
   up to the budget + 1) on a KV cache of the prompt, ``repeats`` interleaved rounds, the
   median of each; linear interpolation between the measured sizes (``CostCurve``). The
   rest of a step (sampler, meter, bookkeeping) is read from the calibration run.
3. **The choice**: ``core.trees.shape_search.choose_template`` over every depth cap and
   node budget up to the ``auto:N`` limit, maximising (1 + E) / cost.

``choose_tree`` returns the chosen ``TreeShape`` (a ``parents:...`` template, reusable as
``tree=``) with a ``TreeChoice`` report (its ``describe()`` is what ``cactus decode``
prints). Results are kept in memory per (verifier, draft, rule, children, sampling, limit),
so repeated calls in one process measure once. The calibration uses its own generator
(seed 0), so it does not consume the run's randomness.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from cactus_theory.core.trees.shape_search import Choice, choose_template
from cactus_theory.decode.tree_shape import TreeShape, parse_tree

Tensor = torch.Tensor
Array = np.ndarray

#: The calibration spine: depth and children per spine node.
SPINE_DEPTH = 6
SPINE_WIDTH = 6
#: Calibration decoding: prompts (rows of the run) and new tokens per prompt.
CALIBRATION_ROWS = 4
CALIBRATION_TOKENS = 64
#: Pseudo-counts pulling a rarely reached α(d, r) towards its rank's value over all depths.
PRIOR_COUNT = 10
#: Frontier sizes a draft forward is timed at.
FRONTIERS = (1, 2, 4, 8, 16)
REPEATS = 5

_MEMO: dict[tuple, TreeChoice] = {}


@dataclass(frozen=True)
class CostCurve:
    """Seconds of a forward against its size, measured at ``sizes`` (median of repeats);
    linear in between, the last slope beyond."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def __call__(self, size: int) -> float:
        return float(np.interp(size, self.sizes, self.seconds)) if size <= self.sizes[-1] else (
            self.seconds[-1]
            + (size - self.sizes[-1])
            * (self.seconds[-1] - self.seconds[-2])
            / max(self.sizes[-1] - self.sizes[-2], 1)
        )  # fmt: skip

    def text(self) -> str:
        """ "size: ms, ..." of the measured points."""
        pairs = zip(self.sizes, self.seconds, strict=True)
        return ", ".join(f"{size}: {1e3 * value:.1f}" for size, value in pairs)


@dataclass(frozen=True)
class TreeChoice:
    """What ``tree="auto"`` measured and chose."""

    shape: TreeShape
    choice: Choice
    acceptance: list[list[float]]  # α(d, r) as used (unmeasured: 0)
    draft: CostCurve
    verify: CostCurve
    rest_seconds: float
    step_seconds: float  # one autoregressive step: verify(1) + rest of a plain step
    calibration: dict = field(default_factory=dict)

    @property
    def predicted_speedup(self) -> float:
        """(1 + E) per predicted step cost, over one token per autoregressive step."""
        return (1.0 + self.choice.expected_accepted) / self.choice.cost * self.step_seconds

    def describe(self) -> str:
        """Lines: the choice, the model's numbers behind it, the measured costs."""
        widths = "/".join(str(count) for count in _widths(self.choice.parents))
        alphas = "; ".join(
            f"d{depth}: " + " ".join(f"{value:.2f}" for value in row[:4])
            for depth, row in enumerate(self.acceptance)
        )
        verify, draft = self.verify.text(), self.draft.text()
        return "\n".join(
            [
                f"tree auto: {self.shape.spec} ({self.choice.nodes} nodes, per depth "
                f"{widths}); predicted E[accepted] {self.choice.expected_accepted:.2f}, "
                f"{1e3 * self.choice.cost:.1f} ms per step, {self.predicted_speedup:.2f}x "
                "autoregressive",
                f"  α(depth, rank) measured on {self.calibration.get('steps', 0)} steps: {alphas}",
                f"  verify forward ms by nodes: {verify}",
                f"  draft forward ms by frontier: {draft}; rest of a step "
                f"{1e3 * self.rest_seconds:.1f} ms",
            ]
        )

    def as_json(self) -> dict:
        """What was measured and chosen, JSON-able."""
        return {
            "tree": self.shape.spec,
            "nodes": self.choice.nodes,
            "depth": self.choice.depth,
            "expected_accepted": self.choice.expected_accepted,
            "predicted_step_seconds": self.choice.cost,
            "predicted_speedup": self.predicted_speedup,
            "acceptance_by_depth_rank": self.acceptance,
            "verify_seconds_by_nodes": dict(
                zip(self.verify.sizes, self.verify.seconds, strict=True)
            ),
            "draft_seconds_by_frontier": dict(
                zip(self.draft.sizes, self.draft.seconds, strict=True)
            ),
            "rest_seconds": self.rest_seconds,
            "calibration": self.calibration,
        }


def choose_for_prompts(
    verifier, draft, input_ids, attention_mask, rule, spec: str, children: str, sampling,
    eos_token_id=None,
) -> TreeChoice:  # fmt: skip
    """``choose_tree`` on calibration prompts ``input_ids`` [B, P] (left-padded, with
    ``attention_mask``), for ``rule`` (a rule, tree rule or spec), the drafting scheme
    ``children`` and ``sampling`` (``core.processors.SamplingSettings``); ``spec`` is
    ``"auto"`` or ``"auto:N"``."""
    from cactus_theory.decode.settings import GenerationSettings, prepare
    from cactus_theory.decode.tree_rules import tree_rule
    from cactus_theory.decode.tree_shape import check_children

    shape = parse_tree(spec)
    if shape is None or shape.auto is None:
        raise ValueError(f"tree: expected 'auto' or 'auto:N', got {spec!r}")
    scheme = check_children(children, shape)
    settings = GenerationSettings(
        CALIBRATION_TOKENS, sampling.temperature, sampling.top_k, sampling.top_p,
        eos_token_id=[] if eos_token_id is None else eos_token_id, meter=False,
    )  # fmt: skip
    with torch.inference_mode():
        prepared = prepare(verifier, draft, input_ids, attention_mask, settings)
        return choose_tree(verifier, draft, prepared, tree_rule(rule, scheme), scheme, shape)


def _widths(parents) -> list[int]:
    from cactus_theory.core.trees.shape_search import template_depths

    depth = template_depths(parents)
    return [depth.count(level) for level in range(1, max(depth) + 1)]


def calibration_shape(depth: int = SPINE_DEPTH, width: int = SPINE_WIDTH) -> TreeShape:
    """The spine: the root and each rank-0 node down to ``depth`` have ``width`` children."""
    parents: list[int] = []
    spine = 0
    for _ in range(depth):
        first = len(parents) + 1
        parents.extend([spine] * width)
        spine = first
    return parse_tree("parents:" + ",".join(map(str, parents)))


def choose_tree(verifier, draft, prepared, rule, scheme: str, shape: TreeShape) -> TreeChoice:
    """Measure and choose (module docstring) for the run ``prepared`` (its first rows are
    the calibration prompts); ``shape.auto`` is the node limit."""
    key = (
        id(verifier), id(draft), repr(rule), scheme, prepared.processors, shape.auto,
        str(prepared.device),
    )  # fmt: skip
    if key in _MEMO:
        return _MEMO[key]
    table, calibration = measure_acceptance(verifier, draft, prepared, rule, scheme)
    draft_curve, verify_curve, step = measure_costs(verifier, draft, prepared, shape.auto + 1)
    rest = calibration["rest_seconds"]
    choice = choose_template(table, shape.auto, draft_curve, verify_curve, rest)
    chosen = TreeChoice(
        parse_tree(choice.spec), choice, table.tolist(), draft_curve, verify_curve, rest,
        step + rest, calibration,
    )  # fmt: skip
    _MEMO[key] = chosen
    return chosen


def shrunk_table(ended: Array, reached: Array) -> Array:
    """α(d, r) [L, R] = (ended + m α(r)) / (reached + m): each cell pulled towards its
    rank's value pooled over depths, α(r) = Σ_d ended / Σ_d reached, with m =
    ``PRIOR_COUNT`` pseudo-counts, so a cell reached a few times (deep in the spine) does
    not swing the choice; 0 where a rank was never tried."""
    pooled = ended.sum(axis=0) / np.maximum(reached.sum(axis=0), 1.0)  # [R]
    return (ended + PRIOR_COUNT * pooled) / (reached + PRIOR_COUNT)


def measure_acceptance(verifier, draft, prepared, rule, scheme) -> tuple[np.ndarray, dict]:
    """α(d, r) [L, R] from decoding the calibration spine on the run's first rows."""
    from cactus_theory.decode.generate import _tree_loop
    from cactus_theory.decode.settings import Prepared

    rows = min(CALIBRATION_ROWS, prepared.batch)
    calibration = Prepared(
        prepared.input_ids[:rows], prepared.mask[:rows], prepared.processors, [],
        prepared.pad_id, prepared.device, prepared.vocab,
        min(CALIBRATION_TOKENS, max(prepared.max_new_tokens, 8)),
        torch.Generator().manual_seed(0), False,
    )  # fmt: skip
    result = _tree_loop(verifier, draft, calibration, rule, calibration_shape(), scheme, None)
    ended, reached = result.ends_by_rank
    table = shrunk_table(np.array(ended, dtype=np.float64), np.array(reached, dtype=np.float64))
    timing = result.timing
    calls = max(timing.get("verifier_calls", 1), 1)
    rest = timing["total"] - timing.get("prefill", 0.0) - timing.get("draft", 0.0)
    rest -= timing.get("verify", 0.0)
    return table, {
        "steps": result.steps,
        "ended": ended,
        "reached": reached,
        "rest_seconds": max(rest / calls, 0.0),
        "rows": rows,
        "tokens": calibration.max_new_tokens,
    }


@torch.inference_mode()
def measure_costs(verifier, draft, prepared, max_nodes: int) -> tuple[CostCurve, CostCurve, float]:
    """(draft curve by frontier, verify curve by nodes, seconds of a one-token verifier
    step), timed on a KV cache of the run's first prompt (module docstring)."""
    from cactus_theory.decode.cache import CachedModel, DraftCache, FeatureDraftCache
    from cactus_theory.decode.feature_draft import FeatureDraft
    from cactus_theory.decode.tree_cache import forward_tree
    from cactus_theory.sampler.processors import process_logits

    ids = prepared.input_ids[:1, prepared.mask[0].bool()]  # [1, P]
    positions = torch.arange(ids.shape[1], device=ids.device)[None]
    target = CachedModel(verifier, 1, prepared.device)
    output = target.forward(ids, torch.ones_like(ids), positions, keep=1, hidden=True)
    feature_draft = isinstance(draft, FeatureDraft)
    drafter = (FeatureDraftCache if feature_draft else DraftCache)(draft, 1, prepared.device)
    drafter.prefill(ids, torch.ones_like(ids), positions, output[1] if feature_draft else None)
    sizes = sorted({1, 2, 4, 8, 16, 24, 32, 48, 64, max_nodes} & set(range(1, max_nodes + 1)))
    sizes = sorted(set(sizes) | {max_nodes})
    frontiers = tuple(size for size in FRONTIERS)
    verify_times = {size: [] for size in sizes}
    draft_times = {size: [] for size in frontiers}
    start = ids.shape[1]

    def timed(model, size, features=None):
        chain = torch.ones(1, size, size, dtype=torch.bool, device=ids.device).tril()
        tokens = ids[:, -1:].expand(1, size)
        place = (start + torch.arange(size, device=ids.device))[None]
        began = time.perf_counter()
        output = forward_tree(model, tokens, place, chain, features=features)
        if model is target:  # a verify step also processes every node's logits
            process_logits(output, prepared.processors)
        elif features is not None:  # a feature draft's head on every frontier node
            draft.logits(output)
        if ids.device.type == "cuda":
            torch.cuda.synchronize(ids.device)
        elapsed = time.perf_counter() - began
        model.cache.crop(-size)
        model.slot_mask = model.slot_mask[:, :-size]
        return elapsed

    for _ in range(REPEATS + 1):  # the first round warms up and is dropped
        for size in sizes:
            verify_times[size].append(timed(target, size))
        for size in frontiers:
            features = None
            if feature_draft:
                features = torch.zeros(1, size, draft.config.hidden_size, device=ids.device,
                                       dtype=draft.fc.weight.dtype)  # fmt: skip
            draft_times[size].append(timed(drafter, size, features))
    verify = CostCurve(tuple(sizes), tuple(statistics.median(verify_times[s][1:]) for s in sizes))
    drafting = CostCurve(frontiers, tuple(statistics.median(draft_times[s][1:]) for s in frontiers))
    return drafting, verify, verify(1)
