"""A feature draft: a small model that drafts from the verifier's own hidden states (EAGLE).

An independent small draft has to guess the verifier from tokens alone; a feature draft
reads the verifier's last hidden state, the vector its LM head turns into q. At position t
it takes the token x_t and the verifier's feature f_{t−1} of the position before:

    input_t = fc([embed(x_t), f_{t−1}])        fc: Linear(2H, H); f_{−1} = 0
    f̂_t    = L Llama layers (own rotary, KV cache, final RMSNorm) over input_≤t
    logits  = head(f̂_t)                       the verifier's LM head (frozen), or its
                                               rank-r factor (f̂ P)(W P)^T, or its rows
                                               W[S] of a token subset S (logit −inf
                                               outside S)

where ``embed`` and the head weight W are the verifier's (shared, frozen) and only fc,
the layers, their norm and the projection P [H, r] are the draft's own (a few MB).

**A reduced-vocabulary head** (FR-Spec): with ``vocab_subset`` S (the most frequent target
tokens, ids saved with the weights) the draft computes logits only for S and puts −inf
elsewhere, so its law p is exactly 0 outside S. Every rule stays exact, because the rules
see the p each token was sampled from; what the draft loses is the target mass outside S
(its acceptance can only drop by it). The head then reads |S|·H numbers instead of V·H.
Drafting k tokens past the committed prefix, the draft feeds its own prediction f̂ as the
next position's feature; after verification the committed positions are fed again with
the verifier's true features (``cache.FeatureDraftCache``). The decoder treats the draft's
processed law p exactly as any draft's: the rule sees the law each token was sampled from.

``FeatureDraft.build(verifier, config)`` makes one on top of a verifier; ``save`` /
``FeatureDraft.load(folder, verifier)`` store and restore the draft's own parameters.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from cactus_theory.decode.cache import cache_keyword

Tensor = torch.Tensor

CONFIG_FILE = "feature_draft.json"
WEIGHTS_FILE = "feature_draft.pt"


@dataclass(frozen=True)
class FeatureDraftConfig:
    """The draft's shape; ``hidden_size`` must be the verifier's width."""

    hidden_size: int
    num_layers: int = 1
    num_heads: int = 9
    num_kv_heads: int = 3
    intermediate_size: int = 1536
    rank: int | None = None  # None: the full head; r: logits = (f̂ P)(W P)^T
    vocab_subset: int | None = None  # |S| of a reduced-vocabulary head (ids in the weights)
    rms_norm_eps: float = 1e-5
    rope_theta: float = 100000.0
    max_position_embeddings: int = 8192

    def llama_config(self):
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=1,  # inputs come as embeddings; no token table of its own
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            intermediate_size=self.intermediate_size,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            max_position_embeddings=self.max_position_embeddings,
            pad_token_id=None,
            bos_token_id=None,
            eos_token_id=None,
        )


class FeatureDraft(nn.Module):
    """The feature draft (module docstring). ``forward`` returns (logits [B, n, V], f̂ [B, n, H])."""

    def __init__(self, config: FeatureDraftConfig, embed_tokens: nn.Module, head_weight: Tensor):
        from transformers import LlamaModel

        super().__init__()
        hidden = config.hidden_size
        if head_weight.shape[1] != hidden:
            raise ValueError(
                f"config: hidden_size {hidden} differs from the verifier's {head_weight.shape[1]}"
            )
        self.config = config
        self.fc = nn.Linear(2 * hidden, hidden)
        self.layers = LlamaModel(config.llama_config())
        self.keyword = cache_keyword(self.layers)
        self.embed_tokens = [embed_tokens]  # a list: shared, not a submodule of the draft
        self.projection = None
        self._projected, self._projected_key = None, None  # W P, cached outside autograd
        self.register_buffer("head", head_weight.detach(), persistent=False)  # [V, H]
        if config.rank is not None:
            self.projection = nn.Parameter(torch.zeros(hidden, config.rank))  # P [H, r]
        if config.vocab_subset is not None and config.rank is not None:
            raise ValueError("config: choose a rank-r head or a vocabulary subset, not both")
        subset = config.vocab_subset
        if subset is not None and not 0 < subset <= head_weight.shape[0]:
            raise ValueError(f"config: vocab_subset must be in [1, {head_weight.shape[0]}]")
        # S [|S|] (saved), and W[S] [|S|, H], kept outside the state
        self.register_buffer("subset_ids", torch.arange(subset or 0), persistent=subset is not None)
        self._subset_head, self._subset_key = None, None

    @property
    def vocab_size(self) -> int:
        return self.head.shape[0]

    def set_subset(self, token_ids: Tensor) -> None:
        """Use the reduced-vocabulary head over ``token_ids`` [|S|] (distinct, in [0, V))."""
        token_ids = torch.as_tensor(token_ids, dtype=torch.int64, device=self.head.device)
        if token_ids.shape != self.subset_ids.shape:
            raise ValueError(f"token_ids: expected {self.subset_ids.shape[0]} ids")
        if token_ids.unique().numel() != token_ids.numel():
            raise ValueError("token_ids: the subset holds a token twice")
        if int(token_ids.min()) < 0 or int(token_ids.max()) >= self.vocab_size:
            raise ValueError(f"token_ids: ids must lie in [0, {self.vocab_size})")
        self.subset_ids.copy_(token_ids)

    def subset_logits(self, hidden: Tensor) -> Tensor:
        """The logits of the subset S only: [..., H] -> [..., |S|] (order of ``subset_ids``)."""
        key = (self.subset_ids._version, self.head.data_ptr(), self.head.dtype)
        if self._subset_key != key:
            self._subset_head = self.head[self.subset_ids]  # W[S] [|S|, H]
            self._subset_key = key
        return hidden @ self._subset_head.T

    def logits(self, hidden: Tensor) -> Tensor:
        """head(f̂): [..., H] -> [..., V] (−inf outside a vocabulary subset)."""
        if self.config.vocab_subset is not None:
            reduced = self.subset_logits(hidden)  # [..., |S|]
            full = reduced.new_full((*reduced.shape[:-1], self.vocab_size), float("-inf"))
            return full.index_copy_(-1, self.subset_ids, reduced)  # [..., V]
        if self.projection is None:
            return hidden @ self.head.T
        return (hidden @ self.projection) @ self.projected_head().T

    def projected_head(self) -> Tensor:
        """W P [V, r]; outside autograd it is computed once per value of P and kept (a
        drafting step then reads V·r numbers of the head instead of V·H)."""
        if torch.is_grad_enabled():
            return self.head @ self.projection
        key = (self.projection._version, self.projection.data_ptr(), self.projection.dtype)
        if self._projected_key != key:
            self._projected = self.head @ self.projection  # [V, r]
            self._projected_key = key
        return self._projected

    def predict_features(
        self,
        input_ids: Tensor,  # [B, n]
        features: Tensor,  # [B, n, H] the feature of the position before each token
        attention_mask: Tensor | None = None,  # [B, S + n] slots
        position_ids: Tensor | None = None,  # [B, n]
        cache=None,
    ) -> Tensor:
        """f̂ [B, n, H] without the head (training applies its own)."""
        embedded = self.embed_tokens[0](input_ids).to(self.fc.weight.dtype)  # [B, n, H]
        inputs = self.fc(torch.cat([embedded, features.to(embedded.dtype)], dim=-1))  # [B, n, H]
        kwargs = {} if cache is None else {self.keyword: cache, "use_cache": True}
        output = self.layers(
            inputs_embeds=inputs, attention_mask=attention_mask, position_ids=position_ids, **kwargs
        )
        return output.last_hidden_state  # [B, n, H]

    def forward(
        self,
        input_ids: Tensor,  # [B, n]
        features: Tensor,  # [B, n, H] the feature of the position before each token
        attention_mask: Tensor | None = None,  # [B, S + n] slots
        position_ids: Tensor | None = None,  # [B, n]
        cache=None,
    ) -> tuple[Tensor, Tensor]:
        predicted = self.predict_features(input_ids, features, attention_mask, position_ids, cache)
        return self.logits(predicted), predicted

    # --- building, saving, loading -------------------------------------------------------

    @classmethod
    def build(cls, verifier, config: FeatureDraftConfig, seed: int = 0) -> FeatureDraft:
        """A new draft (seeded initialisation) on top of ``verifier``'s embedding and head."""
        head = verifier.get_output_embeddings().weight
        torch.manual_seed(seed)
        draft = cls(config, verifier.get_input_embeddings(), head)
        parameter = next(verifier.parameters())
        return draft.to(parameter.device, parameter.dtype)

    def own_state(self) -> dict[str, Tensor]:
        """The draft's own parameters (fc, the layers, their norm, P or S): what is saved."""
        return {key: value for key, value in self.state_dict().items() if key != "head"}

    def save(self, folder: Path | str, dtype: torch.dtype = torch.bfloat16) -> Path:
        """Write the config (JSON) and the own parameters (``torch.save``, floats in
        ``dtype``; the subset ids stay integers)."""
        from cactus_theory.util.files import atomic_write, atomic_write_json

        folder = Path(folder)
        state = {
            key: value.detach().to("cpu", dtype if value.is_floating_point() else value.dtype)
            for key, value in self.own_state().items()
        }
        atomic_write(folder / WEIGHTS_FILE, lambda path: torch.save(state, path))
        atomic_write_json(folder / CONFIG_FILE, dataclasses.asdict(self.config), indent=2)
        return folder

    @classmethod
    def load(cls, folder: Path | str, verifier) -> FeatureDraft:
        """A saved draft on top of ``verifier`` (its embedding and head), in its dtype."""
        folder = Path(folder)
        try:
            config = FeatureDraftConfig(**json.loads((folder / CONFIG_FILE).read_text()))
            state = torch.load(folder / WEIGHTS_FILE, map_location="cpu", weights_only=True)
        except (OSError, ValueError, TypeError) as error:
            raise ValueError(
                f"draft: cannot load a feature draft from {folder} ({error})"
            ) from None
        draft = cls.build(verifier, config)
        parameter = next(verifier.parameters())
        missing, unexpected = draft.load_state_dict(
            {
                key: value.to(parameter.dtype) if value.is_floating_point() else value
                for key, value in state.items()
            },
            strict=False,
        )
        if unexpected or [key for key in missing if key != "head"]:
            raise ValueError(f"draft: {folder} does not match its config ({missing}, {unexpected})")
        return draft.eval()


def is_feature_draft_folder(path: Path | str) -> bool:
    path = Path(path).expanduser()
    return (path / CONFIG_FILE).is_file() and (path / WEIGHTS_FILE).is_file()
