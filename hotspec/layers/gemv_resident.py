"""The resident one-row GEMV (gemv_kernels.gemv at PIPE 0): a program's whole weight slice in
registers before its PDL wait. The 8B o_proj at one row runs it (gemv_kernels.CONFIGS)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotspec.layers import pdl
from hotspec.layers.gemv_kernels import GemvConfig, _x_tile


@triton.jit
def _gemv_resident_kernel(X, W, Y, N, K, stride_wn, SILU: tl.constexpr, BLOCK_N: tl.constexpr,
                          K_PAD: tl.constexpr, PDL: tl.constexpr = False):
    """One row, PIPE 0: program n loads its whole weight slice w[n*BLOCK_N:(n+1)*BLOCK_N, :K] into
    registers at once, before its PDL wait, then reads x and reduces. Nothing is left to stream
    after the wait, so where the kernel before leaves HBM idle (o_proj behind the attention and
    its split combine) the resident programs fill it with their weights; the programs that only
    become resident later load theirs as any GEMV does. No loop and no fp32 tile accumulator:
    [4, 4096] at 4 warps is 94 sm_90 registers, 64 of them the weights (the tiled kernel at
    BLOCK_K = K: 255 and spills)."""
    pid = tl.program_id(0)
    offs_n = tl.cast(pid, tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, K_PAD)
    n_ok = offs_n < N
    k_ok = offs_k < K
    pdl.launch_dependents(PDL)
    w = tl.load(W + offs_n[:, None] * stride_wn + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :],
                other=0.0, eviction_policy="evict_first")
    pdl.wait(PDL)
    x = _x_tile(X + offs_k, K, k_ok, SILU)
    y = tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
    tl.store(Y + offs_n, y.to(Y.dtype.element_ty), mask=n_ok)


def gemv_resident(x: torch.Tensor, w: torch.Tensor, cfg: GemvConfig, silu_mul: bool,
                  use_pdl: bool | None) -> torch.Tensor:
    """gemv at PIPE 0 (`_gemv_resident_kernel`): one row, no split-K."""
    n, k = w.shape
    if x.shape[0] != 1 or cfg.SPLIT_K != 1:
        raise ValueError(f"gemv: PIPE 0 (resident) runs one row without split-K, got M={x.shape[0]}, "
                         f"SPLIT_K={cfg.SPLIT_K}")
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    use_pdl = pdl.enabled(x.device) if use_pdl is None else use_pdl
    if cfg.BLOCK_K < k:
        raise ValueError(f"gemv: PIPE 0 (resident) holds the whole row slice: BLOCK_K {cfg.BLOCK_K} "
                         f"must be >= K {k}")
    _gemv_resident_kernel[(triton.cdiv(n, cfg.BLOCK_N),)](
        x, w, y, n, k, w.stride(0), SILU=silu_mul, BLOCK_N=cfg.BLOCK_N,
        K_PAD=triton.next_power_of_2(k), PDL=use_pdl, num_warps=cfg.num_warps,
        **({"launch_pdl": True} if use_pdl else {}))
    return y
