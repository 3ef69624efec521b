"""A vanilla decode step's per-row inputs, computed inside its graph, in one Triton kernel.

Each row's input token (with the overlap schedule, engine/launches.py: the carry row `src` where
`src >= 0`, else the host's), its new token's KV slot through the block table, its query length
(1) and its kv length (seq + 1). In torch that is seven small launches at the head of a graph
whose time is otherwise the weights' stream (the carry pick's compare, clamp, gather and where,
the slot lookup, a fill and an add); here it is one. `decode_inputs_torch` is the CPU path and
the reference the kernel is tested against.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotspec.layers import fused, triton_interpret  # noqa: F401  (triton_interpret: the interpreter fix)
from hotspec.runtime.batch_builder import slots_torch
from hotspec.runtime.carry_kernels import carry_row
from hotspec.runtime.slots_kernel import slot_of

DecodeInputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


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


def decode_inputs(ids: torch.Tensor, seq: torch.Tensor, tables: torch.Tensor, block_size: int,
                  src: torch.Tensor | None = None, carry: torch.Tensor | None = None
                  ) -> DecodeInputs:
    """(input ids, out_cache_loc, q_lens, kv_lens), each int64 [B], for decode rows with host
    tokens `ids` [B] at positions `seq` [B] through `tables` [B, T]; with `src` [B] and `carry`,
    row b's token is carry[src[b]] where src[b] >= 0. One Triton kernel where fused kernels run
    (a position past the table reads block 0 there), else torch."""
    if (src is None) != (carry is None):
        raise ValueError("decode_inputs: src and carry go together (the overlap schedule)")
    b = ids.shape[0]
    if not fused.enabled(seq) or tables.stride(-1) != 1 or b == 0:
        return decode_inputs_torch(ids, seq, tables, block_size, src, carry)
    out = torch.empty((4, b), dtype=torch.int64, device=seq.device)
    carried = src is not None
    _decode_inputs_kernel[(1,)](
        ids, seq, tables, src if carried else ids, carry if carried else ids,
        out[0], out[1], out[2], out[3], b, tables.shape[1], tables.stride(0),
        PAGE=block_size, CARRIED=carried, BLOCK=max(16, triton.next_power_of_2(b)), num_warps=1)
    return out[0], out[1], out[2], out[3]


def decode_inputs_torch(ids: torch.Tensor, seq: torch.Tensor, tables: torch.Tensor, block_size: int,
                        src: torch.Tensor | None = None, carry: torch.Tensor | None = None
                        ) -> DecodeInputs:
    """decode_inputs in torch ops (engine/launches.from_carry's pick, batch_builder's slots)."""
    if src is not None and carry is not None:
        ids = torch.where(src >= 0, carry[src.clamp(min=0)], ids)
    loc = slots_torch(tables, seq.unsqueeze(1), block_size).view(-1)
    return ids, loc, torch.ones_like(seq), seq + 1
