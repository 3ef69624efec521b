"""`draft_inputs` (speculative/draft_inputs.py) in one Triton kernel: one program per request
writes its scratch slots, positions, root mask rows and lengths."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotspec.layers import triton_interpret  # noqa: F401  (the interpreter fix)
from hotspec.runtime.slots_kernel import slot_of
from hotspec.speculative.draft_inputs import DraftInputs


@triton.jit
def _draft_inputs_kernel(BT, SEQ, LOCS, POS, MASK, QL, KVL, B, n_blocks, stride_bt,
                         K: tl.constexpr, M: tl.constexpr, M_PAD: tl.constexpr,
                         K_PAD: tl.constexpr, PAGE: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    seq = tl.load(SEQ + b).to(tl.int64)
    j = tl.arange(0, M_PAD)  # scratch index (s-1)*K + i
    ok = j < M
    slot = slot_of(BT + b * stride_bt, seq + j, ok, n_blocks, PAGE)
    step, i = j // K, j % K
    out = step * (B * K) + b * K + i
    tl.store(LOCS + out, slot, mask=ok)
    tl.store(POS + out, seq + step, mask=ok)
    r = tl.arange(0, K_PAD)
    mok = (r < K)[:, None] & ok[None, :]
    tl.store(MASK + b * (K * M) + r[:, None] * M + j[None, :], (j[None, :] == r[:, None]).to(tl.int1),
             mask=mok)
    tl.store(QL + b, tl.full((), K, tl.int64))
    tl.store(KVL + b, seq + M)


def draft_inputs(tables: torch.Tensor, seq: torch.Tensor, k: int, steps: int,
                 block_size: int) -> DraftInputs:
    """As draft_inputs.draft_inputs_torch: tables [B, T] (unit stride along T), seq [B]."""
    b, m, dev = seq.shape[0], k * steps, seq.device
    locs = torch.empty((steps, b * k), dtype=torch.int64, device=dev)
    positions = torch.empty((steps, b * k), dtype=torch.int64, device=dev)
    mask = torch.empty((b, k, m), dtype=torch.bool, device=dev)
    q_lens = torch.empty((b,), dtype=torch.int64, device=dev)
    kv_lens = torch.empty((b,), dtype=torch.int64, device=dev)
    if b and m:
        _draft_inputs_kernel[(b,)](
            tables, seq, locs, positions, mask, q_lens, kv_lens, b, tables.shape[1],
            tables.stride(0), K=k, M=m, M_PAD=max(16, triton.next_power_of_2(m)),
            K_PAD=triton.next_power_of_2(k), PAGE=block_size, num_warps=1)
    return DraftInputs(locs, positions, mask, q_lens, kv_lens)
