"""The index bookkeeping at the head of each draft-head and target phase: which KV slot each row
writes, at which position, with which lengths. None of it depends on what the models compute,
and in torch each is five to ten small kernels in a launch-bound graph; on CUDA each is one
Triton program per request (speculative/phase_inputs_kernel.py), dispatched through
layers/fused.py's policy. The torch functions are the reference (and the CPU path).

draft (S-1 forwards of k frontier nodes; M = k * (S-1) scratch slots per request):
    locs[s-1, b*k + i]      = slot of kv index seq[b] + (s-1)*k + i       [S-1, B*k] int64
    positions[s-1, b*k + i] = seq[b] + s - 1                             [S-1, B*k] int64
    mask[b, i, j]           = j == i   (a root sees its own slot)        [B, k, M] bool
    q_lens[b] = k, kv_lens[b] = seq[b] + M
verify (N tree nodes; R = max(N, W) slots, which the commit reuses):
    slots[b, r]             = slot of kv index seq[b] + r                 [B, R] int64
    positions[b*N + i]      = seq[b] + depth[b, i],  loc[b*N + i] = slots[b, i]
    q_lens[b] = N, kv_lens[b] = seq[b] + N
draft_extend (W rows, the first a[b] real):
    ids[b*W + d]            = bonus[b] if d == a[b] - 1 else acc[b, (d + 1) % W]
    loc[b*W + d]            = slot of kv index seq[b] + d if d < a[b] else the trash slot
    positions[b*W + d]      = seq[b] + d,  last[b] = b*W + a[b] - 1 (the next root's row)
    kv_lens[b] = seq[b] + a[b]
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from hotspec.layers import fused
from hotspec.runtime.batch_builder import slots_at


class DraftInputs(NamedTuple):
    locs: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    q_lens: torch.Tensor
    kv_lens: torch.Tensor


class VerifyInputs(NamedTuple):
    slots: torch.Tensor
    positions: torch.Tensor
    loc: torch.Tensor
    q_lens: torch.Tensor
    kv_lens: torch.Tensor


class ExtendInputs(NamedTuple):
    ids: torch.Tensor
    loc: torch.Tensor
    positions: torch.Tensor
    last: torch.Tensor
    kv_lens: torch.Tensor


def _kernel(seq: torch.Tensor, tables: torch.Tensor) -> bool:
    return fused.enabled(seq) and tables.stride(-1) == 1


def draft_inputs_torch(tables: torch.Tensor, seq: torch.Tensor, k: int, steps: int,
                       block_size: int) -> DraftInputs:
    b, m, dev = seq.shape[0], k * steps, seq.device
    sidx = torch.arange(m, device=dev)
    locs = slots_at(tables, seq.unsqueeze(1) + sidx, block_size)  # [B, M]
    # (contiguous: with k == 1 the reshape is a strided view, and kernels read the rows of these
    # with unit stride)
    locs = locs.view(b, steps, k).transpose(0, 1).reshape(steps, b * k).contiguous()
    s = torch.arange(steps, device=dev).view(steps, 1, 1)
    positions = (seq.view(1, b, 1) + s).expand(steps, b, k).reshape(steps, b * k).contiguous()
    mask = (sidx[:k].view(k, 1) == sidx).expand(b, k, m).contiguous()
    q_lens = torch.full((b,), k, dtype=torch.long, device=dev)
    return DraftInputs(locs, positions, mask, q_lens, seq + m)


def draft_inputs(tables: torch.Tensor, seq: torch.Tensor, k: int, steps: int,
                 block_size: int) -> DraftInputs:
    """DraftInputs for `steps` = S-1 draft forwards of k frontier nodes."""
    if _kernel(seq, tables):
        from hotspec.speculative.phase_inputs_kernel import draft_inputs as kernel

        return kernel(tables, seq, k, steps, block_size)
    return draft_inputs_torch(tables, seq, k, steps, block_size)


def verify_inputs_torch(tables: torch.Tensor, seq: torch.Tensor, depth: torch.Tensor, reserve: int,
                        block_size: int) -> VerifyInputs:
    b, n = depth.shape
    span = torch.arange(reserve, device=seq.device)
    slots = slots_at(tables, seq.unsqueeze(1) + span, block_size)
    q_lens = torch.full((b,), n, dtype=torch.long, device=seq.device)
    return VerifyInputs(slots, (seq.unsqueeze(1) + depth).reshape(-1), slots[:, :n].reshape(-1),
                        q_lens, seq + n)


def verify_inputs(tables: torch.Tensor, seq: torch.Tensor, depth: torch.Tensor, reserve: int,
                  block_size: int) -> VerifyInputs:
    """VerifyInputs for a tree of depth.shape[1] nodes and `reserve` >= N slots per request."""
    if _kernel(seq, tables) and depth.stride(1) == 1:
        from hotspec.speculative.phase_inputs_kernel import verify_inputs as kernel

        return kernel(tables, seq, depth, reserve, block_size)
    return verify_inputs_torch(tables, seq, depth, reserve, block_size)


def extend_inputs_torch(tables: torch.Tensor, seq: torch.Tensor, acc: torch.Tensor,
                        bonus: torch.Tensor, a: torch.Tensor, slots: torch.Tensor | None,
                        trash: int, block_size: int) -> ExtendInputs:
    b, w = acc.shape
    d = torch.arange(w, device=seq.device).unsqueeze(0)
    shifted = torch.cat([acc[:, 1:], acc[:, :1]], 1)
    shifted = torch.where(d == (a - 1).unsqueeze(1), bonus.unsqueeze(1), shifted)
    if slots is None:
        slots = slots_at(tables, seq.unsqueeze(1) + d, block_size)
    loc = torch.where(d < a.unsqueeze(1), slots[:, :w], trash)
    last = torch.arange(b, device=seq.device) * w + a - 1
    return ExtendInputs(shifted.reshape(-1), loc.reshape(-1), (seq.unsqueeze(1) + d).reshape(-1),
                        last, seq + a)


def extend_inputs(tables: torch.Tensor, seq: torch.Tensor, acc: torch.Tensor, bonus: torch.Tensor,
                  a: torch.Tensor, slots: torch.Tensor | None, trash: int,
                  block_size: int) -> ExtendInputs:
    """ExtendInputs for W = acc.shape[1] rows per request; `slots` [B, >= W] the rows' slots when
    the caller has them (the fused step), else looked up through the tables."""
    if _kernel(seq, tables) and acc.stride(1) == 1 and (slots is None or slots.stride(1) == 1):
        from hotspec.speculative.phase_inputs_kernel import extend_inputs as kernel

        return kernel(tables, seq, acc, bonus, a, slots, trash, block_size)
    return extend_inputs_torch(tables, seq, acc, bonus, a, slots, trash, block_size)
