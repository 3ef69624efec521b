"""`slots_at` in one Triton kernel: each step graph looks up the KV slots of its new tokens
through the block tables (decode: one per row; the EAGLE phases: the tree's, the draft steps',
the accepted tokens'). The torch spelling (batch_builder.slots_at) is six kernels - the int32
table widened to int64, a division, a gather, a product, a remainder, a sum - small launches at
the head of a graph that is otherwise bandwidth-bound; this is one."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotspec.layers import triton_interpret  # noqa: F401  (the interpreter fix)


@triton.jit
def slot_of(bt_row, idx, ok, n_blocks, PAGE: tl.constexpr):
    """int64 slots of kv indices `idx` (int64, >= 0) through the block-table row at `bt_row`; a
    column past the table (n_blocks) reads block 0."""
    col = idx // PAGE  # kv indices are >= 0: C division is floor division
    blk = tl.load(bt_row + col, mask=ok & (col < n_blocks), other=0).to(tl.int64)
    return blk * PAGE + idx % PAGE


@triton.jit
def _slots_kernel(BT, IDX, OUT, n_cols, n_blocks, stride_bt, stride_ib, stride_ic,
                  PAGE: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    ok = c < n_cols
    idx = tl.load(IDX + b * stride_ib + c * stride_ic, mask=ok, other=0).to(tl.int64)
    tl.store(OUT + b * n_cols + c, slot_of(BT + b * stride_bt, idx, ok, n_blocks, PAGE), mask=ok)


def slots_rows(block_tables: torch.Tensor, index: torch.Tensor, block_size: int) -> torch.Tensor:
    """int64 [B, n]: slot of kv index index[b, j] (>= 0) through block_tables[b] ([B, T], unit
    stride along T). A column past the table reads block 0, where torch.gather would raise."""
    b, n = index.shape
    out = torch.empty((b, n), dtype=torch.int64, device=index.device)
    if b == 0 or n == 0:
        return out
    _slots_kernel[(b,)](block_tables, index, out, n, block_tables.shape[1], block_tables.stride(0),
                        index.stride(0), index.stride(1), PAGE=block_size,
                        BLOCK=max(16, triton.next_power_of_2(n)), num_warps=1)
    return out
