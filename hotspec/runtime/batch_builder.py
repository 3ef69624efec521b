"""Host-side construction of ForwardBatches from requests (block tables, slots, positions)."""

from __future__ import annotations

import numpy as np
import torch

from hotspec.core.forward_batch import ForwardBatch, ForwardMode
from hotspec.core.request import Request
from hotspec.layers import fused


def block_table_tensor(reqs: list[Request], device: torch.device) -> torch.Tensor:
    """[len(reqs), most blocks] int32: each request's KV blocks, zero-padded, filled from the
    requests' cached block arrays (not from a Python list per row per step)."""
    rows = [r.block_array() for r in reqs]
    table = np.zeros((len(rows), max(len(a) for a in rows)), dtype=np.int32)
    for i, a in enumerate(rows):
        table[i, :len(a)] = a
    return torch.from_numpy(table).to(device)


def prefill_batch(reqs: list[Request], tokens: list[list[int]], block_size: int,
                  device: torch.device, starts: list[int] | None = None) -> ForwardBatch:
    """Ragged causal pass over `tokens[i]` at positions starts[i], ... (default: appended after
    each request's committed `seq_len`)."""
    ids: list[int] = []
    pos: list[int] = []
    loc: list[int] = []
    first = starts if starts is not None else [r.seq_len for r in reqs]
    for r, toks, s in zip(reqs, tokens, first):
        ids += toks
        pos += range(s, s + len(toks))
        loc += r.slots(s, len(toks), block_size)
    q = [len(t) for t in tokens]
    kv = [s + n for s, n in zip(first, q)]
    cu = [0]
    for n in q:
        cu.append(cu[-1] + n)

    def t(x: list[int]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.long, device=device)

    return ForwardBatch(mode=ForwardMode.PREFILL, input_ids=t(ids), positions=t(pos),
                        out_cache_loc=t(loc), q_lens=t(q), kv_lens=t(kv),
                        block_tables=block_table_tensor(reqs, device), width=None,
                        cu_seqlens_q=t(cu), max_q=max(q), max_kv=max(kv))


def decode_batch(reqs: list[Request], block_size: int, device: torch.device) -> ForwardBatch:
    """One query per request: its newest token at position seq_len."""
    def t(x: list[int]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.long, device=device)

    b = len(reqs)
    return ForwardBatch(
        mode=ForwardMode.DECODE,
        input_ids=t([r.last_token for r in reqs]),
        positions=t([r.seq_len for r in reqs]),
        out_cache_loc=t([r.slot(r.seq_len, block_size) for r in reqs]),
        q_lens=t([1] * b), kv_lens=t([r.seq_len + 1 for r in reqs]),
        block_tables=block_table_tensor(reqs, device), width=1, max_q=1,
        max_kv=max(r.seq_len for r in reqs) + 1)


def last_token_index(fb: ForwardBatch) -> torch.Tensor:
    """Flat index of each request's last real token."""
    if fb.cu_seqlens_q is not None:
        return fb.cu_seqlens_q[1:] - 1
    assert fb.width is not None
    return torch.arange(fb.batch_size, device=fb.q_lens.device) * fb.width + fb.q_lens - 1


def slots_at(block_tables: torch.Tensor, index: torch.Tensor, block_size: int) -> torch.Tensor:
    """Device-side slot lookup: index [B, n] kv indices (>= 0) -> [B, n] int64 slots through each
    block table. On CUDA one Triton kernel (runtime/slots_kernel.py), else torch's six."""
    if fused.enabled(index) and block_tables.stride(-1) == 1 and index.dim() == 2:
        from hotspec.runtime.slots_kernel import slots_rows

        return slots_rows(block_tables, index, block_size)
    return slots_torch(block_tables, index, block_size)


def slots_torch(block_tables: torch.Tensor, index: torch.Tensor, block_size: int) -> torch.Tensor:
    """slots_at in torch ops: the CPU path, and the reference the kernel is tested against."""
    index = index.long()
    blocks = torch.gather(block_tables.long(), 1, index // block_size)
    return blocks * block_size + index % block_size
