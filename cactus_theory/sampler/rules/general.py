"""The torch face of any rule without a torch half of its own: its own methods, on rows.

``for_rule`` gives a rule the hand-written adapter registered for its exact class
(``ADAPTERS``; ``register_adapter`` adds one); every other rule, a user's or an engine's,
runs here, exactly and batched, with no extra code:

- ``TorchMassBranch``: a branch rule whose γ_n depends on q_n alone (it declares
  ``gamma_from_mass`` and keeps the default ``raised_masses``): γ is computed from the
  drafted masses [B, k] only, then the branch family's torch machinery (residual rows, the
  merge-sort law) runs as for cactus;
- ``TorchGeneral``: everything else. Acceptance is the rule's ``accept_probs`` on the rows
  the scan reaches, gathered at the drafted ids; the residual is the rule's
  ``residuals_for`` on the rejecting rows; the meter's law is ``law.output_law_rows``
  (``rules.exact_family`` picks the closed form or the general sum).

How the rule's methods see the rows: a rule that declares ``array_api`` is called with the
float64 tensors themselves, on their device (one definition for numpy and torch). Any other
rule is called with float64 numpy copies (``.cpu()``), and its results come back as tensors
on the rows' device: exact, and slower (a device round trip per call on a GPU); ``cactus
bench sampler --rule`` measures it beside the built-ins.

Decisions compare the same float64 a_n with the same uniforms as the numpy reference, so
on float64 rows they are the reference's (``cactus_theory.testing`` checks it per rule).
"""

from __future__ import annotations

import numpy as np
import torch

from cactus_theory.core import law
from cactus_theory.core.rules.base import Rule
from cactus_theory.sampler.rules.base import TorchBranchRule, TorchRule

Tensor = torch.Tensor


def rows_for(rule: Rule, *tensors: Tensor) -> list:
    """The tensors as the rule's methods take them: float64 tensors for an array-API rule,
    float64 numpy arrays (copied to the CPU) for any other."""
    if getattr(rule, "array_api", False):
        return [tensor.to(torch.float64) for tensor in tensors]
    return [tensor.detach().to("cpu", torch.float64).numpy() for tensor in tensors]


def ids_for(rule: Rule, ids: Tensor):
    """Token ids as the rule's methods take them (int64 tensor or numpy array)."""
    if getattr(rule, "array_api", False):
        return ids.to(torch.int64)
    return ids.detach().to("cpu", torch.int64).numpy()


def back(values: object, like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """A rule's result as a tensor on ``like``'s device, in ``dtype`` (default like's).

    A writable numpy array is shared, not copied; a read-only one (a rule may return
    ``np.broadcast_to`` views, which are read-only) is copied first, since torch shares
    memory only with writable arrays (and warns otherwise)."""
    if not torch.is_tensor(values):
        array = np.asarray(values)
        values = torch.as_tensor(array if array.flags.writeable else np.array(array))
    return values.to(device=like.device, dtype=dtype or like.dtype)


class TorchGeneral(TorchRule):
    """Any rule, through its own ``accept_probs`` and ``residuals_for`` on whole rows."""

    reads_rows = True

    def accept(self, target_probs, draft_probs, draft_ids, target_at, draft_at):
        target, draft = rows_for(self.rule, target_probs, draft_probs)
        accept_rows = back(self.rule.accept_probs(target, draft), target_at)  # [B, k, V]
        return accept_rows.gather(-1, draft_ids[..., None])[..., 0], None  # [B, k]

    def residual(self, target_row, draft_row, draft_id, state):
        target, draft = rows_for(self.rule, target_row, draft_row)
        residual = self.rule.residuals_for(target, draft, ids_for(self.rule, draft_id))
        # a law within 1e-9 (``rules.contract``); the clamp removes only rounding below 0
        return back(residual, target_row).expand_as(target_row).clamp(min=0.0)  # [c, V]

    def targets(self, target_probs, draft_probs, draft_ids):
        target, draft = rows_for(self.rule, target_probs, draft_probs)
        adjusted = self.rule.targets_for(target, draft, ids_for(self.rule, draft_ids))
        return back(adjusted, target_probs)

    def output_law(self, target_probs, draft_probs):
        target, draft = (
            tensor.detach().to("cpu", torch.float64).numpy()
            for tensor in (target_probs, draft_probs)
        )
        return back(law.output_law_rows(self.rule, target, draft), target_probs, torch.float64)


class TorchMassBranch(TorchBranchRule):
    """A branch rule with γ_n from q_n alone: the rule's ``raised_mass`` on the masses."""

    def raised_mass(self, target_mass, cap=None):
        masses = rows_for(self.rule, target_mass, *(() if cap is None else (cap,)))
        raised = self.rule.raised_mass(masses[0], cap=None if cap is None else masses[1])
        return back(raised, target_mass).reshape(target_mass.shape)
