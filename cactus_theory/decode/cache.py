"""The decoder's KV caches: one rectangular ``DynamicCache`` of slots per model, a 0/1 slot
mask over it, and the rollback of rejected slots (``DynamicCache.crop``, never recomputed).
"""

from __future__ import annotations

import inspect

import torch

Tensor = torch.Tensor


def _cache_keyword(model) -> str:
    """``cache`` (transformers >= 5.2x) or ``past_key_values`` (earlier 5.x)."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


class CachedModel:
    """A causal LM with its DynamicCache and the slot mask of that cache."""

    def __init__(self, model, batch: int, device: torch.device) -> None:
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache()
        self.keyword = _cache_keyword(model)
        self.keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.slot_mask = torch.zeros(batch, 0, dtype=torch.int64, device=device)
        self.calls = 0

    @property
    def slots(self) -> int:
        return self.slot_mask.shape[1]

    def forward(self, ids: Tensor, valid: Tensor, positions: Tensor, keep: int = 0) -> Tensor:
        """Append ``ids`` [B, n] (slot validity ``valid``) and return logits [B, n or keep, V]."""
        self.slot_mask = torch.cat([self.slot_mask, valid.to(torch.int64)], dim=1)
        kwargs = {self.keyword: self.cache}
        if keep and self.keeps_logits:
            kwargs["logits_to_keep"] = keep
        output = self.model(
            input_ids=ids,
            attention_mask=self.slot_mask,
            position_ids=positions,
            use_cache=True,
            **kwargs,
        )
        self.calls += 1
        logits = output.logits
        return logits[:, -keep:] if keep else logits

    def keep_slots(self, valid_new: Tensor) -> None:
        """Mark the last ``valid_new.shape[1]`` slots valid or not, then crop common holes."""
        count = valid_new.shape[1]
        if count:
            self.slot_mask[:, -count:] = valid_new.to(torch.int64)
        any_valid = self.slot_mask.any(dim=0)
        valid_columns = torch.nonzero(any_valid).flatten()
        last = int(valid_columns[-1]) + 1 if valid_columns.numel() else 0
        remove = self.slots - last
        if remove > 0:
            self.cache.crop(-remove)  # negative: remove that many slots (every 5.x version)
            self.slot_mask = self.slot_mask[:, :last]

    def select_rows(self, rows: Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.slot_mask = self.slot_mask[rows]


def positions_of_prompt(mask: Tensor) -> Tensor:
    """Position ids of a left-padded prompt: cumsum(mask) − 1, pads at 0."""
    return (mask.cumsum(dim=1) - 1).clamp(min=0)
