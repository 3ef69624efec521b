"""CPU-side allocator of KV blocks with reference counts (no CUDA: tested on CPU).

A block is free when its count is 0. `allocate` hands out blocks with count 1; `incref` lets a
second owner share a block (prefix sharing, forks); `free` drops one reference per block.
"""

from __future__ import annotations

from collections import Counter, deque

from hotspec.errors import HotspecError


class OutOfBlocks(HotspecError):
    """Raised when an allocation asks for more blocks than are free; nothing is allocated."""


class BlockAllocator:
    """Hands out block ids first_block .. first_block + num_blocks - 1. The engine starts at 1:
    block 0 is the null block that padding rows of fixed-shape phases write into."""

    def __init__(self, num_blocks: int, first_block: int = 0) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.first_block = first_block
        self._free: deque[int] = deque(range(first_block, first_block + num_blocks))
        self._refs = [0] * (first_block + num_blocks)

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
        """Add one owner to each block; all-or-nothing (an error changes no count)."""
        self._check_ids(blocks)
        for b in blocks:
            if self._refs[b] == 0:
                raise ValueError(f"block {b} is free; cannot share it")
        for b in blocks:
            self._refs[b] += 1

    def free(self, blocks: list[int]) -> None:
        """Drop one reference per listed block; all-or-nothing (an error changes no count)."""
        self._check_ids(blocks)
        for b, n in Counter(blocks).items():
            if self._refs[b] < n:
                raise ValueError(f"double free of block {b}")
        for b in blocks:
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free.append(b)

    def _check_ids(self, blocks: list[int]) -> None:
        for b in blocks:
            if not self.first_block <= b < self.first_block + self.num_blocks:
                raise ValueError(f"block {b} is not in this pool "
                                 f"({self.first_block}..{self.first_block + self.num_blocks - 1})")

    def refcount(self, block: int) -> int:
        return self._refs[block]
