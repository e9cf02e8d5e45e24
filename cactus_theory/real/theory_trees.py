"""The theory against the decoder, for trees: a whole tree's exact expected accepted length
on a pool against the accepted length the tree decoder measures.

For a static tree (``decode.tree_shape``) with deterministic children and a tree rule, the
tree a step would draft at a context c is a function of c (the draft's top-K at every
node, its own features along each path for a feature draft), and its walk's accepted
length L has the exact mean and second moment (``sampler.tree_meter.accepted_moments``):

    E[L | c] = Σ_v P(reach v),  P(reach child r of u) = P(reach u) · a_r Π_{j<r} (1 − a_j),

with a the rule's sequential acceptances at u (``core.trees.base``). It is computed with
the decoder's own machinery: one draft of the tree and one verifier forward over it per
context (``whole_tree_moments``), the depth cut at min(D, M − t − 1) as the decoder cuts a
step starting at generated position t of M.

Per (dataset, rule, tree) row, on the same prompts and sampling settings:

- **pool E[L]**: the mean of E[L | c] over the pool's positions (``real.pools``: the
  verifier's own continuations), the tree counterpart of the chain's predicted AL;
- **E[L] at step starts**: the mean of E[L | c] at the contexts where the decoder's steps
  started (its own sequences), against which the **measured AL** differs by sampling
  noise only (given the history, step s accepts L_s with mean E[L | c_s]), so its z uses
  the martingale SE sqrt(Σ_s Var(L | c_s)) / n;
- pool E[L] − measured AL, with the paired SE by prompt: the selection of step starts
  (hard positions start more steps) plus, for a lossy rule, the trajectory shift
  (``real.theory``'s module docstring explains both for chains).

Decodes and moments are cached under ``cache`` (keyed by the pair, the prompts, the
settings, the rule, the tree and the code), so a rerun only recomputes the comparison.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from cactus_theory.real import pools
from cactus_theory.real.cluster_se import by_cluster, paired_difference_se, ratio_se, z_score
from cactus_theory.real.theory_decode import TheorySettings, decode_generator
from cactus_theory.real.verify_steps import step_starts
from cactus_theory.util import provenance

Array = np.ndarray

#: The code a cached tree decode or moment depends on.
CODE = provenance.source_fingerprint(
    "cactus_theory/decode",
    "cactus_theory/sampler",
    "cactus_theory/core/trees",
    "cactus_theory/core/rules",
    "cactus_theory/real/theory_trees.py",
)


def _tree_parts(rule_spec: str, tree: str):
    from cactus_theory.core.trees.base import DETERMINISTIC
    from cactus_theory.decode.tree_rules import tree_rule
    from cactus_theory.decode.tree_shape import parse_tree

    shape = parse_tree(tree)
    if shape is None or shape.parents is None:
        raise ValueError(
            f"tree: the comparison needs a static tree (widths or parents), got {tree!r}"
        )
    return tree_rule(rule_spec, DETERMINISTIC), shape


def whole_tree_moments(
    setup, contexts: list[list[int]], limits: list[int], rule_spec: str, tree: str,
    sampling, batch_size: int = 8, progress: bool = False,
) -> tuple[Array, Array]:  # fmt: skip
    """(E[L | c] [N], E[L² | c] [N]) of the tree ``tree`` walked with ``rule_spec`` at each
    context (token lists, the root its last token) cut at depth ``limits`` [N] (module
    docstring), in batches of left-padded contexts."""
    import torch

    from cactus_theory.core.trees.base import DETERMINISTIC
    from cactus_theory.decode import steps, tree_steps
    from cactus_theory.decode.cache import CachedModel, DraftCache, FeatureDraftCache
    from cactus_theory.decode.feature_draft import FeatureDraft
    from cactus_theory.decode.settings import GenerationSettings, prepare
    from cactus_theory.sampler.tree_meter import accepted_moments
    from cactus_theory.sampler.tree_structure import TreeStructure
    from cactus_theory.util.timing import Clock

    rule, shape = _tree_parts(rule_spec, tree)
    plan = tree_steps.plan(shape)
    mean, square = np.zeros(len(contexts)), np.zeros(len(contexts))
    settings = GenerationSettings(
        shape.depth + 1, sampling.temperature, sampling.top_k, sampling.top_p,
        eos_token_id=[], meter=False,
    )  # fmt: skip
    kind = FeatureDraftCache if isinstance(setup.draft, FeatureDraft) else DraftCache
    from tqdm.auto import tqdm

    starts = range(0, len(contexts), batch_size)
    with torch.inference_mode():
        for start in tqdm(starts, desc=f"E[L] {rule.label} {tree}", disable=not progress):
            chunk = contexts[start : start + batch_size]
            width = max(len(tokens) for tokens in chunk)
            ids = torch.zeros(len(chunk), width, dtype=torch.int64)
            mask = torch.zeros_like(ids)
            for row, tokens in enumerate(chunk):
                ids[row, width - len(tokens) :] = torch.tensor(tokens)
                mask[row, width - len(tokens) :] = 1
            prepared = prepare(
                setup.verifier, setup.draft, ids.to(setup.device), mask.to(setup.device), settings
            )
            target = CachedModel(setup.verifier, len(chunk), prepared.device)
            drafter = kind(setup.draft, len(chunk), prepared.device)
            active = steps.start(prepared, target, drafter, Clock())
            depth = torch.tensor(limits[start : start + len(chunk)], device=prepared.device)
            drafted = tree_steps.draft(drafter, active, plan, DETERMINISTIC, depth, prepared, None)
            structure = TreeStructure.of(drafted.parents)
            target_probs, _ = tree_steps.verify_forward(
                target, active, drafted, structure, prepared, False
            )
            first, second = accepted_moments(rule, target_probs, drafted.tokens, structure)
            mean[start : start + len(chunk)] = first.cpu().numpy()
            square[start : start + len(chunk)] = second.cpu().numpy()
    return mean, square


def _prompt_tokens(setup, prompts: list[str]) -> list[list[int]]:
    from cactus_theory.decode.runs import encode

    tokens = []
    for prompt in prompts:
        ids, mask = encode(setup, [prompt])
        tokens.append(ids[0][mask[0] == 1].tolist())
    return tokens


def _cached(path: Path | None, build) -> dict:
    arrays = None if path is None else pools._load(path)
    if arrays is None:
        arrays = build()
        if path is not None:
            pools._save(path, arrays)
    return arrays


def _key(setup, settings: TheorySettings, rule_spec: str, tree: str, what: str) -> str:
    from cactus_theory.real.decode_table import pair_identity

    return provenance.fingerprint(
        "theory-tree", what, {**settings.__dict__, "sampling": settings.sampling.label},
        rule_spec, tree, pair_identity(setup), setup.prompts[: settings.num_prompts],
        setup.chat, CODE,
    )  # fmt: skip


def tree_decode(
    setup, settings: TheorySettings, rule_spec: str, tree: str, progress: bool = False
) -> dict:
    """The prompts decoded with the tree (batch by batch, seeded as ``theory_decode``):
    accepted [steps, B] and node counts per batch, stacked, and the generated tokens."""
    from cactus_theory.decode import speculative_generate
    from cactus_theory.decode.runs import encode

    prompts = setup.prompts[: settings.num_prompts]
    accepted, starts, generated, rows = [], [], [], []
    from tqdm.auto import tqdm

    firsts = list(range(0, len(prompts), settings.batch_size))
    for batch, first in enumerate(tqdm(firsts, desc=f"decode {rule_spec} tree {tree}",
                                       disable=not progress)):  # fmt: skip
        chunk = prompts[first : first + settings.batch_size]
        ids, mask = encode(setup, chunk)
        result = speculative_generate(
            setup.verifier, setup.draft, ids.to(setup.device), rule=rule_spec, tree=tree,
            max_new_tokens=settings.max_new_tokens, temperature=settings.sampling.temperature,
            top_k=settings.sampling.top_k, top_p=settings.sampling.top_p,
            eos_token_id=setup.tokenizer.eos_token_id,
            pad_token_id=setup.tokenizer.pad_token_id,
            generator=decode_generator(settings.seed, batch),
            attention_mask=mask.to(setup.device), divergence=False,
        )  # fmt: skip
        found = step_starts(result.accepted_lengths.numpy(), result.draft_counts.numpy())
        accepted.append(found.accepted)
        rows.append(found.row + first)
        starts.append(found.start)
        for tokens in result.new_tokens:
            generated.append(np.asarray(tokens, dtype=np.int64))
    lengths = np.array([len(tokens) for tokens in generated])
    return {
        "row": np.concatenate(rows),
        "start": np.concatenate(starts),
        "accepted": np.concatenate(accepted),
        "lengths": lengths,
        "tokens": np.concatenate(generated) if generated else np.zeros(0, np.int64),
    }


def compare_tree(
    setup, pool, settings: TheorySettings, rule_spec: str, tree: str, cache: Path | None,
    progress: bool = True,
) -> dict:  # fmt: skip
    """One (rule, tree) row on ``pool`` (already restricted to the compared positions;
    module docstring)."""
    rule, shape = _tree_parts(rule_spec, tree)
    depth = shape.depth
    prompts = _prompt_tokens(setup, setup.prompts[: settings.num_prompts])
    budget = settings.max_new_tokens

    def limit(start: int) -> int:
        return max(0, min(depth, budget - start - 1))

    folder = None if cache is None else Path(cache) / "trees"

    def place(what: str) -> Path | None:
        key = _key(setup, settings, rule_spec, tree, what)
        return None if folder is None else folder / f"{what}-{key}.npz"

    decoded = _cached(
        place("decode"), lambda: tree_decode(setup, settings, rule_spec, tree, progress)
    )
    offsets = np.concatenate([[0], np.cumsum(decoded["lengths"])[:-1]])
    starts_contexts = [
        prompts[row] + decoded["tokens"][offsets[row] : offsets[row] + start].tolist()
        for row, start in zip(decoded["row"], decoded["start"], strict=True)
    ]
    starts_limits = [limit(int(start)) for start in decoded["start"]]

    order = np.lexsort((pool.step, pool.prompt))
    history: dict[int, list[int]] = {}
    pool_contexts, pool_limits = [], []
    for index in order:
        prompt, step = int(pool.prompt[index]), int(pool.step[index])
        history.setdefault(prompt, [])
        pool_contexts.append(prompts[prompt] + history[prompt][:step])
        pool_limits.append(limit(step))
        history[prompt].append(int(pool.token[index]))

    def moments(contexts, limits, what):
        def build():
            mean, square = whole_tree_moments(
                setup, contexts, limits, rule_spec, tree, settings.sampling,
                settings.batch_size, progress,
            )  # fmt: skip
            return {"mean": mean, "square": square}

        return _cached(place(what), build)

    at_starts = moments(starts_contexts, starts_limits, "starts")
    on_pool = moments(pool_contexts, pool_limits, "pool")
    labels = np.arange(settings.num_prompts)
    steps = len(decoded["accepted"])
    measured = decoded["accepted"].astype(float)
    step_prompts = decoded["row"]
    pool_prompts = pool.prompt[order]
    measured_sum = by_cluster(measured, step_prompts, labels)
    step_count = by_cluster(np.ones(steps), step_prompts, labels)
    pool_sum = by_cluster(on_pool["mean"], pool_prompts, labels)
    pool_count = by_cluster(np.ones(len(pool_prompts)), pool_prompts, labels)
    measured_al = float(measured.mean()) if steps else math.nan
    pool_mean = float(on_pool["mean"].mean()) if len(pool_prompts) else math.nan
    start_mean = float(at_starts["mean"].mean()) if steps else math.nan
    variance = np.clip(at_starts["square"] - at_starts["mean"] ** 2, 0.0, None)
    noise_se = math.sqrt(float(variance.sum())) / max(steps, 1)
    return {
        "rule": rule_spec,
        "label": rule.label,
        "tree": tree,
        "steps": steps,
        "pool_positions": int(len(pool_prompts)),
        "pool_accepted": pool_mean,
        "pool_accepted_se": ratio_se(pool_sum, pool_count),
        "measured_al": measured_al,
        "measured_al_se": ratio_se(measured_sum, step_count),
        "pool_z": z_score(
            pool_mean - measured_al,
            paired_difference_se(pool_sum, pool_count, measured_sum, step_count),
        ),
        "accepted_step_starts": start_mean,
        "starts_z": z_score(start_mean - measured_al, noise_se),
        "noise_se": noise_se,
    }


def run_trees(setups: dict, settings: TheorySettings, rules, trees, cache, *, device, dtype,
              progress=True) -> list[dict]:  # fmt: skip
    """Every (dataset, rule, tree) row (``compare_tree``), on each dataset's cached pool."""
    from cactus_theory.real.theory import restrict

    rows = []
    for name, setup in setups.items():
        pool = pools.build_pool(
            setup, settings.pool_settings(), None if cache is None else Path(cache) / "pools",
            device=device, dtype=dtype, progress=progress, name=name,
        )  # fmt: skip
        chosen = restrict(pool, settings)
        for tree in trees:
            for rule in rules:
                row = compare_tree(setup, chosen, settings, rule, tree, cache, progress)
                rows.append({"dataset": name, **row})
    return rows
