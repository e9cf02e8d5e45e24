"""Input checks of the torch sampler: each failure is a ValueError naming the argument.

``verify(..., check=True)`` runs all of them; ``check=False`` keeps the shape checks (they
are free) and skips the value checks (NaN/inf, negative entries, row sums, id range,
uniform range), for callers whose rows come from a model through ``sampler.processors``.
"""

from __future__ import annotations

import torch

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


def probs_tensor(name: str, value: object, ndim: int) -> Tensor:
    """``value`` if it is a float tensor with ``ndim`` axes, else ValueError naming ``name``."""
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


def check_shapes(
    target_probs: object, draft_probs: object, draft_ids: object
) -> tuple[Tensor, Tensor, int, int, int]:
    """(target [B, k+1, V], draft [B, k, V], B, k, V) after the type, shape and device
    checks of ``verify``'s three tensor arguments."""
    target = probs_tensor("target_probs", target_probs, 3)
    draft = probs_tensor("draft_probs", draft_probs, 3)
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


def check_ids(draft_ids: Tensor, vocab: int) -> None:
    """Raise ValueError unless every drafted id lies in [0, V)."""
    if draft_ids.numel() and not bool(((draft_ids >= 0) & (draft_ids < vocab)).all()):
        raise ValueError(f"draft_ids: ids must lie in [0, {vocab})")


def check_num_drafts(num_drafts: object, batch: int, steps: int, device: torch.device) -> Tensor:
    """num_drafts [B] as int64 on ``device`` (k for every row when None); ValueError unless
    it is an integer tensor of shape [B] with values in [0, k]."""
    if num_drafts is None:
        return torch.full((batch,), steps, dtype=torch.int64, device=device)
    if not isinstance(num_drafts, torch.Tensor):
        raise ValueError(f"num_drafts: expected a torch.Tensor, got {type(num_drafts).__name__}")
    if num_drafts.dtype.is_floating_point or num_drafts.dtype in (torch.bool, torch.complex64):
        raise ValueError(f"num_drafts: expected integer counts, got dtype {num_drafts.dtype}")
    if tuple(num_drafts.shape) != (batch,):
        raise ValueError(f"num_drafts: expected shape {(batch,)}, got {tuple(num_drafts.shape)}")
    counts = num_drafts.to(device, torch.int64)
    if counts.numel() and not bool(((counts >= 0) & (counts <= steps)).all()):
        raise ValueError(f"num_drafts: counts must lie in [0, {steps}]")
    return counts


def uniforms_for(
    uniforms: object,
    generator: torch.Generator | None,
    batch: int,
    steps: int,
    device: torch.device,
    check: bool,
) -> tuple[Tensor, Tensor]:
    """(accept_uniforms [B, k], sample_uniforms [B]) in float64 on ``device``: the given
    pair after its checks, or U = rand(B, k+1) drawn from ``generator`` (on the CPU when it
    is None or a CPU generator, so a seed gives the same uniforms on every device) split
    into U[:, :k] and U[:, k]."""
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
