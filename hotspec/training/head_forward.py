"""Differentiable forward of a draft head over [B, T] training sequences, with no paged KV cache,
unrolled K steps (training-time test, TTT). The maths is the heads' own inference forward
(models/eagle.py, models/eagle3.py), run through the same submodules.

Indexing (root-indexed, as SpecForge's OnlineEagle3Model): a record is t_0..t_{L-1} with target
features f_0..f_{L-1}. Index j of step k is depth k of the draft chain rooted at j, i.e. what the
engine computes when the target's last committed position is j:

    step 0:  input (t_{j+1}, f_j)                 at RoPE position j
    step k:  input (t_{j+k+1}, out_{k-1}[j])      at RoPE position j + k
             predicts t_{j+k+2}; its label is the target's distribution at position j+k+1

In the position view this is: the step-k input at position p is the head's own output of step
k-1 at position p-1 (prefill shifts tokens by one, deeper drafts feed the head's feature back).
Tokens are the record's (teacher forcing); features after step 0 are the head's own, and
gradients flow through them across steps.

Attention of query (j, k) sees the step-0 keys at indices 0..j (causal) and the keys of steps
1..k at the same index j. That is exactly the engine's view: the draft KV cache holds step-0
entries for every committed position up to the root j (prefill and draft_extend write them),
and a chain's deeper drafts see their own scratch slots (speculative/phases.py, draft_tree). The
EAGLE-3 reference code (SafeAILab/EAGLE traineagle3/cnets.py, copied into SpecForge core/eagle3.py) also
hides the last k step-0 keys from step k (its shifted `attention_mask[:, :, ind0, ind1]`, questioned
in SafeAILab/EAGLE#247); hotspec's draft phase does see them, so this trainer does too, and
tests/test_train_draft.py checks training logits against the engine's for every step.

Padding needs no key mask: a valid query (j + k + 1 < L) only sees keys at indices <= j, which
all belong to the record; padded queries are dropped by the loss.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from hotspec.layers.rotary import RotaryEmbedding
from hotspec.models.draft_head import DraftHead
from hotspec.models.eagle import EagleHead, EagleLayer
from hotspec.models.eagle3 import Eagle3Head
from hotspec.models.llama import Attention

Cache = list[tuple[torch.Tensor, torch.Tensor]]  # per step: (keys, values) [B, Hkv, T, D]


def unroll(head: DraftHead, tokens: torch.Tensor, features: torch.Tensor,
           steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per step k: (hidden for head.compute_logits [B, T, H], feature [B, T, H]).

    `tokens` [B, T] is the record (t_0..), `features` [B, T, F] the target features f_0.."""
    b, t = tokens.shape
    cache: Cache = []
    feature = features
    outs: list[tuple[torch.Tensor, torch.Tensor]] = []
    base = torch.arange(t, device=tokens.device)
    for k in range(steps):
        # Padded queries past the table are clamped; only the loss-masked tail reaches there.
        positions = (base + k).clamp(max=head.max_positions - 1)
        hidden, feature = head_step(head, shift_left(tokens, k + 1), feature, positions, cache)
        outs.append((hidden, feature))
    return outs


def head_step(head: DraftHead, tokens: torch.Tensor, feature: torch.Tensor, positions: torch.Tensor,
              cache: Cache) -> tuple[torch.Tensor, torch.Tensor]:
    """One head forward over [B, T]; appends this step's keys/values to `cache`."""
    if isinstance(head, Eagle3Head):
        feature = feature.to(head.fc.weight.dtype)
        if feature.shape[-1] != head.hidden_size:  # the target's aux features, not its own
            feature = head.fc(feature)
        m = head.midlayer
        x = torch.cat((m.input_layernorm(head.embed_tokens(tokens)), m.hidden_norm(feature)), dim=-1)
        r = attention(m.self_attn, x, positions, head.rotary, cache) + feature
        s = m.mlp(m.post_attention_layernorm(r)) + r
        return head.norm(s), s
    if isinstance(head, EagleHead):
        layer = cast(EagleLayer, head.layers[0])
        x = head.fc(torch.cat((head.embed_tokens(tokens), feature.to(head.fc.weight.dtype)), dim=-1))
        h = x + attention(layer.self_attn, x, positions, head.rotary, cache)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        return h, h
    raise TypeError(f"no training forward for {type(head).__name__}")


