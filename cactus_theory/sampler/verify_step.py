"""The verify step in torch: verify k drafted tokens per row with any rule.

``verify(target_probs, draft_probs, draft_ids, rule)`` is the torch twin of the numpy
reference ``cactus_theory.core.verify.verify_block`` and makes the same decisions from the
same uniforms:

- scan the k drafted tokens left to right; position i is accepted iff
  ``accept_uniforms[b, i] < a_i``, with a_i the rule's acceptance of the drafted token
  (``sampler.rules``; a drafted token whose draft probability is 0 has a_i = 0, so it is
  rejected, as in vLLM); stop at the first rejection;
- at the first rejected position sample the rule's residual law; after k acceptances sample
  the bonus token from ``target_probs[:, k]`` (unchanged);
- the token is drawn by inverse CDF with ``sample_uniforms[b]``: the first index whose
  cumulative sum exceeds u · (row total), falling back to the last index with positive
  mass, so a zero-probability token is never drawn (rows need not be normalised).

Output layout (vLLM / FlashInfer): ``token_ids [B, k+1]`` (int64) holds the accepted drafts,
then the emitted token, then ``PAD_ID`` (−1) padding; ``num_accepted [B]`` counts the
accepted drafts.

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

**Checks** (``check=True``, the default; ``sampler.checks``): tensor types and shapes,
float dtypes, same device, no NaN/inf, no negative entries, rows summing to 1 within
``SUM_TOLERANCE`` of their dtype, integer draft ids in [0, V), uniforms in [0, 1). Each
failure is a ValueError naming the argument. ``check=False`` skips the value checks (not the shape
checks, which are free); out-of-range draft ids are then treated as rejected and NaN rows
emit some token in range, so no id outside [0, V) is ever returned.

**Memory and work.** SpS, interp, cactus and cactus-exact read only q_n and p_n at the
drafted ids to decide, and build one residual row per batch row: no [B, k, V] temporary.
The frontier and the decision rules read whole rows, but only the rows the scan reaches:
position by position, on the batch rows still accepting (``_accept_reached``), so a
frontier solve after a row's first rejection is never done (when every row is still
running, a position's rows are read as views, not copied). ``sampler.dense.verify_dense``
is the reference-style path that materialises h over [B, k, V].

**Passes at the emitting position** (V >= ``emit.TWO_LEVEL_MIN_VOCAB``, on CPU): only a
rejected row builds a residual, one row at a time through views, so its temporaries stay
in cache: SpS (q − p)_+ is a difference, a clamp and the empty-row sum; cactus and
cactus-exact (s q − p)_+ a product, a difference-and-clamp and that sum (γ_n comes from
the acceptance step: cactus-exact solves γ* once); then the block sums of the two-level
inverse CDF (``sampler.emit``) and one block of 1024. A row that accepted all its drafts
reads its bonus row in place (block sums and one block). Nothing of size [B, k, V] and no
float64 pass over [V].
"""

from __future__ import annotations

import torch

from cactus_theory.core.rules.base import Rule
from cactus_theory.core.verify import PAD_ID
from cactus_theory.sampler import emit
from cactus_theory.sampler.checks import (
    check_ids,
    check_num_drafts,
    check_probs,
    check_shapes,
    compute_dtype,
    uniforms_for,
)
from cactus_theory.sampler.emit import inverse_cdf
from cactus_theory.sampler.rules import for_rule
from cactus_theory.sampler.rules.base import Plan, State, TorchRule

Tensor = torch.Tensor


def rows_at(probs: Tensor, positions: Tensor) -> Tensor:
    """probs[b, positions[b]] for every b: [B, V] from [B, n, V] and positions [B]
    (advanced indexing: on CPU about 15x faster than index_select over the flattened
    [B·n, V] view for V ~ 150k)."""
    return probs[torch.arange(probs.shape[0], device=probs.device), positions]


def _take(state: State, rows: Tensor, positions: Tensor) -> State:
    """The per-position state [B, k] at (rows [R], positions [R]) -> parts [R]."""
    if state is None:
        return None
    return tuple(part[rows, positions] for part in state)


#: Below this many probabilities in [B, k, V], ``_accept_reached`` evaluates every position
#: in one call (2^20: e.g. B = 1, k = 10, V = 100k, or B = 64, k = 10, V = 1,600).
WHOLE_BLOCK_ELEMENTS = 1 << 20


