"""Prompt KV shared between live requests: a request admitted with the same prompt prefix as one
already prefilled reuses that request's full KV blocks (a reference each, block_allocator.py)
and prefills only the rest: the n answers of one prompt (`n > 1`), or requests that open with
the same system prompt, compute the shared part once.

A block is shared only as whole, computed prompt positions, identified by the hash of every
prompt token up to its end and the token after it: the draft head's KV at a position reads the
next token too, so both caches hold exactly what the new request would compute. At least the
prompt's last token is always prefilled by the request itself (it samples its first token
there). Shared blocks are never written: every step writes at or past a request's length.
"""

from __future__ import annotations

import hashlib

import numpy as np

from hotspec.core.request import Request
from hotspec.engine.block_allocator import BlockAllocator


class SharedPrefixes:
    def __init__(self, allocator: BlockAllocator, block_size: int) -> None:
        self.allocator, self.block_size = allocator, block_size
        self._block: dict[bytes, int] = {}  # key -> block holding those positions
        self._key: dict[int, bytes] = {}  # block -> its key
        self.shared_blocks = 0  # blocks reused so far (a metric)
        self._first: dict[Request, bytes] = {}  # admitted, first block not yet registered

    def _keys(self, prompt: list[int], n: int) -> list[bytes]:
        """The keys of the prompt's first `n` blocks."""
        keys, h, bs = [], b"", self.block_size
        raw = np.asarray(prompt[:n * bs + 1], dtype="<u4").tobytes()  # 4 bytes a token
        for i in range(n):  # the block's tokens and the one after
            h = hashlib.blake2b(h + raw[i * bs * 4:((i + 1) * bs + 1) * 4], digest_size=16).digest()
            keys.append(h)
        return keys

    def _shareable(self, req: Request, computed: int) -> int:
        """Full blocks of `req`'s prompt whose positions are computed and followed by a prompt
        token (so at most len(prompt) - 1 positions)."""
        return min(computed, len(req.prompt_token_ids) - 1) // self.block_size

    def lookup(self, req: Request) -> list[int]:
        """The longest run of registered blocks that opens `req`'s prompt (no reference taken)."""
        if req.output_token_ids:  # (a preempted request's recompute: its own tokens follow)
            return []
        out = []
        for key in self._keys(req.prompt_token_ids, self._shareable(req, len(req.prompt_token_ids))):
            block = self._block.get(key)
            if block is None:
                break
            out.append(block)
        return out

    def opening(self, prefilling: list[Request]) -> set[bytes]:
        """The first blocks (keys) that requests being prefilled are computing: `waits`' set,
        made once for an admission pass (not a scan of them for every waiting request)."""
        return {k for r in prefilling if (k := self._first.get(r)) is not None}

    def waits(self, req: Request, opening: set[bytes]) -> bool:
        """Whether `req` should wait for a step: a request being prefilled opens with the same
        block (`opening`), which it can share once that is computed (the n answers of one
        prompt)."""
        if req.output_token_ids or not self._shareable(req, len(req.prompt_token_ids)):
            return False
        key = self._keys(req.prompt_token_ids, 1)[0]
        return key not in self._block and key in opening

    def admitted(self, req: Request, opening: set[bytes]) -> None:
        """`req` starts prefilling: its first block is on its way (and joins `opening`)."""
        if not req.output_token_ids and self._shareable(req, len(req.prompt_token_ids)):
            key = self._first[req] = self._keys(req.prompt_token_ids, 1)[0]
            opening.add(key)

    def share(self, req: Request, blocks: list[int]) -> None:
        """`req` starts with `blocks` (a reference each), its length past them."""
        self.allocator.incref(blocks)
        req.blocks = list(blocks)
        req.seq_len = len(blocks) * self.block_size
        self.shared_blocks += len(blocks)

    def register(self, req: Request) -> None:
        """After a prefill step: `req`'s computed full prompt blocks become shareable."""
        n = self._shareable(req, req.seq_len)
        if n:
            self._first.pop(req, None)
        for key, block in zip(self._keys(req.prompt_token_ids, n), req.blocks[:n]):
            if key not in self._block and block not in self._key:
                self._block[key], self._key[block] = block, key

    def release(self, req: Request, blocks: list[int]) -> None:
        """After `req` dropped its reference to `blocks`: forget those now free."""
        self._first.pop(req, None)
        for b in blocks:
            if self.allocator.refcount(b) == 0 and b in self._key:
                del self._block[self._key.pop(b)]
