"""What the draft loop's forwards need that does not depend on what they draft, for all steps at
once (the loop is launch-bound):

    step s = 1 .. S-1, frontier node i < k of request b writes scratch kv index (s-1)*k + i:
    locs[s-1, b*k + i]      = slot of kv index seq[b] + (s-1)*k + i       [S-1, B*k] int64
    positions[s-1, b*k + i] = seq[b] + s - 1                             [S-1, B*k] int64
    mask[b, i, j]           = j == i   (a root sees its own slot)        [B, k, M] bool
    q_lens[b] = k, kv_lens[b] = seq[b] + M                                [B] int64

with M = k * (S-1) scratch slots per request. In torch that is about ten small kernels; on CUDA
one Triton program per request (speculative/draft_inputs_kernel.py). Dispatch through
layers/fused.py's policy.
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


def draft_inputs_torch(tables: torch.Tensor, seq: torch.Tensor, k: int, steps: int,
                       block_size: int) -> DraftInputs:
    """DraftInputs for `steps` = S-1 draft forwards of k frontier nodes (the reference)."""
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
    """As `draft_inputs_torch`; one kernel on CUDA."""
    if fused.enabled(seq) and tables.stride(-1) == 1:
        from hotspec.speculative.draft_inputs_kernel import draft_inputs as kernel

        return kernel(tables, seq, k, steps, block_size)
    return draft_inputs_torch(tables, seq, k, steps, block_size)
