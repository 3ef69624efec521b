"""Attention backends over the paged KV cache.

A backend plans once per forward (building whatever index/mask tensors the phase needs from the
ForwardBatch) and then serves every layer from that plan. Graph hooks let the graph runner plan
into static buffers before capture and refresh them before each replay.
"""

from __future__ import annotations

import abc

import torch

from hotspec.runtime.forward_batch import ForwardBatch


class AttentionBackend(abc.ABC):
    block_size: int

    @abc.abstractmethod
    def plan(self, fb: ForwardBatch) -> None:
        """Build per-forward metadata into `fb.attn_meta`."""

    @abc.abstractmethod
    def forward(self, fb: ForwardBatch, q: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, scale: float) -> torch.Tensor:
        """q: [T, Hq, D]; caches: [num_slots + 1, Hkv, D] (new K/V already stored). -> [T, Hq, D]"""


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor) -> None:
    """Write this step's K/V at their slots; padding rows target the trash slot (the last row)."""
    k_cache.index_copy_(0, loc, k.to(k_cache.dtype))
    v_cache.index_copy_(0, loc, v.to(v_cache.dtype))
