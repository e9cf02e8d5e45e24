"""The batched torch sampler: verify k drafted tokens per row with any rule.

``verify(target_probs, draft_probs, draft_ids, rule)`` is the torch export of the numpy
reference ``cactus_theory.verify.verify_block`` and makes the same decisions from the same
uniforms:

- scan the k drafted tokens left to right; position i is accepted iff
  ``accept_uniforms[b, i] < a_i``, with a_i the rule's acceptance of the drafted token
  (``torch_rules``; a drafted token whose draft probability is 0 has a_i = 0, so it is
  rejected, as in vLLM); stop at the first rejection;
- at the first rejected position sample the rule's residual law; after k acceptances sample
  the bonus token from ``target_probs[:, k]`` (unchanged);
- the token is drawn by inverse CDF with ``sample_uniforms[b]``: the first index whose
  cumulative sum exceeds u · (row total), falling back to the last index with positive
  mass, so a zero-probability token is never drawn (rows need not be normalised).

Output layout (vLLM / FlashInfer): ``token_ids [B, k+1]`` (int64) holds the accepted drafts,
then the emitted token, then −1 padding; ``num_accepted [B]`` counts the accepted drafts.

**All-zero residual.** When Σ(h − p)_+ = 0 (h = p, e.g. SpS with draft = target and a
drafted token of draft probability 0), the residual is h itself, as in the numpy rules: the
emitted token is ``inverse_cdf(h, sample_uniform)``, a token with positive mass under h.

**Uniforms.** ``uniforms=(accept_uniforms [B, k], sample_uniforms [B])``, values in [0, 1)
(any float dtype; comparisons run in float64). Without them the sampler draws one tensor
U = rand(B, k+1) (float64) from ``generator`` and uses U[:, :k] to accept and U[:, k] to
sample. A CPU generator (or None: torch's default CPU generator) draws on the CPU and moves
U to the inputs' device, so a seed gives the same uniforms on CPU and GPU; and since the CPU
generator fills U row by row, verifying a batch equals verifying its rows one by one with
the same generator. A CUDA generator draws on its device (faster; no such guarantee).

**Precision.** Everything over V is computed in float32 (float64 for float64 inputs),
whatever the input dtype (float32, bfloat16, float16). Decisions then equal the float64
reference except where a uniform lies within float32 rounding of a_i (a set of measure
~1e-7 per decision; the tests count these near-ties explicitly).

**Checks** (``check=True``, the default): tensor types and shapes, float dtypes, same
device, no NaN/inf, no negative entries, rows summing to 1 within ``SUM_TOLERANCE`` of
their dtype, integer draft ids in [0, V), uniforms in [0, 1). Each failure is a
ValueError naming the argument. ``check=False`` skips the value checks (not the shape
checks, which are free); out-of-range draft ids are then treated as rejected and NaN rows
emit token 0, so no id outside [0, V) is ever returned.

**Memory and work.** SpS, interp, cactus and cactus-exact read only q_n and p_n at the
drafted ids to decide, and build one residual row per batch row: no [B, k, V] temporary.
The frontier and the decision rules read whole rows, but only the rows the scan reaches:
position by position, on the batch rows still accepting (``_accept_reached``), so a
frontier solve after a row's first rejection is never done. ``verify_dense`` is the
reference-style path that materialises h over [B, k, V].
"""

from __future__ import annotations

import torch

from cactus_theory import torch_rules
from cactus_theory.rules.base import BranchRule, DecisionRule, Rule

Tensor = torch.Tensor

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

#: |Σ row − 1| allowed by the checks, per input dtype.
SUM_TOLERANCE = {
    torch.float64: 1e-6,
    torch.float32: 1e-4,
    torch.bfloat16: 1e-2,
    torch.float16: 1e-2,
}


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 inputs, float32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def inverse_cdf(probs: Tensor, uniforms: Tensor) -> Tensor:
    """Token ids [...] from rows ``probs [..., V]`` (need not sum to 1) and uniforms [...].

    The first index whose cumulative sum exceeds u · Σ row (a binary search on the
    cumulative sum, which is nondecreasing). If rounding puts u · Σ at or past the end, the
    first index where the cumulative sum reaches its total: the last token with positive
    mass (a trailing mass too small to change the float sum is skipped), so the result
    always has positive mass when the row has any (a row without mass gives 0). Always in
    [0, V).
    """
    vocab = probs.shape[-1]
    cumulative = torch.cumsum(probs, dim=-1)
    total = cumulative[..., -1:].contiguous()
    threshold = (uniforms.to(torch.float64)[..., None] * total.to(torch.float64)).to(probs.dtype)
    index = torch.searchsorted(cumulative, threshold, right=True)
    last_positive = torch.searchsorted(cumulative, total, right=False)
    chosen = torch.where(index >= vocab, last_positive, index)[..., 0]
    return chosen.clamp(0, vocab - 1)


