"""The decoder's KV caches: a rectangular cache of slots per model, right-aligned rows.

Each model keeps one ``transformers.DynamicCache`` over B rows and S *slots*, and a 0/1
slot mask [B, S] passed as the attention mask, with explicit ``position_ids`` (a row's
position = its number of valid tokens before). Between forward passes every row's valid
slots are **contiguous and end at the last slot**; the slots before them are padding
(mask 0), exactly as a left-padded prompt. Hugging Face builds causal and sliding-window
masks in slot space, so with no hole inside a row, slot distance equals position distance
and every model, sliding windows included, sees each row exactly as it would alone.

A forward appends n slots per row, valid or not; the invalid ones must come after the
row's valid new tokens (a rejected draft, a padding slot). ``keep`` then marks which new
slots a row keeps (the rollback) and restores the invariant: slots invalid in every row
are cropped from the end (``DynamicCache.crop``: a batch of one row never needs more),
and rows that still end in holes are right-aligned by one gather per cache layer (their
padding grows on the left). Nothing is recomputed.
"""

from __future__ import annotations

import inspect

import torch

Tensor = torch.Tensor


def cache_keyword(model) -> str:
    """``cache`` (transformers >= 5.2x) or ``past_key_values`` (earlier 5.x)."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def positions_of_prompt(mask: Tensor) -> Tensor:
    """Position ids [B, P] of a left-padded prompt mask [B, P]: cumsum(mask) − 1, pads at 0."""
    return (mask.cumsum(dim=1) - 1).clamp(min=0)


class CachedModel:
    """A causal LM with its KV cache of slots and the slot mask (see the module docstring)."""

    def __init__(self, model, batch: int, device: torch.device) -> None:
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache()
        self.keyword = cache_keyword(model)
        self.keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.slot_mask = torch.zeros(batch, 0, dtype=torch.int64, device=device)  # [B, S]
        self.calls = 0

    @property
    def slots(self) -> int:
        return self.slot_mask.shape[1]

    def forward(
        self, ids: Tensor, valid: Tensor, positions: Tensor, keep: int = 0, hidden: bool = False
    ):
        """Append ``ids`` [B, n] with slot validity ``valid`` [B, n] at ``positions`` [B, n];
        return logits [B, n, V] (the last ``keep`` of them when keep > 0), and with
        ``hidden`` also the last hidden states [B, n, H] (the features ``lm_head`` reads)."""
        self.slot_mask = torch.cat([self.slot_mask, valid.to(torch.int64)], dim=1)  # [B, S+n]
        kwargs = {self.keyword: self.cache}
        if keep and self.keeps_logits:
            kwargs["logits_to_keep"] = keep
        if hidden:
            kwargs["output_hidden_states"] = True
        output = self.model(
            input_ids=ids,
            attention_mask=self.slot_mask,
            position_ids=positions,
            use_cache=True,
            **kwargs,
        )
        self.calls += 1
        logits = output.logits  # [B, n or keep, V]
        logits = logits[:, -keep:] if keep else logits
        return (logits, output.hidden_states[-1]) if hidden else logits

    def keep(self, valid_new: Tensor) -> None:
        """Mark the last ``valid_new.shape[1]`` slots valid or not (``valid_new`` [B, m]),
        then crop slots invalid in every row and right-align rows ending in holes."""
        count = valid_new.shape[1]
        if count:
            self.slot_mask[:, -count:] = valid_new.to(torch.int64)
        any_valid = self.slot_mask.any(dim=0)  # [S]
        columns = torch.nonzero(any_valid).flatten()
        last = int(columns[-1]) + 1 if columns.numel() else 0
        if last < self.slots:
            self.cache.crop(-(self.slots - last))  # negative: remove that many slots
            self.slot_mask = self.slot_mask[:, :last]
        if self.slot_mask.shape[1] and not bool(self.slot_mask[:, -1].all()):
            self._right_align()

    def _right_align(self) -> None:
        """Move every row's valid (contiguous) slots to the end: one gather per layer."""
        slots = self.slots
        valid = self.slot_mask.bool()  # [B, S]
        index = torch.arange(slots, device=valid.device)
        end = torch.where(valid, index + 1, 0).amax(dim=1)  # [B] one past the last valid slot
        length = valid.sum(dim=1)  # [B]
        width = int(length.max())
        source = end[:, None] - width + torch.arange(width, device=valid.device)  # [B, S']
        self.slot_mask = (source >= (end - length)[:, None]).to(torch.int64)  # [B, S']
        self.gather_slots(source.clamp(min=0))

    def kv_layers(self):
        """(keys [B, H, S, D], values, layer) of every cache layer; ValueError for a layer
        that is not a DynamicCache-style one."""
        for layer in self.cache.layers:
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if not isinstance(keys, Tensor) or keys.ndim != 4:
                raise ValueError(
                    f"model: cache layer {type(layer).__name__} has no [B, H, S, D] keys; "
                    "batched speculative decoding needs transformers' DynamicCache layers"
                )
            yield keys, values, layer

    def gather_slots(self, source: Tensor) -> None:
        """Every layer's cache becomes the slots ``source`` [B, S'] of each row (one
        gather per layer; the slot mask is the caller's)."""
        for keys, values, layer in self.kv_layers():
            gather = source[:, None, :, None]  # [B, 1, S', 1]
            layer.keys = keys.gather(2, gather.expand(-1, keys.shape[1], -1, keys.shape[3]))
            layer.values = values.gather(2, gather.expand(-1, values.shape[1], -1, values.shape[3]))

    def select_rows(self, rows: Tensor) -> None:
        """Keep only the batch rows ``rows`` [B'] (finished rows leave the batch)."""
        self.cache.batch_select_indices(rows)
        self.slot_mask = self.slot_mask[rows]


