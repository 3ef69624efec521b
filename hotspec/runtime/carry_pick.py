"""The overlap schedule's carry pick (engine/launches.from_carry) in one Triton kernel.

Inside a step graph, each input the last launched step left in the `carry` is taken from carry
row `src[b]` where `src[b] >= 0`, else from the host's value. In torch that is a compare and a
clamp, then a gather and a where per input: eight small launches at the head of the fused EAGLE
step graph (seq, root and offsets), before its first large kernel. Here it is one launch for up
to four int64 vectors of one length; from_carry sends anything else through torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotspec.layers import triton_interpret  # noqa: F401  (the interpreter fix)

MAX_PAIRS = 4


@triton.jit
def _pick(X, C, OUT, r, ok, take, row):
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
    _pick(X0, C0, OUT0, r, ok, take, row)
    if N > 1:
        _pick(X1, C1, OUT1, r, ok, take, row)
    if N > 2:
        _pick(X2, C2, OUT2, r, ok, take, row)
    if N > 3:
        _pick(X3, C3, OUT3, r, ok, take, row)


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
