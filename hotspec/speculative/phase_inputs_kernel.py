"""The phases' index bookkeeping (speculative/phase_inputs.py) in one Triton kernel each: one
program per request writes its rows' slots, positions and lengths."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotspec.layers import triton_interpret  # noqa: F401  (the interpreter fix)
from hotspec.runtime.slots_kernel import slot_of
from hotspec.speculative.phase_inputs import DraftInputs, ExtendInputs, VerifyInputs


def _pad(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


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
    """As phase_inputs.draft_inputs_torch: tables [B, T] (unit stride along T), seq [B]."""
    b, m, dev = seq.shape[0], k * steps, seq.device
    seq = seq.contiguous()  # [B] vectors are read with unit stride
    locs = torch.empty((steps, b * k), dtype=torch.int64, device=dev)
    positions = torch.empty((steps, b * k), dtype=torch.int64, device=dev)
    mask = torch.empty((b, k, m), dtype=torch.bool, device=dev)
    q_lens = torch.empty((b,), dtype=torch.int64, device=dev)
    kv_lens = torch.empty((b,), dtype=torch.int64, device=dev)
    if b and m:
        _draft_inputs_kernel[(b,)](
            tables, seq, locs, positions, mask, q_lens, kv_lens, b, tables.shape[1],
            tables.stride(0), K=k, M=m, M_PAD=_pad(m), K_PAD=triton.next_power_of_2(k),
            PAGE=block_size, num_warps=1)
    return DraftInputs(locs, positions, mask, q_lens, kv_lens)


@triton.jit
def _verify_inputs_kernel(BT, SEQ, DEPTH, SLOTS, POS, LOC, QL, KVL, n_blocks, stride_bt,
                          stride_db, N: tl.constexpr, R: tl.constexpr, R_PAD: tl.constexpr,
                          PAGE: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    seq = tl.load(SEQ + b).to(tl.int64)
    r = tl.arange(0, R_PAD)
    ok = r < R
    slot = slot_of(BT + b * stride_bt, seq + r, ok, n_blocks, PAGE)
    tl.store(SLOTS + b * R + r, slot, mask=ok)
    node = r < N
    depth = tl.load(DEPTH + b * stride_db + r, mask=node, other=0).to(tl.int64)
    tl.store(POS + b * N + r, seq + depth, mask=node)
    tl.store(LOC + b * N + r, slot, mask=node)
    tl.store(QL + b, tl.full((), N, tl.int64))
    tl.store(KVL + b, seq + N)


def verify_inputs(tables: torch.Tensor, seq: torch.Tensor, depth: torch.Tensor, reserve: int,
                  block_size: int) -> VerifyInputs:
    """As phase_inputs.verify_inputs_torch: depth [B, N] with unit stride along N."""
    (b, n), dev = depth.shape, seq.device
    seq = seq.contiguous()  # [B] vectors are read with unit stride
    slots = torch.empty((b, reserve), dtype=torch.int64, device=dev)
    positions = torch.empty((b * n,), dtype=torch.int64, device=dev)
    loc = torch.empty((b * n,), dtype=torch.int64, device=dev)
    q_lens = torch.empty((b,), dtype=torch.int64, device=dev)
    kv_lens = torch.empty((b,), dtype=torch.int64, device=dev)
    if b:
        _verify_inputs_kernel[(b,)](
            tables, seq, depth, slots, positions, loc, q_lens, kv_lens, tables.shape[1],
            tables.stride(0), depth.stride(0), N=n, R=reserve, R_PAD=_pad(reserve), PAGE=block_size,
            num_warps=1)
    return VerifyInputs(slots, positions, loc, q_lens, kv_lens)


@triton.jit
def _extend_inputs_kernel(BT, SEQ, ACC, BONUS, A, SLOTS, IDS, LOC, POS, LAST, KVL, trash, n_blocks,
                          stride_bt, stride_ab, stride_sb, W: tl.constexpr, W_PAD: tl.constexpr,
                          HAS_SLOTS: tl.constexpr, PAGE: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    seq = tl.load(SEQ + b).to(tl.int64)
    a = tl.load(A + b).to(tl.int64)
    d = tl.arange(0, W_PAD)
    ok = d < W
    nxt = tl.load(ACC + b * stride_ab + (d + 1) % W, mask=ok, other=0)
    bonus = tl.load(BONUS + b)
    tl.store(IDS + b * W + d, tl.where(d == a - 1, bonus, nxt), mask=ok)
    if HAS_SLOTS:
        slot = tl.load(SLOTS + b * stride_sb + d, mask=ok, other=0).to(tl.int64)
    else:
        slot = slot_of(BT + b * stride_bt, seq + d, ok, n_blocks, PAGE)
    tl.store(LOC + b * W + d, tl.where(d < a, slot, trash), mask=ok)
    tl.store(POS + b * W + d, seq + d, mask=ok)
    tl.store(LAST + b, b * W + a - 1)
    tl.store(KVL + b, seq + a)


def extend_inputs(tables: torch.Tensor, seq: torch.Tensor, acc: torch.Tensor, bonus: torch.Tensor,
                  a: torch.Tensor, slots: torch.Tensor | None, trash: int,
                  block_size: int) -> ExtendInputs:
    """As phase_inputs.extend_inputs_torch: acc [B, W] and slots (if given) with unit stride
    along W."""
    (b, w), dev = acc.shape, seq.device
    seq, bonus, a = seq.contiguous(), bonus.contiguous(), a.contiguous()  # read with unit stride
    ids = torch.empty((b * w,), dtype=acc.dtype, device=dev)
    loc = torch.empty((b * w,), dtype=torch.int64, device=dev)
    positions = torch.empty((b * w,), dtype=torch.int64, device=dev)
    last = torch.empty((b,), dtype=torch.int64, device=dev)
    kv_lens = torch.empty((b,), dtype=torch.int64, device=dev)
    if b:
        s = slots if slots is not None else loc
        _extend_inputs_kernel[(b,)](
            tables, seq, acc, bonus, a, s, ids, loc, positions, last, kv_lens, trash,
            tables.shape[1], tables.stride(0), acc.stride(0), s.stride(0), W=w, W_PAD=_pad(w),
            HAS_SLOTS=slots is not None, PAGE=block_size, num_warps=1)
    return ExtendInputs(ids, loc, positions, last, kv_lens)
