"""The Triton attention backend's tuning overrides (KernelTuning) and the deterministic mode's kv
chunk rule (layers/attention/triton_backend.py)."""

from __future__ import annotations

from dataclasses import dataclass

import triton


def det_kv_chunk(kv_bound: int) -> int:
    """The deterministic mode's kv chunk for an engine whose rows hold at most kv_bound keys: 128
    (a decode row of 512 keys runs as 4 splits), doubled until at most 128 chunks cover the
    bound (the combine's loop, and the partials, grow with the count)."""
    c = 128
    while triton.cdiv(kv_bound, c) > 128:
        c *= 2
    return c


@dataclass(frozen=True)
class KernelTuning:
    """Overrides of the kernels' automatic choices, for tests that reach each kernel path at
    small sizes and for the attention benchmark; the engine keeps the defaults.

    block_n / block_m: tile sizes (powers of two, >= 16); num_splits: the split count of uniform
    phases (None: automatic on CUDA, never on CPU; 1: never); num_warps; num_stages: the kv loop's
    pipeline stages (None: `_stages`' rule); mask_bits: pack custom masks of <= 64 slots into a
    word per row (False: the byte mask wider masks use); fold_rope: decode and verify batches pass
    RoPE and the KV store to the kernel (`folds_rope`; False: their own kernel, as every other
    phase);
    min_chunk: the fewest kv indices a split covers (None: `min_chunk`'s rule for the automatic
    splits of several-row phases, equal shares otherwise).

    deterministic (the engine's `--deterministic`, layers/deterministic.py): one tile config for
    every phase and batch (16-row tiles, 64 kv rows (32 in fp32), 4 warps, 2 stages, no FMA
    contraction), a tree's verify with one query row per program, which reads its tree node's
    keys as the sequence decode reads (the kernel's TREE_SEQ); every other phase (a chain's
    verify is causal) fills its tiles with query rows as the fast path does, since no row's
    arithmetic depends on the other rows of its tile (decode keeps the RoPE fold, whose
    rotation is rope_store's to the bit). A row's keys are cut into chunks of kv_chunk
    indices at fixed places (0, kv_chunk, ...): the uniform phases run them as splits (each
    chunk's partial its own, -inf past the row's keys) merged by combine_splits_seq,
    prefill one after another in its program, merged the same way. A row's output then depends
    on its own keys alone, and a verify or prefill row equals the decode row of its token bit
    for bit. num_splits there: the programs a row's chunks are dealt to (None: two waves on
    CUDA), which changes no bits. It forces the fold and packed masks; given tile sizes, warps
    and stages replace its own (the attention benchmark's variants: still one config for every
    phase)."""

    block_n: int | None = None
    block_m: int | None = None
    num_splits: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    mask_bits: bool = True
    fold_rope: bool = True
    min_chunk: int | None = None
    deterministic: bool = False
    kv_chunk: int = 128  # deterministic only: kv indices a chunk holds (a multiple of block_n)
