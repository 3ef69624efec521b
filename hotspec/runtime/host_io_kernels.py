"""runtime/host_io.py's Triton kernels: a graph's first (`fetch`) and last (`publish`, `bump`)."""

from __future__ import annotations

import triton
import triton.language as tl

from hotspec.layers import triton_interpret  # noqa: F401  (the interpreter fix)


@triton.jit
def fetch_kernel(SRC, DST, COUNTER, NWORDS, SLOT_WORDS, BLOCK: tl.constexpr):
    """DST[w] = SRC[slot * SLOT_WORDS + w] for this program's words w < NWORDS, slot = counter % 2."""
    slot = tl.load(COUNTER) % 2
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < NWORDS
    v = tl.load(SRC + slot * SLOT_WORDS + offs, mask=ok)
    tl.store(DST + offs, v, mask=ok)


@triton.jit
def publish_kernel(SRC, DST, COUNTER, NWORDS, SLOT_WORDS, BUMP: tl.constexpr, BLOCK: tl.constexpr):
    """One program: DST[slot * SLOT_WORDS + w] = SRC[w] for w < NWORDS, slot = counter % 2; with
    BUMP the counter then counts the step (after every program of the graph read it)."""
    c = tl.load(COUNTER)
    base = DST + (c % 2) * SLOT_WORDS
    for start in range(0, NWORDS, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < NWORDS
        tl.store(base + offs, tl.load(SRC + offs, mask=ok), mask=ok)
    if BUMP:
        tl.store(COUNTER, c + 1)


@triton.jit
def bump_kernel(COUNTER):
    tl.store(COUNTER, tl.load(COUNTER) + 1)
