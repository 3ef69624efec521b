"""EAGLE-3 draft head: the public `LlamaForCausalLMEagle3` checkpoints (SafeAILab, SpecForge).

Checkpoint keys: `fc.weight` [H, n*H] (n = number of aux target layers, 3 in public heads; no
bias), `midlayer.self_attn.{q,k,v}_proj.weight` [*, 2H], `midlayer.self_attn.o_proj.weight`,
`midlayer.mlp.{gate,up,down}_proj.weight`, `midlayer.{input_layernorm,hidden_norm,
post_attention_layernorm}.weight`, `norm.weight`; optional `lm_head.weight` [draft_vocab, H] (else
the target's LM head), `d2t` [draft_vocab] (target id = draft id + d2t[draft id]), `t2d`
(accepted, unused) and `embed_tokens.weight` [V, H].

Forward, as SGLang's llama_eagle3.py (its post_attention_layernorm(h, residual) is a fused
"residual := h + residual; h := norm(residual)", and its final norm(h, residual) returns
(norm(h + residual), h + residual)):

    f   = fc(aux features) if width != H else f      (target's n*H aux, or own previous feature)
    x   = cat(input_layernorm(embed(token)), hidden_norm(f))      [T, 2H]
    r   = attn(x) + f
    s   = mlp(post_attention_layernorm(r)) + r
    -> (norm(s), s): norm(s) feeds the LM head, the pre-norm s is the next step's feature.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hotspec.core.forward_batch import ForwardBatch
from hotspec.core.kv_pool import KVPool
from hotspec.layers import fused
from hotspec.layers.attention.base import AttentionBackend
from hotspec.layers.linear import norm_mlp, plain_linear
from hotspec.layers.norm import RMSNorm
from hotspec.layers.rotary import RotaryEmbedding
from hotspec.models.config import ModelConfig
from hotspec.models.draft_head import DraftHead, require_hidden_in
from hotspec.models.llama import MLP, Attention


def eagle3_capture_layers(config: dict[str, Any], num_target_layers: int) -> tuple[int, ...]:
    """Target layers whose INPUT hidden state feeds the head, ascending.

    Convention (SGLang, python/sglang/srt/models/llama.py, LlamaForCausalLM.
    set_eagle3_layers_to_capture, and LlamaModel.forward): the model appends
    `hidden_states + residual` at the top of its loop, i.e. the hidden state ENTERING layer i, for
    each i in `layers_to_capture`. An id k from `eagle_config.eagle_aux_hidden_state_layer_ids`
    means "output of layer k", so SGLang captures at k + 1 ("for the ith layer, it takes the output
    of the (i-1)th layer"). Without that key the default [2, L//2, L-3] is used as capture indices
    directly (no +1). Features are concatenated in layer order (the capture loop runs over
    layers), hence the ascending sort.
    """
    eagle_cfg = config.get("eagle_config") or {}
    ids = eagle_cfg.get("eagle_aux_hidden_state_layer_ids")
    n = num_target_layers
    if ids is None:
        capture = [2, n // 2, n - 3]
        source = f"the default [2, L//2, L-3] for L={n} target layers"
    else:
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise ValueError(f"eagle_config.eagle_aux_hidden_state_layer_ids must be a list of ints, "
                             f"got {ids!r}")
        capture = [i + 1 for i in ids]
        source = f"eagle_config.eagle_aux_hidden_state_layer_ids={ids} (+1: outputs of those layers)"
    if len(capture) < 2 or len(set(capture)) != len(capture) or not all(0 <= i < n for i in capture):
        raise ValueError(
            f"EAGLE-3 aux layers {capture} from {source} are not at least two distinct layers in "
            f"[0, {n}). Fix: set eagle_config.eagle_aux_hidden_state_layer_ids in the draft's "
            f"config.json to distinct target layer ids in [0, {n - 2}].")
    return tuple(sorted(capture))


class Eagle3MidLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)  # on the token embedding
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)  # on the feature
        self.self_attn = Attention(cfg, layer_id=0, in_features=2 * h)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = MLP(h, cfg.intermediate_size)

    def inputs(self, tokens: torch.Tensor, embed: nn.Embedding, feature: torch.Tensor) -> torch.Tensor:
        """[input_layernorm(embed(tokens)) | hidden_norm(feature)] [T, 2H]: one kernel on CUDA
        (layers/norm_pair_kernel.py), else the lookup and each norm written into its half."""
        ln, hn, w = self.input_layernorm, self.hidden_norm, embed.weight
        if fused.enabled(feature, w, ln.weight, hn.weight) and feature.dim() == 2 \
                and feature.stride(1) == 1 \
                and len({w.dtype, feature.dtype, ln.weight.dtype, hn.weight.dtype}) == 1:
            return fused.embed_norm_pair(tokens, w, ln.weight, ln.eps, feature, hn.weight, hn.eps)
        t, h = feature.shape
        x = feature.new_empty((t, 2 * h))
        ln.norm_into(embed(tokens), x[:, :h])
        hn.norm_into(feature, x[:, h:])
        return x

    def forward(self, tokens: torch.Tensor, embed: nn.Embedding, feature: torch.Tensor,
                fb: ForwardBatch, rope: RotaryEmbedding, kv: KVPool, backend: AttentionBackend
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(mlp output m, r) with the pre-norm sum s = m + r left to the caller's final norm, so
        each residual add fuses into the norm after it (one kernel on CUDA, as in the target)."""
        x = self.inputs(tokens, embed, feature)
        a = self.self_attn(x, fb, rope, kv, backend)
        mlp = self.mlp
        if mlp.gate_up_proj is not None:  # fused projections (engine): the norm folds into gate_up
            return norm_mlp(self.post_attention_layernorm, mlp.gate_up_proj, mlp.down_proj, a, feature)
        n, r = self.post_attention_layernorm.add_forward(a, feature)
        return mlp(n), r


class Eagle3Head(DraftHead):
    def __init__(self, cfg: ModelConfig, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor,
                 draft_to_target: torch.Tensor | None, target_vocab_size: int, max_positions: int,
                 aux_layer_ids: tuple[int, ...]) -> None:
        super().__init__(cfg, embed_weight, lm_head_weight, draft_to_target, target_vocab_size,
                         max_positions, aux_layer_ids)
        h = cfg.hidden_size
        self.fc = nn.Linear(len(self.aux_layer_ids) * h, h, bias=False)
        self.midlayer = Eagle3MidLayer(cfg)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)

    def forward(self, fb: ForwardBatch, kv: KVPool, backend: AttentionBackend
                ) -> tuple[torch.Tensor, torch.Tensor]:
        feature = require_hidden_in(fb).to(self.fc.weight.dtype)
        # Width tells the two inputs apart (n >= 2 aux layers, so n*H != H): the target's
        # concatenated aux states go through fc, the head's own previous feature does not.
        if feature.shape[-1] != self.hidden_size:
            feature = plain_linear(self.fc, feature)
        m, r = self.midlayer(fb.input_ids, self.embed_tokens, feature, fb, self.rotary, kv, backend)
        return self.norm.add_forward(m, r)  # (norm(s), s) with s = m + r
