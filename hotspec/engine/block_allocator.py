"""CPU-side allocator of KV blocks with reference counts (no CUDA: tested on CPU).

A block is free when its count is 0. `allocate` hands out blocks with count 1; `incref` lets a
second owner share a block (prefix sharing, forks); `free` drops one reference per block.
"""

from __future__ import annotations

from collections import deque

from hotspec.errors import HotspecError


class OutOfBlocks(HotspecError):
    """Raised when an allocation asks for more blocks than are free; nothing is allocated."""


class BlockAllocator:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._refs = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfBlocks(
                f"KV cache out of blocks: asked for {n}, {len(self._free)} of {self.num_blocks} "
                "free. Lower the batch size or max_tokens, or give the KV cache more memory.")
        out = [self._free.popleft() for _ in range(n)]
        for b in out:
            self._refs[b] = 1
        return out

    def incref(self, blocks: list[int]) -> None:
        for b in blocks:
            if self._refs[b] == 0:
                raise ValueError(f"block {b} is free; cannot share it")
            self._refs[b] += 1

    def free(self, blocks: list[int]) -> None:
        for b in blocks:
            if self._refs[b] == 0:
                raise ValueError(f"double free of block {b}")
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free.append(b)

    def refcount(self, block: int) -> int:
        return self._refs[block]
