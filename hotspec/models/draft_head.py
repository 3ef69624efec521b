"""DraftHead: what every EAGLE draft head shares (embedding, LM head, draft->target id map, rotary).

Invariants:
  * `lm_head.out_features` is the draft vocabulary size, the single source of truth: logits,
    `draft_to_target` and anything sized per draft token follow it (never a config key).
  * `draft_to_target[d]` is the target token id of draft id d; None means the identity (the draft
    vocabulary is the target vocabulary, row d of the LM head is target token d).
  * The head owns a 1-layer KV pool; its attention is `layer_id=0` there. Slots are shared with the
    target's pool (same block table), see forward_batch.py.
  * `aux_layer_ids` are target layers whose INPUT hidden state the target must capture for this
    head (LlamaForCausalLM.capture_layers); empty means the head takes the target's final normed
    hidden state (EAGLE-1/2).
"""

from __future__ import annotations

import abc

import torch
from torch import nn

from hotspec.core.forward_batch import ForwardBatch
from hotspec.core.kv_pool import KVPool
from hotspec.layers.attention.base import AttentionBackend
from hotspec.layers.linear import plain_linear
from hotspec.layers.rotary import RotaryEmbedding
from hotspec.models.config import ModelConfig
from hotspec.models.llama import MLP, Attention


class DraftHead(nn.Module, abc.ABC):
    lm_head: nn.Linear
    draft_to_target: torch.Tensor | None

    def __init__(self, cfg: ModelConfig, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor,
                 draft_to_target: torch.Tensor | None, target_vocab_size: int,
                 max_positions: int, aux_layer_ids: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.config = cfg
        self.hidden_size = cfg.hidden_size
        self.target_vocab_size = target_vocab_size
        self.aux_layer_ids: tuple[int, ...] = tuple(aux_layer_ids)
        # Shared with the target (or the checkpoint's own copy); never trained here.
        self.embed_tokens = nn.Embedding.from_pretrained(embed_weight, freeze=True)
        # Positions run as far as the target's context: the head drafts at the target's positions.
        self.max_positions = max_positions
        self.build_rotary(None)
        self.register_buffer("draft_to_target", None, persistent=False)
        self.set_lm_head(lm_head_weight, draft_to_target)

    def build_rotary(self, device: torch.device | str | None) -> None:
        """(Re)build the cos/sin table, e.g. on the real device after building on `meta`."""
        cfg = self.config
        rope = RotaryEmbedding(cfg.head_dim, self.max_positions, cfg.rope_theta, cfg.rope_scaling)
        self.rotary = rope if device is None else rope.to(device)

    @property
    def draft_vocab_size(self) -> int:
        return self.lm_head.out_features

    @property
    def target_feature_size(self) -> int:
        """Width of `fb.hidden_in` on the first draft step (what the target hands over)."""
        return self.hidden_size * max(1, len(self.aux_layer_ids))

    def set_lm_head(self, weight: torch.Tensor, draft_to_target: torch.Tensor | None) -> None:
        """Replace the LM head by a fresh Linear whose rows are `weight` (e.g. an FR-Spec slice).

        `draft_to_target` must have one target id per row, or be None when the rows are the whole
        target vocabulary in order.
        """
        if weight.dim() != 2 or weight.shape[1] != self.hidden_size or weight.shape[0] == 0:
            raise ValueError(f"LM head weight must be [rows >= 1, {self.hidden_size}], got "
                             f"{tuple(weight.shape)}")
        rows = weight.shape[0]
        if draft_to_target is None:
            if rows != self.target_vocab_size:
                raise ValueError(f"an LM head of {rows} rows needs a draft_to_target map (the target "
                                 f"vocabulary has {self.target_vocab_size} tokens)")
        else:
            if draft_to_target.shape != (rows,) or draft_to_target.dtype != torch.long:
                raise ValueError(f"draft_to_target must be a LongTensor of shape ({rows},), got "
                                 f"{draft_to_target.dtype} {tuple(draft_to_target.shape)}")
            lo, hi = int(draft_to_target.min()), int(draft_to_target.max())
            if lo < 0 or hi >= self.target_vocab_size:
                raise ValueError(f"draft_to_target maps into [{lo}, {hi}], outside the target "
                                 f"vocabulary [0, {self.target_vocab_size})")
            draft_to_target = draft_to_target.to(weight.device)
        head = nn.Linear(self.hidden_size, rows, bias=False, device="meta")
        head.weight = nn.Parameter(weight, requires_grad=False)
        self.lm_head = head
        self.draft_to_target = draft_to_target

    def fuse_projections(self) -> None:
        """One GEMM for q/k/v and one for gate/up in every layer, for inference (the engine calls
        it after loading; a fused head no longer has the checkpoint's parameter names, so heads
        that are trained or saved stay unfused)."""
        for m in self.modules():
            if isinstance(m, (Attention, MLP)):
                m.fuse_projections()

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T, H] -> float32 [T, draft_vocab_size]; map ids with `draft_to_target`."""
        return self.draft_logits(hidden).float()

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """compute_logits in the head's dtype (the draft loop's top-k reads them as they are)."""
        return plain_linear(self.lm_head, hidden)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """The one place a draft-vocabulary index becomes a target token id (FR-Spec hot ids,
        EAGLE-3 d2t, or the identity)."""
        return draft_ids if self.draft_to_target is None else self.draft_to_target[draft_ids]

    def make_kv_pool(self, num_blocks: int, block_size: int, dtype: torch.dtype,
                     device: torch.device | str) -> KVPool:
        """The head's own 1-layer pool, slot-compatible with the target's."""
        return KVPool(1, num_blocks, block_size, self.config.num_key_value_heads,
                      self.config.head_dim, dtype, device)

    @abc.abstractmethod
    def forward(self, fb: ForwardBatch, kv: KVPool, backend: AttentionBackend
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden for compute_logits [T, H], feature for the next draft step [T, H]).

        `fb.hidden_in` is [T, target_feature_size] (target feature) or [T, H] (own feature)."""


def require_hidden_in(fb: ForwardBatch) -> torch.Tensor:
    if fb.hidden_in is None:
        raise ValueError("a draft head needs fb.hidden_in (the target feature or its own previous "
                         "feature); the ForwardBatch has none")
    return fb.hidden_in
