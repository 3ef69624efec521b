"""Reference attention in plain torch: gathers each request's KV from its block table and runs
SDPA with an explicit boolean mask. Runs on CPU and GPU; the oracle every kernel is tested against."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hotspec.core.forward_batch import ForwardBatch
from hotspec.layers.attention.base import AttentionBackend, RopeFold


@dataclass
class _Plan:
    kv_slots: torch.Tensor  # [B, max_kv] slot of each visible kv index (0 where invalid)
    mask: torch.Tensor  # [B, 1, Q, max_kv] bool
    q_index: torch.Tensor | None  # ragged: [T] flat position inside the padded [B * Q] layout
    q_width: int


def build_mask(q_lens: torch.Tensor, kv_lens: torch.Tensor, width: int, max_kv: int,
               custom_mask: torch.Tensor | None) -> torch.Tensor:
    """[B, width, max_kv] visibility, following the rules in forward_batch.py."""
    dev = kv_lens.device
    qi = torch.arange(width, device=dev).view(1, -1, 1)
    kj = torch.arange(max_kv, device=dev).view(1, 1, -1)
    kv = kv_lens.view(-1, 1, 1)
    if custom_mask is None:
        visible = kj <= kv - q_lens.view(-1, 1, 1) + qi
    else:
        m = custom_mask.shape[-1]
        start = kv - m
        rel = (kj - start).clamp(0, m - 1).expand(custom_mask.shape[0], width, max_kv)
        tree = torch.gather(custom_mask, 2, rel)
        visible = (kj < start) | tree
    visible = visible & (kj < kv)
    # Padding queries see kv index 0 only, so softmax stays finite; their outputs are unused.
    pad = qi >= q_lens.view(-1, 1, 1)
    return torch.where(pad, kj == 0, visible)


class TorchRefBackend(AttentionBackend):
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size

    def plan(self, fb: ForwardBatch) -> None:
        bs = self.block_size
        dev = fb.kv_lens.device
        idx = torch.arange(fb.max_kv, device=dev)
        blocks = torch.gather(fb.block_tables.long(), 1,
                              (idx // bs).view(1, -1).expand(fb.batch_size, -1))
        slots = blocks * bs + idx % bs
        slots = torch.where(idx.view(1, -1) < fb.kv_lens.view(-1, 1), slots, 0)
        width = fb.width if fb.width is not None else fb.max_q
        mask = build_mask(fb.q_lens, fb.kv_lens, width, fb.max_kv, fb.custom_mask)
        q_index = None
        if fb.width is None:
            assert fb.cu_seqlens_q is not None
            req = torch.repeat_interleave(torch.arange(fb.batch_size, device=dev), fb.q_lens,
                                          output_size=fb.num_tokens)
            q_index = req * width + torch.arange(fb.num_tokens, device=dev) - fb.cu_seqlens_q[req]
        fb.attn_meta = _Plan(slots, mask.unsqueeze(1), q_index, width)

    def forward(self, fb: ForwardBatch, q: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, scale: float, *, rope: RopeFold | None = None,
                before_resident: bool = False) -> torch.Tensor:
        if rope is not None:
            raise ValueError("the torch reference backend does not fold RoPE (folds_rope is False)")
        p: _Plan = fb.attn_meta
        b, w = fb.batch_size, p.q_width
        t, hq, d = q.shape
        if p.q_index is None:
            qp = q.view(b, w, hq, d)
        else:
            qp = q.new_zeros(b * w, hq, d).index_copy_(0, p.q_index, q).view(b, w, hq, d)
        group = hq // k_cache.shape[1]
        k = k_cache[p.kv_slots].to(q.dtype).repeat_interleave(group, dim=2)  # [B, max_kv, Hq, D]
        v = v_cache[p.kv_slots].to(q.dtype).repeat_interleave(group, dim=2)
        out = F.scaled_dot_product_attention(qp.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=p.mask, scale=scale)
        out = out.transpose(1, 2).reshape(b * w, hq, d)
        return out if p.q_index is None else out[p.q_index]
