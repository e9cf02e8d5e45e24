"""Trees in the decoder's KV caches: tree attention masks, tree forwards and compaction.

A tree forward appends n slots per row (tree nodes) to a model's cache of slots
(``decode.cache``) and passes transformers a **4D attention mask** [B, 1, n, S + n] with
explicit position ids: node i sees every committed slot of its row (the 2D slot mask) and,
among the appended slots, itself and its ancestors (``visible`` [B, n, n]); its position
is its row's position of the root plus its depth. transformers (5.17 to 5.25) passes a 4D
mask through ``masking_utils`` unchanged to the attention function: a bool mask for
``sdpa`` (True = attend), an additive one (0 or the dtype's minimum) for ``eager``.
Drafts fed level by level keep a *tail* of tree slots (every level's nodes) and a level
sees its ancestors among all of them (``visible`` [B, n, T]).

**Which models.** A custom 4D mask replaces the model's own causal and sliding-window
masks, so a model is supported when that replacement is exact: the families tested to give,
for every node, the logits of its path decoded alone (``TREE_FAMILIES``: Llama, Qwen2,
Qwen3, Mistral, Gemma 2, Gemma 3 text, Phi-3, GPT-2, GPT-NeoX, OPT, Falcon, OLMo 2,
StableLM, Mixtral; the feature draft's Llama layer), with ``eager`` or ``sdpa`` attention,
and a sliding window only if it never cuts within the run (window >= the longest prompt +
max_new_tokens). Anything else is a ValueError naming ``tree`` (``check_tree_model``).

**Compaction** (``keep_tail``): after verification a row keeps some of its last T slots
(the root and the accepted path's nodes, in order) and drops the rest. When every row keeps
as many, the kept slots are gathered into place inside the tail (one gather over T slots per
layer) and the cache is cropped; otherwise each row's committed slots and kept slots are
right-aligned by one gather over the cache per layer (as the chain's rollback does for
ragged rows). Either way every row's valid slots are contiguous and end at the last slot
again.
"""

from __future__ import annotations

import torch

from cactus_theory.decode.cache import CachedModel

Tensor = torch.Tensor

#: Model types whose tree forwards with a custom 4D mask were tested exact
#: (``tests/decode/test_tree_families.py``).
TREE_FAMILIES = (
    "llama",
    "qwen2",
    "qwen3",
    "mistral",
    "gemma2",
    "gemma3_text",
    "phi3",
    "gpt2",
    "gpt_neox",
    "opt",
    "falcon",
    "olmo2",
    "stablelm",
    "mixtral",
)
#: Attention implementations that read a custom 4D mask.
TREE_ATTENTION = ("sdpa", "eager")


def text_config(model):
    """The config whose attention the tree mask replaces (a feature draft: its layers')."""
    inner = getattr(model, "layers", None)
    config = getattr(inner, "config", None) if inner is not None else None
    if config is None or not hasattr(model, "predict_features"):
        config = model.config
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    return config


