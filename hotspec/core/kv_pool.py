"""KV pool: per-layer K and V storage of `num_blocks * block_size` slots plus one trash slot.

Slot s of layer l holds one token's K/V for whichever request's block table maps to it. The last
row (index `trash_slot`) absorbs writes from padding rows, so fixed-shape phases never branch.
"""

from __future__ import annotations

import torch


class KVPool:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_slots = num_blocks * block_size
        self.trash_slot = self.num_slots
        shape = (num_layers, self.num_slots + 1, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @staticmethod
    def bytes_per_slot(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def move_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy K/V of slots `src` to slots `dst` in every layer (one gather/scatter per tensor)."""
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]
