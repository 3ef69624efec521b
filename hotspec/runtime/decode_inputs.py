"""A vanilla decode step's per-row inputs, computed inside its graph, in one Triton kernel.

Each row's input token (with the overlap schedule, core/launches.py: the carry row `src` where
`src >= 0`, else the host's), its new token's KV slot through the block table, its query length
(1) and its kv length (seq + 1). In torch that is seven small launches at the head of a graph
whose time is otherwise the weights' stream (the carry pick's compare, clamp, gather and where,
the slot lookup, a fill and an add); here it is one. `decode_inputs_torch` is the CPU path and
the reference the kernel (runtime/decode_inputs_kernel.py) is tested against.
"""

from __future__ import annotations

import torch

from hotspec.layers import fused
from hotspec.runtime.batch_builder import slots_torch

DecodeInputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


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
    from hotspec.runtime.decode_inputs_kernel import decode_inputs_rows

    out = decode_inputs_rows(ids, seq, tables, block_size, src, carry)
    return out[0], out[1], out[2], out[3]


def decode_inputs_torch(ids: torch.Tensor, seq: torch.Tensor, tables: torch.Tensor, block_size: int,
                        src: torch.Tensor | None = None, carry: torch.Tensor | None = None
                        ) -> DecodeInputs:
    """decode_inputs in torch ops (engine/launches.from_carry's pick, batch_builder's slots)."""
    if src is not None and carry is not None:
        ids = torch.where(src >= 0, carry[src.clamp(min=0)], ids)
    loc = slots_torch(tables, seq.unsqueeze(1), block_size).view(-1)
    return ids, loc, torch.ones_like(seq), seq + 1