# --- checks -----------------------------------------------------------------------------------


def _probs_tensor(name: str, value: object, ndim: int) -> Tensor:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: dtype {value.dtype} is not one of {FLOAT_DTYPES}")
    if value.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} axes, got shape {tuple(value.shape)}")
    return value


def check_probs(name: str, probs: Tensor) -> None:
    """Raise ValueError naming ``name`` for NaN/inf, negative values or bad row sums."""
    if probs.numel() == 0:
        return
    tolerance = SUM_TOLERANCE[probs.dtype]
    # Two reductions cover every check: a NaN or inf anywhere makes its row sum non-finite,
    # and a negative entry shows in the row minimum.
    sums = probs.sum(dim=-1, dtype=compute_dtype(probs.dtype))
    lowest = probs.amin(dim=-1)
    finite, nonnegative, worst = torch.stack(
        [
            torch.isfinite(sums).all().double(),
            (lowest >= 0).all().double(),
            (sums - 1.0).abs().amax().double(),
        ]
    ).tolist()
    if not finite:
        raise ValueError(f"{name}: contains NaN or inf")
    if not nonnegative:
        raise ValueError(f"{name}: contains negative values")
    if worst > tolerance:
        raise ValueError(
            f"{name}: rows must sum to 1 within {tolerance:g} for {probs.dtype}; "
            f"a row is off by {worst:.3g}"
        )


def _check_shapes(target_probs: object, draft_probs: object, draft_ids: object):
    target = _probs_tensor("target_probs", target_probs, 3)
    draft = _probs_tensor("draft_probs", draft_probs, 3)
    batch, steps, vocab = draft.shape
    if tuple(target.shape) != (batch, steps + 1, vocab):
        raise ValueError(
            f"target_probs: shape {tuple(target.shape)} does not match draft_probs "
            f"{tuple(draft.shape)} (expected [B, k+1, V] = {(batch, steps + 1, vocab)})"
        )
    if vocab == 0:
        raise ValueError("draft_probs: the vocabulary axis is empty")
    if draft.device != target.device:
        raise ValueError(f"draft_probs: on {draft.device}, target_probs on {target.device}")
    if not isinstance(draft_ids, torch.Tensor):
        raise ValueError(f"draft_ids: expected a torch.Tensor, got {type(draft_ids).__name__}")
    if (
        draft_ids.dtype.is_floating_point
        or draft_ids.dtype.is_complex
        or (draft_ids.dtype == torch.bool)
    ):
        raise ValueError(f"draft_ids: expected integer ids, got dtype {draft_ids.dtype}")
    if tuple(draft_ids.shape) != (batch, steps):
        raise ValueError(
            f"draft_ids: expected shape {(batch, steps)}, got {tuple(draft_ids.shape)}"
        )
    if draft_ids.device != target.device:
        raise ValueError(f"draft_ids: on {draft_ids.device}, target_probs on {target.device}")
    return target, draft, batch, steps, vocab


def _uniforms(
    uniforms: object, generator: torch.Generator | None, batch: int, steps: int, device, check
):
    if uniforms is not None:
        if generator is not None:
            raise ValueError("uniforms: pass either uniforms or generator, not both")
        if not isinstance(uniforms, tuple | list) or len(uniforms) != 2:
            raise ValueError(
                "uniforms: expected a pair (accept_uniforms [B, k], sample_uniforms [B])"
            )
        accept_u, sample_u = uniforms
        for name, value, shape in (
            ("accept_uniforms", accept_u, (batch, steps)),
            ("sample_uniforms", sample_u, (batch,)),
        ):
            if not isinstance(value, torch.Tensor) or not value.dtype.is_floating_point:
                raise ValueError(f"{name}: expected a float tensor of shape {shape}")
            if tuple(value.shape) != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {tuple(value.shape)}")
            if check and value.numel():
                inside = ((value >= 0) & (value < 1)).all().item()
                if not inside:
                    raise ValueError(f"{name}: values must lie in [0, 1) (and not be NaN)")
        return accept_u.to(device, torch.float64), sample_u.to(device, torch.float64)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator: expected a torch.Generator, got {type(generator).__name__}")
    draw_device = torch.device("cpu") if generator is None else generator.device
    drawn = torch.rand(
        batch, steps + 1, generator=generator, dtype=torch.float64, device=draw_device
    ).to(device)
    return drawn[:, :steps], drawn[:, steps]