class DraftCache(CachedModel):
    """The cache of an independent draft model, which may be one token behind the verifier.

    The drafter protocol the decoder calls (``FeatureDraftCache`` follows it too):
    ``prefill`` the prompt, ``first`` (the law of d_1), ``next`` (feed a draft, the law of
    the following one), ``rollback`` after verification, ``select_rows``.

    When a row accepts every draft, its last draft d_k was sampled but never fed to the
    draft model: it is ``pending`` here ([B] token ids and a [B] flag) and goes in first
    at the next draft call, as [d_k, last]; rows with nothing pending get [last, padding]
    (the padding slot after ``last``, so it is a trailing hole that ``keep`` removes).
    """

    needs_features = False

    def __init__(self, model, batch: int, device: torch.device) -> None:
        super().__init__(model, batch, device)
        self.pending = torch.zeros(batch, dtype=torch.int64, device=device)  # [B] token ids
        self.has_pending = torch.zeros(batch, dtype=torch.bool, device=device)  # [B]

    def prefill(self, ids: Tensor, mask: Tensor, positions: Tensor, features=None) -> None:
        """Feed the prompts without their last token (ids, mask, positions [B, P−1])."""
        self.forward(ids, mask, positions, keep=1)

    def first(self, last: Tensor, count: Tensor, limit: Tensor) -> Tensor:
        """Feed each row's pending token (if any) and ``last`` [B] (position count − 1);
        return the draft logits after ``last`` [B, V]. Positions are clamped to ``limit``
        [B] (padding slots only). The fed slots stay: they hold committed tokens."""
        if not bool(self.has_pending.any()):
            positions = (count - 1)[:, None]  # [B, 1]
            return self.forward(last[:, None], torch.ones_like(last[:, None]), positions, 1)[:, -1]
        pending = self.has_pending  # [B]
        first = torch.where(pending, self.pending, last)  # [B]
        ids = torch.stack([first, last], dim=1)  # [B, 2]; padding rows repeat last (masked)
        valid = torch.stack([torch.ones_like(pending), pending], dim=1)  # [B, 2]
        before = torch.where(pending, count - 2, count - 1)
        positions = torch.stack([before, torch.minimum(before + 1, limit)], dim=1).clamp(min=0)
        logits = self.forward(ids, valid, positions)  # [B, 2, V]
        self.keep(valid)  # a padding slot after `last` is a trailing hole: drop it now
        self.has_pending = torch.zeros_like(pending)
        return torch.where(pending[:, None], logits[:, 1], logits[:, 0])  # [B, V]

    def next(self, token: Tensor, positions: Tensor) -> Tensor:
        """Feed the draft ``token`` [B] at ``positions`` [B]; the logits after it [B, V]."""
        ids = token[:, None]  # [B, 1]
        return self.forward(ids, torch.ones_like(ids), positions[:, None])[:, -1]

    def rollback(self, draft_ids: Tensor, accepted: Tensor, emitted: Tensor, features) -> None:
        """Keep the fed drafts d_1 .. d_a of each row (a = accepted [B]); a row that accepted
        all K drafts leaves d_K pending."""
        steps = draft_ids.shape[1]
        if steps == 0:
            return
        offsets = torch.arange(1, steps, device=accepted.device)[None, :]  # [1, K−1]
        if steps > 1:
            self.keep(offsets <= accepted[:, None])  # fed d_1 .. d_{K−1}
        self.pending = draft_ids[:, -1]
        self.has_pending = accepted == steps

    def select_rows(self, rows: Tensor) -> None:
        super().select_rows(rows)
        self.pending, self.has_pending = self.pending[rows], self.has_pending[rows]


