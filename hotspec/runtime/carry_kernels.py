"""The overlap schedule's carry (core/launches.py) in one Triton kernel per direction.

Inside a step graph, each input the last launched step left in the `carry` is taken from carry
row `src[b]` where `src[b] >= 0`, else from the host's value (`carry_pick`); and the step leaves,
row for row, what the next one reads (`carry_put`, with an optional addend: seq + accept_len).
In torch the pick is a compare and a clamp, then a gather and a where per input: eight small
launches at the head of the fused EAGLE step graph (seq, root and offsets); the put is an add
and a copy per input (five launches in its middle). Here each is one launch for up to four
int64 vectors; engine/launches sends anything else through torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotspec.layers import triton_interpret  # noqa: F401  (the interpreter fix)

MAX_PAIRS = 4


@triton.jit
def carry_row(X, C, OUT, r, ok, take, row):
    """OUT[r] = C[row] where `take`, else X[r] (lanes `ok`)."""
    x = tl.load(X + r, mask=ok, other=0)
    c = tl.load(C + row, mask=ok & take, other=0)
    tl.store(OUT + r, tl.where(take, c, x), mask=ok)


@triton.jit
def _carry_pick_kernel(SRC, X0, C0, OUT0, X1, C1, OUT1, X2, C2, OUT2, X3, C3, OUT3, B,
                       N: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    ok = r < B
    src = tl.load(SRC + r, mask=ok, other=-1)
    take = src >= 0
    row = tl.maximum(src, 0)
    carry_row(X0, C0, OUT0, r, ok, take, row)
    if N > 1:
        carry_row(X1, C1, OUT1, r, ok, take, row)
    if N > 2:
        carry_row(X2, C2, OUT2, r, ok, take, row)
    if N > 3:
        carry_row(X3, C3, OUT3, r, ok, take, row)


def pickable(x: torch.Tensor, buf: torch.Tensor, src: torch.Tensor) -> bool:
    """Whether the kernel takes (x, buf): unit-stride int64 vectors, x as long as src."""
    return (x.dtype == buf.dtype == torch.int64 and x.dim() == buf.dim() == 1
            and x.shape == src.shape and x.stride(0) == 1 and buf.stride(0) == 1
            and x.device == buf.device == src.device)


def carry_pick(src: torch.Tensor, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """For each (x, buf) of `pairs` (at most MAX_PAIRS, each `pickable`): a new int64 vector,
    buf[src[b]] where src[b] >= 0, else x[b]. src: int64 [B], unit stride."""
    if not 1 <= len(pairs) <= MAX_PAIRS:
        raise ValueError(f"carry_pick: 1 to {MAX_PAIRS} pairs, got {len(pairs)}")
    if src.dtype != torch.int64 or src.dim() != 1 or src.stride(0) != 1:
        raise ValueError(f"carry_pick: src must be a unit-stride int64 vector, got {src.dtype} "
                         f"{tuple(src.shape)}")
    if not all(pickable(x, buf, src) for x, buf in pairs):
        raise ValueError("carry_pick: every pair must be unit-stride int64 vectors, x as long as src")
    b = src.shape[0]
    outs = [torch.empty_like(x) for x, _ in pairs]
    if b == 0:
        return outs
    args: list[torch.Tensor] = []
    for i in range(MAX_PAIRS):
        x, buf = pairs[min(i, len(pairs) - 1)]
        args += [x, buf, outs[min(i, len(pairs) - 1)]]
    _carry_pick_kernel[(1,)](src, *args, b, N=len(pairs),
                             BLOCK=max(16, triton.next_power_of_2(b)), num_warps=1)
    return outs


@triton.jit
def _put(V, D, C, r, ok, ADD: tl.constexpr):
    v = tl.load(V + r, mask=ok, other=0)
    if ADD:
        v += tl.load(D + r, mask=ok, other=0)
    tl.store(C + r, v, mask=ok)


@triton.jit
def _carry_put_kernel(V0, D0, C0, V1, D1, C1, V2, D2, C2, V3, D3, C3, B, N: tl.constexpr,
                      ADD0: tl.constexpr, ADD1: tl.constexpr, ADD2: tl.constexpr,
                      ADD3: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    ok = r < B
    _put(V0, D0, C0, r, ok, ADD0)
    if N > 1:
        _put(V1, D1, C1, r, ok, ADD1)
    if N > 2:
        _put(V2, D2, C2, r, ok, ADD2)
    if N > 3:
        _put(V3, D3, C3, r, ok, ADD3)


def puttable(v: torch.Tensor, buf: torch.Tensor, add: torch.Tensor | None) -> bool:
    """Whether the kernel takes (v [+ add]) -> buf: unit-stride int64 vectors, buf at least as
    long as v, add (if any) shaped as v."""
    vecs = [v, buf] + ([add] if add is not None else [])
    return (all(t.dtype == torch.int64 and t.dim() == 1 and t.stride(0) == 1
                and t.device == v.device for t in vecs)
            and buf.shape[0] >= v.shape[0] and (add is None or add.shape == v.shape))


def carry_put(items: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]) -> None:
    """For each (v, add, buf) of `items` (at most MAX_PAIRS, each `puttable`, all v of one
    length B): buf[:B] = v (+ add)."""
    if not 1 <= len(items) <= MAX_PAIRS:
        raise ValueError(f"carry_put: 1 to {MAX_PAIRS} items, got {len(items)}")
    b = items[0][0].shape[0]
    if not all(puttable(v, buf, add) and v.shape[0] == b for v, add, buf in items):
        raise ValueError("carry_put: every item must be unit-stride int64 vectors of one length, "
                         "its carry buffer at least as long")
    if b == 0:
        return
    args: list[torch.Tensor] = []
    for i in range(MAX_PAIRS):
        v, add, buf = items[min(i, len(items) - 1)]
        args += [v, v if add is None else add, buf]
    adds = {f"ADD{i}": i < len(items) and items[i][1] is not None for i in range(MAX_PAIRS)}
    _carry_put_kernel[(1,)](*args, b, N=len(items), **adds,
                            BLOCK=max(16, triton.next_power_of_2(b)), num_warps=1)