def _rows_at(probs: Tensor, positions: Tensor) -> Tensor:
    """probs[b, positions[b]] for every b, [B, V] (advanced indexing: on CPU it is about
    15x faster than index_select over the flattened [B·k, V] view for V ~ 150k)."""
    return probs[torch.arange(probs.shape[0], device=probs.device), positions]


def _take(state, rows: Tensor, positions: Tensor):
    """The per-position state at (rows, positions): tensors, tuples of them, or None."""
    if state is None:
        return None
    if isinstance(state, tuple):
        return tuple(part[rows, positions] for part in state)
    return state[rows, positions]


#: Below this many probabilities in [B, k, V], ``_accept_reached`` evaluates every position
#: in one call (2^20: e.g. B = 1, k = 10, V = 100k, or B = 64, k = 10, V = 1,600).
WHOLE_BLOCK_ELEMENTS = 1 << 20


def _accept_reached(adapter, target, draft, ids, target_at, draft_at, accept_u, dtype):
    """Acceptances for rules that read whole rows, computed only where the scan gets to.

    Position i of row b matters only if positions < i were all accepted, so rows are
    evaluated position by position on the rows still running: the frontier solves (and the
    entropies, top-k values) of positions after a row's first rejection are never computed,
    and no [B, k, V] copy in the compute dtype is made. Positions not reached keep a = 0
    (never read: the scan stopped before them). Same decisions as evaluating everything.

    Blocks of at most ``WHOLE_BLOCK_ELEMENTS`` probabilities are evaluated in one call
    instead: there the per-call overhead of a row solve (frontier's bisections, a few
    dozen small kernels) outweighs the rows it would skip.
    """
    batch, steps = ids.shape
    if batch * steps * target.shape[-1] <= WHOLE_BLOCK_ELEMENTS:
        return adapter.accept(target.to(dtype), draft.to(dtype), ids, target_at, draft_at)
    probs = torch.zeros(batch, steps, dtype=dtype, device=ids.device)
    state = None
    running = torch.arange(batch, device=ids.device)
    for position in range(steps):
        if running.numel() == 0:
            break
        column = slice(position, position + 1)
        probs_here, state_here = adapter.accept(
            target[running, column].to(dtype),
            draft[running, column].to(dtype),
            ids[running, column],
            target_at[running, column],
            draft_at[running, column],
        )
        probs[running, position] = probs_here[:, 0]
        if state_here is not None:
            if state is None:
                state = tuple(
                    torch.ones(batch, steps, dtype=part.dtype, device=part.device)
                    for part in state_here
                )
            for buffer, part in zip(state, state_here, strict=True):
                buffer[running, position] = part[:, 0]
        keep = accept_u[running, position] < probs_here[:, 0].to(torch.float64)
        running = running[keep]
    return probs, state


# --- verify -----------------------------------------------------------------------------------


def verify(
    target_probs: Tensor,
    draft_probs: Tensor,
    draft_ids: Tensor,
    rule: Rule,
    generator: torch.Generator | None = None,
    uniforms: tuple[Tensor, Tensor] | None = None,
    check: bool = True,
) -> tuple[Tensor, Tensor]:
    """Verify k drafts per row: (token_ids [B, k+1] padded with −1, num_accepted [B]).

    target_probs [B, k+1, V] (q; the last row is the bonus distribution), draft_probs
    [B, k, V] (p, exactly the law each draft was sampled from), draft_ids [B, k]. See the
    module docstring for the uniforms, checks and precision.
    """
    adapter = torch_rules.for_rule(rule)
    target, draft, batch, steps, vocab = _check_shapes(target_probs, draft_probs, draft_ids)
    device = target.device
    if check:
        check_probs("target_probs", target)
        check_probs("draft_probs", draft)
        if draft_ids.numel() and not bool(((draft_ids >= 0) & (draft_ids < vocab)).all()):
            raise ValueError(f"draft_ids: ids must lie in [0, {vocab})")
    accept_u, sample_u = _uniforms(uniforms, generator, batch, steps, device, check)
    dtype = compute_dtype(target.dtype)
    ids = draft_ids.to(torch.int64)
    in_range = (ids >= 0) & (ids < vocab)
    safe_ids = ids.clamp(0, vocab - 1)
    rows = torch.arange(batch, device=device)

    if steps:
        drafted_target = target[:, :steps]
        target_at = drafted_target.gather(-1, safe_ids[..., None])[..., 0].to(dtype)
        draft_at = draft.gather(-1, safe_ids[..., None])[..., 0].to(dtype)
        if adapter.reads_rows:
            accept_probs, state = _accept_reached(
                adapter, drafted_target, draft, safe_ids, target_at, draft_at, accept_u, dtype
            )
        else:
            accept_probs, state = adapter.accept(None, None, safe_ids, target_at, draft_at)
        accepted = (accept_u < accept_probs.to(torch.float64)) & in_range
        num_accepted = torch.cumprod(accepted.to(torch.int64), dim=1).sum(dim=1)
        stop = num_accepted.clamp(max=steps - 1)
        residual = adapter.residual(
            _rows_at(target, stop).to(dtype),
            _rows_at(draft, stop).to(dtype),
            safe_ids[rows, stop],
            _take(state, rows, stop),
        )
        bonus = target[:, steps].to(dtype)
        emit_law = torch.where((num_accepted < steps)[:, None], residual, bonus)
    else:
        num_accepted = torch.zeros(batch, dtype=torch.int64, device=device)
        emit_law = target[:, 0].to(dtype)
    emitted = inverse_cdf(emit_law, sample_u)

    positions = torch.arange(steps + 1, device=device)
    token_ids = torch.full((batch, steps + 1), -1, dtype=torch.int64, device=device)
    token_ids[:, :steps] = torch.where(positions[None, :steps] < num_accepted[:, None], ids, -1)
    token_ids.scatter_(1, num_accepted[:, None], emitted[:, None])
    return token_ids, num_accepted