def attention(attn: Attention, x: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding,
              cache: Cache) -> torch.Tensor:
    """Self-attention of step len(cache): causal over step 0's keys, plus each later step's key at
    the query's own index (see the module docstring)."""
    b, t, _ = x.shape
    hq, hk, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q, k, v = attn.qkv(x)  # [b, t, heads, d]
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = rope(positions.repeat(b), q.reshape(b * t, hq, d), k.reshape(b * t, hk, d))
    q = q.view(b, t, hq, d).transpose(1, 2)
    cache.append((k.view(b, t, hk, d).transpose(1, 2), v.transpose(1, 2)))
    out = ttt_attention(q, cache, attn.scale)
    return attn.o_proj(out.transpose(1, 2).reshape(b, t, hq * d))


def ttt_attention(q: torch.Tensor, cache: Cache, scale: float) -> torch.Tensor:
    """Attention of the TTT mask (`ttt_mask`) without building it: one softmax over the T causal
    scores against step 0's keys and the len(cache) - 1 scores against each later step's key at
    the query's own index. q [B, Hq, T, D], cache entries [B, Hkv, T, D]; returns [B, Hq, T, D].

    Exact, and T x (T + k) scores instead of the dense mask's T x kT: at TTT 7 the dense
    scaled_dot_product_attention (a bool mask, so no flash kernel) computed and stored 4x more on
    average, nearly all of it masked out. Under autograd the scores are recomputed in backward
    (activation checkpointing) rather than kept: kept for every unrolled step they are the
    trainer's largest tensors by far (7 x B x Hq x T^2 in float32 and bf16; at B 32, T 2048 and
    Qwen2.5's 14 heads, over 100 GB)."""
    if torch.is_grad_enabled() and (q.requires_grad or any(x.requires_grad for kv in cache for x in kv)):
        # (a copy of the list: the caller appends the next steps to it before backward)
        return cast(torch.Tensor, checkpoint(_ttt_attention, q, list(cache), scale, use_reentrant=False))
    return _ttt_attention(q, cache, scale)


def _ttt_attention(q: torch.Tensor, cache: Cache, scale: float) -> torch.Tensor:
    b, hq, t, d = q.shape
    hk = cache[0][0].shape[1]
    group = hq // hk  # GQA: query head h reads kv head h // group (as the torch reference backend)
    qg = q.reshape(b, hk, group * t, d)  # rows (group g, index i) of kv head h
    k0, v0 = (x.to(q.dtype) for x in cache[0])
    scores = torch.matmul(qg, k0.transpose(-1, -2)).view(b, hq, t, t) * scale
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    # Later steps' keys/values broadcast over the `group` query heads of their kv head (no copies).
    q5 = q.view(b, hk, group, t, d)
    later = [(k.to(q.dtype).unsqueeze(2), v.to(q.dtype).unsqueeze(2)) for k, v in cache[1:]]
    diag = [(q5 * k).sum(-1, keepdim=True).view(b, hq, t, 1) * scale for k, _ in later]
    acc = torch.promote_types(q.dtype, torch.float32)  # the softmax in float32 at least
    probs = torch.softmax(torch.cat([scores, *diag], dim=-1).to(acc), dim=-1).to(q.dtype)
    out = torch.matmul(probs[..., :t].reshape(b, hk, group * t, t), v0).view(b, hk, group, t, d)
    for s, (_, v) in enumerate(later):
        out = out + probs[..., t + s:t + s + 1].view(b, hk, group, t, 1) * v
    return out.view(b, hq, t, d)


def dense_ttt_attention(q: torch.Tensor, cache: Cache, scale: float) -> torch.Tensor:
    """The same attention through scaled_dot_product_attention and the dense mask (the reference
    tests compare `ttt_attention` against)."""
    group = q.shape[1] // cache[0][0].shape[1]
    keys = torch.cat([c[0] for c in cache], dim=2).repeat_interleave(group, dim=1)
    values = torch.cat([c[1] for c in cache], dim=2).repeat_interleave(group, dim=1)
    mask = ttt_mask(q.shape[2], len(cache), q.device)
    return F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask,
                                          scale=scale)


def ttt_mask(t: int, n_steps: int, device: torch.device) -> torch.Tensor:
    """[T, T * n_steps] bool: block 0 causal (key index <= query index), blocks 1.. diagonal."""
    idx = torch.arange(t, device=device)
    causal = idx.view(1, -1) <= idx.view(-1, 1)
    eye = idx.view(1, -1) == idx.view(-1, 1)
    return torch.cat([causal] + [eye] * (n_steps - 1), dim=1)


def shift_left(x: torch.Tensor, n: int) -> torch.Tensor:
    """x[:, n:] padded with zeros to x's length: index j holds element j + n."""
    return torch.cat((x[:, n:], torch.zeros_like(x[:, :n])), dim=1)  # lengths T-n and n (or 0, T)