class FeatureDraftCache(CachedModel):
    """The cache of a feature draft (``decode.feature_draft``), the drafter protocol of
    ``DraftCache``.

    Its slot at position t holds the input (x_t, f_{t−1}). Only positions fed with the
    verifier's *true* features stay: the committed tokens not yet fed are ``pending``
    (tokens [B, m], features [B, m, H], counts [B]) and go in first at each draft call, in
    one forward with trailing padding; the drafting forwards that follow use the draft's
    own predicted features and are all dropped at ``rollback``.
    """

    needs_features = True

    def __init__(self, model, batch: int, device: torch.device) -> None:
        super().__init__(model, batch, device)
        hidden = model.config.hidden_size
        dtype = model.fc.weight.dtype
        self.pending_tokens = torch.zeros(batch, 1, dtype=torch.int64, device=device)  # [B, m]
        self.pending_features = torch.zeros(batch, 1, hidden, dtype=dtype, device=device)
        self.pending_count = torch.ones(batch, dtype=torch.int64, device=device)  # [B]
        self.predicted = torch.zeros(batch, hidden, dtype=dtype, device=device)  # [B, H] f̂
        self.drafted = 0  # drafting forwards this step (dropped at rollback)

    def forward(self, ids: Tensor, valid: Tensor, positions: Tensor, features: Tensor) -> Tensor:
        """Append ``ids`` [B, n] with their features [B, n, H]; the predicted f̂ [B, n, H]
        (the head runs only on the rows a caller needs: ``first`` and ``next``)."""
        self.slot_mask = torch.cat([self.slot_mask, valid.to(torch.int64)], dim=1)  # [B, S+n]
        predicted = self.model.predict_features(
            ids, features, attention_mask=self.slot_mask, position_ids=positions, cache=self.cache
        )
        self.calls += 1
        return predicted

    def prefill(self, ids: Tensor, mask: Tensor, positions: Tensor, features: Tensor) -> None:
        """Feed prompt tokens [B, P−1] with the verifier's features of the positions before
        them (``features`` [B, P−1, H] are the verifier's at each prefix slot); a row's
        first token gets 0. The last token's input (last, f at the last prefix slot) is
        left pending."""
        shifted = torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], dim=1)
        before_valid = torch.cat([torch.zeros_like(mask[:, :1]), mask[:, :-1]], dim=1)  # [B, P−1]
        shifted = shifted * before_valid[..., None].to(shifted.dtype)  # 0 after a padding slot
        self.forward(ids, mask, positions, shifted)
        last_feature = features[:, -1] * mask[:, -1:].to(features.dtype)  # [B, H]
        self.pending_features = last_feature[:, None].to(self.pending_features.dtype)

    def first(self, last: Tensor, count: Tensor, limit: Tensor) -> Tensor:
        """Feed each row's pending committed tokens (ending with ``last`` [B] at position
        count − 1) with their true features; the draft logits after ``last`` [B, V]."""
        self.pending_tokens[torch.arange(len(last)), self.pending_count - 1] = last
        width = self.pending_tokens.shape[1]
        offsets = torch.arange(width, device=last.device)[None, :]  # [1, m]
        valid = offsets < self.pending_count[:, None]  # [B, m] trailing padding
        start = count - self.pending_count  # [B] position of the first pending token
        positions = torch.minimum(start[:, None] + offsets, limit[:, None]).clamp(min=0)
        predicted = self.forward(
            self.pending_tokens, valid, positions, self.pending_features
        )  # [B, m, H]
        self.keep(valid)  # the padding after a row's pending tokens is a trailing hole
        index = self.pending_count - 1  # [B] the slot of `last`
        rows = torch.arange(len(last), device=last.device)
        self.predicted = predicted[rows, index]  # [B, H]
        self.drafted = 0
        return self.model.logits(self.predicted)  # [B, V]

    def next(self, token: Tensor, positions: Tensor) -> Tensor:
        """Feed the draft ``token`` [B] with the draft's own predicted feature."""
        ids = token[:, None]  # [B, 1]
        predicted = self.forward(
            ids, torch.ones_like(ids), positions[:, None], self.predicted[:, None]
        )  # [B, 1, H]
        self.predicted = predicted[:, -1]  # [B, H]
        self.drafted += 1
        return self.model.logits(self.predicted)  # [B, V]

    def rollback(self, draft_ids: Tensor, accepted: Tensor, emitted: Tensor, features) -> None:
        """Drop every drafting slot; the committed d_1 .. d_a and the emitted token become
        pending, with the verifier's features of the positions before them
        (``features`` [B, K+1, H] of the verify block [last, d_1 .. d_K])."""
        if self.drafted:  # a chain's drafting slots, or a tree's (every level's frontier)
            self.keep(
                torch.zeros(len(accepted), self.drafted, dtype=torch.bool, device=accepted.device)
            )
        self.drafted = 0
        width = int(accepted.max()) + 1  # m = the most committed tokens of a row
        offsets = torch.arange(width, device=accepted.device)[None, :]  # [1, m]
        padded = torch.cat([draft_ids, emitted[:, None]], dim=1)[:, :width]  # [B, m]
        tokens = torch.where(offsets < accepted[:, None], padded, emitted[:, None])  # [B, m]
        self.pending_tokens = tokens  # d_1 .. d_a, then the emitted token (and padding)
        self.pending_features = features[:, :width].to(self.pending_features.dtype)
        self.pending_count = accepted + 1

    def select_rows(self, rows: Tensor) -> None:
        super().select_rows(rows)
        self.pending_tokens = self.pending_tokens[rows]
        self.pending_features = self.pending_features[rows]
        self.pending_count, self.predicted = self.pending_count[rows], self.predicted[rows]