# --- the reference-style path (materialises h over [B, k, V]) ---------------------------------


def adjusted_targets_dense(rule: Rule, target_probs: Tensor, draft_probs: Tensor, ids: Tensor):
    """h for every drafted position, [B, k, V], as the Cactus reference code computes it."""
    adapter = torch_rules.for_rule(rule)
    if isinstance(rule, BranchRule):
        return adapter.branch_targets(target_probs, ids[..., None])
    if isinstance(rule, torch_rules.rules.Interp):
        return rule.alpha * draft_probs + (1.0 - rule.alpha) * target_probs
    if isinstance(rule, torch_rules.rules.Frontier):
        if rule.delta == 0:
            return target_probs
        batch, steps, vocab = target_probs.shape
        lift, cap = (
            value.reshape(batch, steps)
            for value in torch_rules.frontier_constants(
                target_probs.reshape(-1, vocab), draft_probs.reshape(-1, vocab), rule.delta
            )
        )
        return torch_rules.frontier_target(target_probs, draft_probs, lift, cap)
    if isinstance(rule, DecisionRule):
        raise ValueError(f"rule: {rule.name} is a decision rule; it has no target h")
    return target_probs  # sps


def verify_dense(
    target_probs: Tensor,
    draft_probs: Tensor,
    draft_ids: Tensor,
    rule: Rule,
    uniforms: tuple[Tensor, Tensor],
) -> tuple[Tensor, Tensor]:
    """The reference-style verify: h, acceptances and residuals over all [B, k, V].

    Same decisions and tokens as ``verify`` (same formulas, same uniforms); it exists as
    the benchmark's comparison point and as a second implementation for the tests.
    Generalised-SpS rules only (not tas/topk/greedy).
    """
    target, draft, batch, steps, vocab = _check_shapes(target_probs, draft_probs, draft_ids)
    dtype = compute_dtype(target.dtype)
    accept_u, sample_u = (u.to(target.device, torch.float64) for u in uniforms)
    ids = draft_ids.to(torch.int64)
    block_target, block_draft = target[:, :steps].to(dtype), draft.to(dtype)
    adjusted = adjusted_targets_dense(rule, block_target, block_draft, ids)  # [B, k, V]
    accept_all = torch_rules.gsps_accept(adjusted, block_draft)  # [B, k, V]
    residual_all = torch_rules.gsps_residual(adjusted, block_draft)  # [B, k, V]
    accept_probs = accept_all.gather(-1, ids[..., None])[..., 0]
    accepted = accept_u < accept_probs.to(torch.float64)
    num_accepted = torch.cumprod(accepted.to(torch.int64), dim=1).sum(dim=1)
    rows = torch.arange(batch, device=target.device)
    stop = num_accepted.clamp(max=steps - 1)
    emit_law = torch.where(
        (num_accepted < steps)[:, None], residual_all[rows, stop], target[:, steps].to(dtype)
    )
    emitted = inverse_cdf(emit_law, sample_u)
    positions = torch.arange(steps + 1, device=target.device)
    token_ids = torch.full((batch, steps + 1), -1, dtype=torch.int64, device=target.device)
    token_ids[:, :steps] = torch.where(positions[None, :steps] < num_accepted[:, None], ids, -1)
    token_ids.scatter_(1, num_accepted[:, None], emitted[:, None])
    return token_ids, num_accepted
