"""Llama-family decoder (Llama 2/3, Mistral, Qwen2/2.5, Qwen3, SmolLM2), driven by ModelConfig.

Parameter names are Hugging Face's, so a checkpoint's state dict loads with `assign=True` onto a
model built on the meta device. Differences between families are config flags: `attention_bias`
(Qwen2 q/k/v bias), `qk_norm` (Qwen3 per-head RMSNorm on q and k), `tie_word_embeddings`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from hotspec.core.forward_batch import ForwardBatch
from hotspec.core.kv_pool import KVPool
from hotspec.layers import fused
from hotspec.layers.attention.base import AttentionBackend, RopeFold, store_kv
from hotspec.layers.linear import linear, merge_linears, norm_linear, norm_mlp, plain_linear, silu_mul_linear
from hotspec.layers.norm import RMSNorm
from hotspec.layers.rotary import RotaryEmbedding
from hotspec.models.config import ModelConfig


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, in_features: int | None = None) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, d)
        inp = in_features or h
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(inp, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(inp, self.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(inp, self.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.scale = d ** -0.5
        self.qkv_proj: nn.Linear | None = None  # set by fuse_projections()

    def fuse_projections(self) -> None:
        """Replace q/k/v_proj by one qkv_proj (one GEMM instead of three); after loading."""
        if self.qkv_proj is not None:
            return
        self.qkv_proj = merge_linears(self.q_proj, self.k_proj, self.v_proj)
        del self.q_proj, self.k_proj, self.v_proj

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of x [..., in] as [..., heads, head_dim], through the fused projection or not
        (the engine and the trainer both project here)."""
        if self.qkv_proj is not None:
            return self.split_qkv(linear(self.qkv_proj, x))
        d, lead = self.head_dim, x.shape[:-1]
        q, k, v = (plain_linear(self.q_proj, x), plain_linear(self.k_proj, x),
                   plain_linear(self.v_proj, x))
        return (q.view(*lead, self.num_heads, d), k.view(*lead, self.num_kv_heads, d),
                v.view(*lead, self.num_kv_heads, d))

    def split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """qkv_proj's output [..., (heads + 2 kv heads) * head_dim] as q, k, v [..., heads, d]."""
        d, lead = self.head_dim, qkv.shape[:-1]
        q, k, v = qkv.split((self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * d), -1)
        return (q.view(*lead, self.num_heads, d), k.view(*lead, self.num_kv_heads, d),
                v.view(*lead, self.num_kv_heads, d))

    def forward(self, x: torch.Tensor, fb: ForwardBatch, rope: RotaryEmbedding, kv: KVPool,
                backend: AttentionBackend) -> torch.Tensor:
        return self.attend(*self.qkv(x), fb, rope, kv, backend)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch,
               rope: RotaryEmbedding, kv: KVPool, backend: AttentionBackend) -> torch.Tensor:
        """Everything after the projection: q/k norms, RoPE, the KV store, attention, o_proj."""
        t = q.shape[0]
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        k_cache, v_cache = kv.k[self.layer_id], kv.v[self.layer_id]
        fold = None
        # (the KV pool is always in the model's dtype; another cache dtype takes the torch path)
        if fused.enabled(q) and k_cache.dtype == q.dtype:
            if backend.folds_rope(fb, q, k):  # the attention kernel rotates and stores itself
                fold = RopeFold(k, v, fb.positions, fb.out_cache_loc, rope.cos, rope.sin)
            else:
                q = fused.rope_store(q, k, v, fb.positions, rope.cos, rope.sin, k_cache, v_cache,
                                     fb.out_cache_loc)
        else:
            q, k = rope(fb.positions, q, k)
            store_kv(k_cache, v_cache, fb.out_cache_loc, k, v)
        o = backend.forward(fb, q, k_cache, v_cache, self.scale, rope=fold,
                            before_resident=fused.gemv_resident(q, t, self.o_proj))
        return linear(self.o_proj, o.reshape(t, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.gate_up_proj: nn.Linear | None = None  # set by fuse_projections()

    def fuse_projections(self) -> None:
        """Replace gate/up_proj by one gate_up_proj (one GEMM instead of two); after loading."""
        if self.gate_up_proj is not None:
            return
        self.gate_up_proj = merge_linears(self.gate_proj, self.up_proj)
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is None:
            return plain_linear(self.down_proj, F.silu(plain_linear(self.gate_proj, x))
                                * plain_linear(self.up_proj, x))
        return silu_mul_linear(self.down_proj, linear(self.gate_up_proj, x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_id)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, h: torch.Tensor, residual: torch.Tensor | None, fb: ForwardBatch,
                rope: RotaryEmbedding, kv: KVPool, backend: AttentionBackend
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream is carried as (h, residual) with stream = h + residual, so each
        residual add fuses into the norm after it (residual None: h is the whole stream)."""
        attn, mlp = self.self_attn, self.mlp
        if attn.qkv_proj is not None and mlp.gate_up_proj is not None:  # fused projections (engine)
            # each norm and the projection after it: one kernel where layers/linear allows it
            qkv, residual = norm_linear(self.input_layernorm, attn.qkv_proj, h, residual)
            x = attn.attend(*attn.split_qkv(qkv), fb, rope, kv, backend)
            return norm_mlp(self.post_attention_layernorm, mlp.gate_up_proj, mlp.down_proj, x, residual)
        if residual is None:
            residual, x = h, self.input_layernorm(h)
        else:
            x, residual = self.input_layernorm.add_forward(h, residual)
        x = self.self_attn(x, fb, rope, kv, backend)
        x, residual = self.post_attention_layernorm.add_forward(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """forward() returns final normed hidden states [T, H] and, for EAGLE-3, the hidden states
    entering each layer listed in `capture_layers` (SGLang's aux hidden states)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                                      cfg.rope_scaling)
        self.capture_layers: tuple[int, ...] = ()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def fuse_projections(self) -> None:
        """One GEMM for q/k/v and one for gate/up in every layer (call once, after loading)."""
        for layer in cast("Iterable[DecoderLayer]", self.model.layers):
            layer.self_attn.fuse_projections()
            layer.mlp.fuse_projections()

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights under Hugging Face's names (`model.layers.{i}.self_attn.q_proj.weight`, ...),
        fused or not: a fused qkv_proj / gate_up_proj is split back into q/k/v_proj and
        gate/up_proj (row views, no copies); the rotary tables (buffers, not weights) are left
        out. The one place that maps the engine's target back to a transformers state dict."""
        out: dict[str, torch.Tensor] = {}
        for name, t in self.state_dict().items():
            if name.startswith("rotary."):
                continue
            prefix, _, leaf = name.rpartition(".")  # leaf: weight / bias
            if prefix.endswith(".self_attn.qkv_proj"):
                attn = prefix.removesuffix(".qkv_proj")
                nq = self.config.num_attention_heads * self.config.head_dim
                nkv = self.config.num_key_value_heads * self.config.head_dim
                q, k, v = t.split((nq, nkv, nkv), dim=0)
                out.update({f"{attn}.q_proj.{leaf}": q, f"{attn}.k_proj.{leaf}": k,
                            f"{attn}.v_proj.{leaf}": v})
            elif prefix.endswith(".mlp.gate_up_proj"):
                mlp = prefix.removesuffix(".gate_up_proj")
                gate, up = t.split(self.config.intermediate_size, dim=0)
                out.update({f"{mlp}.gate_proj.{leaf}": gate, f"{mlp}.up_proj.{leaf}": up})
            else:
                out[name] = t
        return out

    def forward(self, fb: ForwardBatch, kv: KVPool, backend: AttentionBackend
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        h = self.model.embed_tokens(fb.input_ids)
        residual: torch.Tensor | None = None
        aux: list[torch.Tensor] = []
        for i, layer in enumerate(self.model.layers):
            if i in self.capture_layers:
                aux.append(h if residual is None else h + residual)
            h, residual = layer(h, residual, fb, self.rotary, kv, backend)
        assert residual is not None, "a model has at least one layer"
        return self.model.norm.add_forward(h, residual)[0], aux

    def compute_logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """The LM head's logits, in float32 (the samplers' dtype) or, with float32=False, in the
        model's dtype (for an argmax: widening changes no order, and saves a copy per step)."""
        # table rows only: the LM head was never measured against cuBLAS
        logits = linear(self.lm_head, hidden, heuristic=False)
        return logits.float() if float32 else logits