def _accept_reached(
    adapter: TorchRule,
    target: Tensor,  # [B, k, V] verifier rows at the drafted positions
    draft: Tensor,  # [B, k, V]
    ids: Tensor,  # [B, k] drafted ids (in range)
    target_at: Tensor,  # [B, k] q_n
    draft_at: Tensor,  # [B, k] p_n
    accept_u: Tensor,  # [B, k] float64
    num_drafts: Tensor,  # [B] drafts per row; the scan of row b stops at num_drafts[b]
    dtype: torch.dtype,
) -> tuple[Tensor, State]:
    """Acceptances [B, k] for rules that read whole rows, computed only where the scan
    gets to.

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
    accept_probs = torch.zeros(batch, steps, dtype=dtype, device=ids.device)  # [B, k]
    state: list[Tensor] | None = None
    running = torch.arange(batch, device=ids.device)  # [R] rows whose scan reaches here
    for position in range(steps):
        running = running[num_drafts[running] > position]
        if running.numel() == 0:
            break
        column = slice(position, position + 1)
        # Every row still running: views (no copy of the rows); else gather the rows.
        where = slice(None) if running.numel() == batch else running
        probs_here, state_here = adapter.accept(  # [R, 1], parts [R, 1]
            target[where, column].to(dtype),
            draft[where, column].to(dtype),
            ids[running, column],
            target_at[running, column],
            draft_at[running, column],
        )
        accept_probs[running, position] = probs_here[:, 0]
        if state_here is not None:
            if state is None:
                state = [
                    torch.ones(batch, steps, dtype=part.dtype, device=part.device)
                    for part in state_here
                ]
            for buffer, part in zip(state, state_here, strict=True):
                buffer[running, position] = part[:, 0]
        keep = accept_u[running, position] < probs_here[:, 0].to(torch.float64)  # [R]
        running = running[keep]
    return accept_probs, None if state is None else tuple(state)


def verify(
    target_probs: Tensor,
    draft_probs: Tensor,
    draft_ids: Tensor,
    rule: Rule,
    generator: torch.Generator | None = None,
    uniforms: tuple[Tensor, Tensor] | None = None,
    check: bool = True,
    num_drafts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Verify k drafts per row: (token_ids [B, k+1] padded with ``PAD_ID``, num_accepted [B]).

    Parameters
    ----------
    target_probs : [B, k+1, V] verifier laws q after the processors; row k is the bonus law.
    draft_probs : [B, k, V] the laws p each draft was sampled from.
    draft_ids : [B, k] integer drafted ids.
    rule : any rule of ``cactus_theory.rules`` (``rules.parse("cactus:delta=1.0")``).
    generator : draws U = rand(B, k+1) (float64) when ``uniforms`` is not given.
    uniforms : (accept_uniforms [B, k], sample_uniforms [B]) in [0, 1), instead of a
        generator.
    check : run the value checks (see the module docstring).
    num_drafts : [B] integer drafts per row in [0, k] (default: k for every row). Row b
        verifies only its first num_drafts[b] drafts; after accepting all of them it emits
        the bonus token from target_probs[b, num_drafts[b]] (so num_drafts[b] = 0 is a
        plain sample from target_probs[b, 0]). Entries past num_drafts[b] are never read
        for decisions and may hold anything valid (vLLM's ragged layout, padded).

    Returns
    -------
    token_ids : [B, k+1] int64: accepted drafts, the emitted token, then ``PAD_ID``.
    num_accepted : [B] int64: accepted drafts per row (0..k).
    """
    adapter = for_rule(rule)
    target, draft, batch, steps, vocab = check_shapes(target_probs, draft_probs, draft_ids)
    device = target.device
    if check:
        check_probs("target_probs", target)
        check_probs("draft_probs", draft)
        check_ids(draft_ids, vocab)
    accept_u, sample_u = uniforms_for(uniforms, generator, batch, steps, device, check)
    drafts = check_num_drafts(num_drafts, batch, steps, device)  # [B]
    dtype = compute_dtype(target.dtype)
    ids = draft_ids.to(torch.int64)  # [B, k]
    in_range = (ids >= 0) & (ids < vocab)  # [B, k]; out of range only with check=False
    safe_ids = ids.clamp(0, vocab - 1)  # [B, k]
    rows = torch.arange(batch, device=device)  # [B]

    if steps:
        drafted_target = target[:, :steps]  # [B, k, V] (a view)
        target_at = drafted_target.gather(-1, safe_ids[..., None])[..., 0].to(dtype)  # [B, k]
        draft_at = draft.gather(-1, safe_ids[..., None])[..., 0].to(dtype)  # [B, k]
        if adapter.reads_rows:
            accept_probs, state = _accept_reached(
                adapter,
                drafted_target,
                draft,
                safe_ids,
                target_at,
                draft_at,
                accept_u,
                drafts,
                dtype,
            )
        else:
            accept_probs, state = adapter.accept(None, None, safe_ids, target_at, draft_at)
        drafted = torch.arange(steps, device=device)[None, :] < drafts[:, None]  # [B, k]
        accepted = (accept_u < accept_probs.to(torch.float64)) & in_range & drafted  # [B, k]
        num_accepted = torch.cumprod(accepted.to(torch.int64), dim=1).sum(dim=1)  # [B]
        stop = num_accepted.clamp(max=steps - 1)  # [B] first rejected position
        plan = adapter.residual_plan(
            safe_ids[rows, stop], target_at[rows, stop], _take(state, rows, stop)
        )  # parts [B]
        emitted = _emit(
            adapter, target, draft, plan, stop, num_accepted < drafts, drafts, sample_u, dtype
        )
    else:
        num_accepted = torch.zeros(batch, dtype=torch.int64, device=device)  # [B]
        emitted = inverse_cdf(target[:, 0].to(dtype), sample_u)  # [B]
    return layout_tokens(ids, num_accepted, emitted), num_accepted


