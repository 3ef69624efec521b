"""EAGLE-1/2 draft head: the public `LlamaForCausalLMEagle` checkpoints (SafeAILab, SGLang).

Checkpoint keys (no `model.` prefix): `fc.weight` [H, 2H] (+ `fc.bias` unless config "bias" is
false), `layers.0.self_attn.{q,k,v,o}_proj.weight`, `layers.0.mlp.{gate,up,down}_proj.weight`,
`layers.0.post_attention_layernorm.weight`; optionally `embed_tokens.weight` [V, H]. There is no
input layernorm in layer 0 (EAGLE's cnets.py skips it) and no final norm.

    x = fc(cat(embed(token), f))           f: the target's final normed hidden state, or the
    h = x + attn(x)                           head's own previous output when drafting deeper
    h = h + mlp(post_attention_layernorm(h))
    -> (h, h): h feeds the target's LM head and is the next step's feature.
"""

from __future__ import annotations

import torch
from torch import nn

from hotspec.core.forward_batch import ForwardBatch
from hotspec.core.kv_pool import KVPool
from hotspec.layers.attention.base import AttentionBackend
from hotspec.layers.linear import plain_linear
from hotspec.layers.norm import RMSNorm
from hotspec.layers.rotary import RotaryEmbedding
from hotspec.models.config import ModelConfig
from hotspec.models.draft_head import DraftHead, require_hidden_in
from hotspec.models.llama import MLP, Attention


class EagleLayer(nn.Module):
    """A Llama decoder layer without input_layernorm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_id=0)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, fb: ForwardBatch, rope: RotaryEmbedding, kv: KVPool,
                backend: AttentionBackend) -> torch.Tensor:
        normed, h = self.post_attention_layernorm.add_forward(self.self_attn(x, fb, rope, kv, backend), x)
        return h + self.mlp(normed)  # the add fused into the norm: one kernel on CUDA


class EagleHead(DraftHead):
    def __init__(self, cfg: ModelConfig, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor,
                 target_vocab_size: int, max_positions: int, fc_bias: bool = True) -> None:
        super().__init__(cfg, embed_weight, lm_head_weight, None, target_vocab_size, max_positions)
        h = cfg.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=fc_bias)
        self.layers = nn.ModuleList([EagleLayer(cfg)])

    def forward(self, fb: ForwardBatch, kv: KVPool, backend: AttentionBackend
                ) -> tuple[torch.Tensor, torch.Tensor]:
        feature = require_hidden_in(fb)
        # Order matters: [token embedding, feature], as in EAGLE's cnets.py and SGLang.
        x = plain_linear(self.fc, torch.cat(
            (self.embed_tokens(fb.input_ids), feature.to(self.fc.weight.dtype)), dim=-1))
        h = self.layers[0](x, fb, self.rotary, kv, backend)
        return h, h
