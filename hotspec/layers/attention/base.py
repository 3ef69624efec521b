"""Attention backends over the paged KV cache.

A backend plans once per forward (building whatever index/mask tensors the phase needs from the
ForwardBatch) and then serves every layer from that plan. Graph hooks let the graph runner plan
into static buffers before capture and refresh them before each replay.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch

from hotspec.core.forward_batch import ForwardBatch


@dataclass(frozen=True)
class RopeFold:
    """What fused_kernels.rope_store would take, for a backend that folds RoPE and the KV store
    into attention (`AttentionBackend.folds_rope`): the step's unrotated k and v [T, Hkv, D],
    positions and cache slots [T], cos / sin [max_pos, D/2] (float32)."""
    k: torch.Tensor
    v: torch.Tensor
    positions: torch.Tensor
    loc: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor


class AttentionBackend(abc.ABC):
    block_size: int

    @abc.abstractmethod
    def plan(self, fb: ForwardBatch) -> None:
        """Build per-forward metadata into `fb.attn_meta`."""

    @abc.abstractmethod
    def forward(self, fb: ForwardBatch, q: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, scale: float, *, rope: RopeFold | None = None,
                before_resident: bool = False) -> torch.Tensor:
        """q: [T, Hq, D]; caches: [num_slots + 1, Hkv, D] (new K/V already stored). -> [T, Hq, D]
        With `rope` (only where `folds_rope`), q is unrotated and the new K/V not yet stored:
        the backend does both. `before_resident`: the kernel that reads the output is the resident
        GEMV (layers/pdl.chained says what a backend does with that); it never changes values."""

    def folds_rope(self, fb: ForwardBatch, q: torch.Tensor, k: torch.Tensor) -> bool:
        """Whether `forward(..., rope=...)` takes RoPE and the KV store for this batch (q
        [T, Hq, D], the step's k [T, Hkv, D]; no, unless a backend says so)."""
        return False


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor) -> None:
    """Write this step's K/V at their slots; padding rows target the trash slot (the last row)."""
    k_cache.index_copy_(0, loc, k.to(k_cache.dtype))
    v_cache.index_copy_(0, loc, v.to(v_cache.dtype))
