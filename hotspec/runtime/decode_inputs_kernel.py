"""runtime/decode_inputs.py's Triton kernel: a vanilla decode step's per-row inputs in one launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotspec.layers import triton_interpret  # noqa: F401  (the interpreter fix)
from hotspec.runtime.carry_kernels import carry_row
from hotspec.runtime.slots_kernel import slot_of


@triton.jit
def _decode_inputs_kernel(IDS, SEQ, BT, SRC, CARRY, IDS_OUT, LOC, QL, KVL, B, n_blocks, stride_bt,
                          PAGE: tl.constexpr, CARRIED: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    ok = r < B
    seq = tl.load(SEQ + r, mask=ok, other=0).to(tl.int64)
    if CARRIED:  # the token the last launched step left in the carry, where the host lacks it
        src = tl.load(SRC + r, mask=ok, other=-1)
        carry_row(IDS, CARRY, IDS_OUT, r, ok, src >= 0, tl.maximum(src, 0))
    else:
        tl.store(IDS_OUT + r, tl.load(IDS + r, mask=ok, other=0), mask=ok)
    tl.store(LOC + r, slot_of(BT + r.to(tl.int64) * stride_bt, seq, ok, n_blocks, PAGE), mask=ok)
    tl.store(QL + r, tl.full([BLOCK], 1, tl.int64), mask=ok)
    tl.store(KVL + r, seq + 1, mask=ok)


def decode_inputs_rows(ids: torch.Tensor, seq: torch.Tensor, tables: torch.Tensor, block_size: int,
                       src: torch.Tensor | None, carry: torch.Tensor | None) -> torch.Tensor:
    """int64 [4, B]: input ids, out_cache_loc, q_lens, kv_lens (decode_inputs.decode_inputs)."""
    b = ids.shape[0]
    out = torch.empty((4, b), dtype=torch.int64, device=seq.device)
    carried = src is not None
    _decode_inputs_kernel[(1,)](
        ids, seq, tables, src if carried else ids, carry if carried else ids,
        out[0], out[1], out[2], out[3], b, tables.shape[1], tables.stride(0),
        PAGE=block_size, CARRIED=carried, BLOCK=max(16, triton.next_power_of_2(b)), num_warps=1)
    return out