def _emit(
    adapter: TorchRule,
    target: Tensor,  # [B, k+1, V]
    draft: Tensor,  # [B, k, V]
    plan: Plan,  # parts [B]: the residual's per-row values at the stop position
    stop: Tensor,  # [B] first rejected position (clamped to k − 1)
    rejected: Tensor,  # [B] bool: the row emits from its residual (else the bonus row)
    drafts: Tensor,  # [B] drafts per row: the bonus row's position
    sample_u: Tensor,  # [B] float64
    dtype: torch.dtype,
) -> Tensor:
    """The emitted token [B]: inverse CDF of the residual at ``stop`` where ``rejected``,
    else of the bonus row ``target[b, drafts[b]]``.

    Large vocabularies (V >= ``TWO_LEVEL_MIN_VOCAB``) on CPU go row by row through views
    (``_emit_rows``): each row's residual is made by ``adapter.residual_rows`` on [1, V]
    and reduced to block sums while it is in cache, and a bonus row is read in place (no
    copy); then one block per row is searched. Elsewhere the residual and bonus rows are
    gathered for the whole batch and sampled by ``emit.inverse_cdf``.
    """
    vocab = target.shape[-1]
    if vocab >= emit.TWO_LEVEL_MIN_VOCAB and target.device.type == "cpu":
        return _emit_rows(adapter, target, draft, plan, stop, rejected, drafts, sample_u, dtype)
    residual = adapter.residual_rows(  # [B, V] unnormalised
        rows_at(target, stop).to(dtype), rows_at(draft, stop).to(dtype), plan
    )
    bonus = rows_at(target, drafts).to(dtype)  # [B, V] the row after its last draft
    emit_law = torch.where(rejected[:, None], residual, bonus)  # [B, V]
    if vocab < emit.TWO_LEVEL_MIN_VOCAB:
        return emit.inverse_cdf_flat(emit_law, sample_u)
    return inverse_cdf(emit_law, sample_u)


def _emit_rows(
    adapter: TorchRule,
    target: Tensor,  # [B, k+1, V]
    draft: Tensor,  # [B, k, V]
    plan: Plan,  # parts [B]
    stop: Tensor,  # [B]
    rejected: Tensor,  # [B] bool
    drafts: Tensor,  # [B]
    sample_u: Tensor,  # [B] float64
    dtype: torch.dtype,
) -> Tensor:
    """``_emit`` on CPU, one row at a time (see there): block sums W [B, nb] per row, the
    block b* per row (``emit.choose_blocks``), then the cumulative sum inside b*."""
    batch, vocab = stop.shape[0], target.shape[-1]
    sums = torch.empty(batch, emit.num_blocks(vocab), dtype=dtype)  # [B, nb]
    laws: list[Tensor] = []
    for row, (is_rejected, position, bonus_position) in enumerate(
        zip(rejected.tolist(), stop.tolist(), drafts.tolist(), strict=True)
    ):
        if is_rejected:
            law = adapter.residual_rows(  # [V]
                target[row, position][None].to(dtype),
                draft[row, position][None].to(dtype),
                tuple(part[row : row + 1] for part in plan),
            )[0]
        else:
            law = target[row, bonus_position].to(dtype)  # [V] a view for float32 rows
        emit.block_sums_into(law, sums[row])
        laws.append(law)
    block, before, threshold = emit.choose_blocks(sums, sample_u)  # [B] x3
    values = torch.zeros(batch, emit.BLOCK, dtype=dtype)  # [B, BLOCK]
    starts = (block * emit.BLOCK).tolist()
    for row, (law, start) in enumerate(zip(laws, starts, strict=True)):
        piece = law[start : start + emit.BLOCK]  # [<= emit.BLOCK]
        values[row, : piece.shape[0]] = piece  # zero-padded past V
    width = (vocab - block * emit.BLOCK).clamp(max=emit.BLOCK)  # [B]
    offset = emit.choose_in_block(values, before, threshold, width)  # [B]
    return (block * emit.BLOCK + offset).clamp(0, vocab - 1)


def layout_tokens(ids: Tensor, num_accepted: Tensor, emitted: Tensor) -> Tensor:
    """token_ids [B, k+1]: the accepted drafts of ``ids [B, k]``, the ``emitted [B]`` token
    at position num_accepted [B], then ``PAD_ID``."""
    batch, steps = ids.shape
    positions = torch.arange(steps + 1, device=ids.device)  # [k+1]
    token_ids = torch.full((batch, steps + 1), PAD_ID, dtype=torch.int64, device=ids.device)
    accepted = positions[None, :steps] < num_accepted[:, None]  # [B, k]
    token_ids[:, :steps] = torch.where(accepted, ids, PAD_ID)
    return token_ids.scatter_(1, num_accepted[:, None], emitted[:, None])