def sliding_window(config) -> int | None:
    """The sliding window some layer of ``config`` uses, or None when none does."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return window if "sliding_attention" in layer_types else None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return window


def check_tree_model(name: str, model, longest: int) -> None:
    """ValueError naming ``tree`` unless ``model`` (the ``name``: verifier or draft) takes
    tree masks exactly for a run whose rows span at most ``longest`` positions (module
    docstring)."""
    config = text_config(model)
    family = getattr(config, "model_type", None)
    if family not in TREE_FAMILIES:
        raise ValueError(
            f"tree: the {name}'s architecture {family!r} is not one whose custom 4D tree "
            f"masks were tested exact ({', '.join(TREE_FAMILIES)}); decode it with a chain "
            "(tree=None)"
        )
    implementation = getattr(config, "_attn_implementation", None) or "eager"
    if implementation not in TREE_ATTENTION:
        raise ValueError(
            f"tree: the {name} uses {implementation!r} attention, which ignores a custom 4D "
            f"mask; load it with attn_implementation='sdpa' or 'eager'"
        )
    window = sliding_window(config)
    if window is not None and window < longest:
        raise ValueError(
            f"tree: the {name}'s sliding window of {window} positions would cut within this "
            f"run (a prompt plus max_new_tokens spans up to {longest}); a tree mask replaces "
            "the window, so decode it with a chain (tree=None) or a shorter run"
        )


def attention_kind(model) -> tuple[str, torch.dtype]:
    """(implementation, dtype) the mask is built for: ``sdpa`` or ``eager``, and the dtype
    an additive eager mask takes."""
    config = text_config(model)
    implementation = getattr(config, "_attn_implementation", None) or "eager"
    dtype = next(model.parameters()).dtype
    return implementation, dtype


def tree_mask(slot_mask: Tensor, visible: Tensor, implementation: str, dtype) -> Tensor:
    """The 4D mask [B, 1, n, S] of n new slots: the committed slots ``slot_mask`` [B, S0]
    (0/1) for every query, then ``visible`` [B, n, S − S0] (bool) over the tail; bool for
    sdpa, additive (0 / the dtype's minimum) for eager."""
    queries = visible.shape[1]
    committed = slot_mask.bool()[:, None, :].expand(-1, queries, -1)  # [B, n, S0]
    allowed = torch.cat([committed, visible], dim=2)[:, None]  # [B, 1, n, S]
    if implementation == "sdpa":
        return allowed
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


def forward_tree(
    model: CachedModel,
    ids: Tensor,  # [B, n]
    positions: Tensor,  # [B, n]
    visible: Tensor,  # [B, n, T] bool: the tail slots (the n new ones last) each node sees
    hidden: bool = False,
    features: Tensor | None = None,  # [B, n, H] a feature draft's input features
):
    """Append n tree slots to ``model``'s cache and run them under the tree mask: logits
    [B, n, V] (and the last hidden states [B, n, H] with ``hidden``); for a feature draft
    (``features`` given) the predicted features [B, n, H]."""
    tail = visible.shape[2]
    committed = model.slot_mask[:, : model.slots - (tail - ids.shape[1])]  # [B, S0]
    implementation, dtype = attention_kind(model.model)
    mask = tree_mask(committed, visible, implementation, dtype)
    valid = torch.ones_like(ids)
    model.slot_mask = torch.cat([model.slot_mask, valid], dim=1)  # [B, S + n]
    model.calls += 1
    if features is not None:
        return model.model.predict_features(
            ids, features, attention_mask=mask, position_ids=positions, cache=model.cache
        )
    kwargs = {model.keyword: model.cache}
    if hidden:
        kwargs["output_hidden_states"] = True
    output = model.model(
        input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **kwargs
    )
    return (output.logits, output.hidden_states[-1]) if hidden else output.logits


def keep_tail(model: CachedModel, index: Tensor, count: Tensor, tail: int) -> None:
    """Of each row's last ``tail`` slots keep ``index[b, :count[b]]`` (ascending tail
    positions; ``index`` [B, L] padded past ``count`` [B]), drop the rest, and restore the
    contiguous right-aligned layout (module docstring)."""
    if tail == 0:
        return
    start = model.slots - tail
    batch = count.shape[0]
    width = int(count.max()) if batch else 0
    index = index[:, :width]
    device = count.device
    if batch and bool((count == width).all()):
        if not torch.equal(index, torch.arange(width, device=device).expand(batch, -1)):
            _gather_tail(model, start, index)
        if width < tail:
            model.cache.crop(-(tail - width))  # negative: remove that many slots
        model.slot_mask = torch.cat(
            [
                model.slot_mask[:, :start],
                torch.ones(batch, width, dtype=torch.int64, device=device),
            ],
            dim=1,
        )
        return
    shift = width - count  # [B] extra left padding per row
    columns = torch.arange(start + width, device=device)[None, :]  # [1, W]
    from_prefix = columns - shift[:, None]  # [B, W] prefix slot each column takes
    in_tail = from_prefix >= start
    tail_slot = index.gather(1, (from_prefix - start).clamp(0, max(width - 1, 0)))  # [B, W]
    source = torch.where(in_tail, start + tail_slot, from_prefix.clamp(min=0))  # [B, W]
    valid = torch.where(
        in_tail,
        torch.ones_like(source),
        model.slot_mask.gather(1, from_prefix.clamp(0, max(start - 1, 0)))
        if start
        else torch.zeros_like(source),
    )
    valid = torch.where(from_prefix >= 0, valid, torch.zeros_like(valid))  # [B, W]
    used = torch.nonzero(valid.any(dim=0)).flatten()
    first = int(used[0]) if used.numel() else 0
    source, model.slot_mask = source[:, first:], valid[:, first:]
    model.gather_slots(source)


def _gather_tail(model: CachedModel, start: int, index: Tensor) -> None:
    """Layer by layer, write tail slots ``start + index`` [B, L] into slots start..start+L."""
    width = index.shape[1]
    for keys, values, layer in model.kv_layers():
        gather = (start + index)[:, None, :, None]  # [B, 1, L, 1]
        layer.keys[:, :, start : start + width] = keys.gather(
            2, gather.expand(-1, keys.shape[1], -1, keys.shape[3])
        )
        layer.values[:, :, start : start + width] = values.gather(
            2, gather.expand(-1, values.shape[1], -1, values.shape[3])
        )
