"""Triton kernels of chunked_ce's soft cross-entropy on CUDA.

Per chunk of logits the torch ops (a float32 copy of each bf16 GEMM output, log-sum-exp, softmax,
two argmaxes, the products) pass over the [rows, D] data a dozen times; these kernels read the
head's and the target's logits once, in their own dtype, and compute in float32:

  * `soft_ce_rows`: per row, one pass of online log-sum-exp over both logit rows: the loss
    -sum(p_target * log_softmax(z_head)) = lse_head - sum(p_target * z_head), both log-sum-exps
    (what backward needs) and whether the two argmaxes (first index of the maximum, as
    torch.argmax) agree.
  * `soft_ce_grad_`: d loss / d z_head = (softmax(z_head) - p_target) * grad_loss, written over
    the head's logits in place, from the saved log-sum-exps.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotspec.layers import triton_interpret  # noqa: F401  (the interpreter fix)

ROW_BLOCK = 1024  # columns a program reads per iteration of `soft_ce_rows` (its lanes)
TILE_R, TILE_C = 16, 256  # the tile of a `soft_ce_grad_` program


@triton.jit
def _rows_kernel(ZD, ZT, LOSS, LSE_D, LSE_T, HIT, n, stride_d, stride_t, BLOCK: tl.constexpr):
    """One program a row. Each lane keeps its own online state over its columns (lane j reads
    columns j, j + BLOCK, ...): the running maxima of both rows, the sums of exponentials below
    them, the target-weighted sum of the head's logits, and the first column of the head's and the
    target's maxima; the lanes are combined once at the end."""
    row = tl.program_id(0)
    zd_row = ZD + row.to(tl.int64) * stride_d
    zt_row = ZT + row.to(tl.int64) * stride_t
    m_d = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    m_t = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    s_d = tl.zeros([BLOCK], dtype=tl.float32)
    s_t = tl.zeros([BLOCK], dtype=tl.float32)
    a = tl.zeros([BLOCK], dtype=tl.float32)  # sum of exp(z_t - m_t) * z_d
    i_d = tl.zeros([BLOCK], dtype=tl.int32)
    i_t = tl.zeros([BLOCK], dtype=tl.int32)
    for k in range(0, n, BLOCK):
        offs = k + tl.arange(0, BLOCK)
        ok = offs < n
        zd = tl.load(zd_row + offs, mask=ok, other=float("-inf")).to(tl.float32)
        zt = tl.load(zt_row + offs, mask=ok, other=float("-inf")).to(tl.float32)
        # strict: a lane's later equal maximum keeps its earlier (first) column
        i_d = tl.where(zd > m_d, offs, i_d)
        i_t = tl.where(zt > m_t, offs, i_t)
        new_d = tl.maximum(m_d, zd)
        new_t = tl.maximum(m_t, zt)
        # (a lane with no column yet stays at -inf: exponentials against 0 there, all 0)
        base_d = tl.where(new_d == float("-inf"), 0.0, new_d)
        base_t = tl.where(new_t == float("-inf"), 0.0, new_t)
        s_d = s_d * tl.exp(m_d - base_d) + tl.exp(zd - base_d)
        c = tl.exp(m_t - base_t)
        e = tl.exp(zt - base_t)
        s_t = s_t * c + e
        a = a * c + e * tl.where(ok, zd, 0.0)
        m_d = new_d
        m_t = new_t
    top_d = tl.max(m_d, 0)
    top_t = tl.max(m_t, 0)
    sum_d = tl.sum(s_d * tl.exp(m_d - top_d), 0)  # (lanes at -inf add 0 * 0)
    w_t = tl.exp(m_t - top_t)
    sum_t = tl.sum(s_t * w_t, 0)
    lse_d = top_d + tl.log(sum_d)
    tl.store(LSE_D + row, lse_d)
    tl.store(LSE_T + row, top_t + tl.log(sum_t))
    tl.store(LOSS + row, lse_d - tl.sum(a * w_t, 0) / sum_t)
    first_d = tl.min(tl.where(m_d == top_d, i_d, 2**31 - 1), 0)
    first_t = tl.min(tl.where(m_t == top_t, i_t, 2**31 - 1), 0)
    tl.store(HIT + row, first_d == first_t)


@triton.jit
def _grad_kernel(ZD, ZT, LSE_D, LSE_T, SCALE, n_rows, n_cols, stride_d, stride_t,
                 TILE_R: tl.constexpr, TILE_C: tl.constexpr):
    rows = tl.program_id(0) * TILE_R + tl.arange(0, TILE_R)
    cols = tl.program_id(1) * TILE_C + tl.arange(0, TILE_C)
    ok_r = rows < n_rows
    ok = ok_r[:, None] & (cols[None, :] < n_cols)
    r64 = rows.to(tl.int64)[:, None]
    pd = ZD + r64 * stride_d + cols[None, :]
    zd = tl.load(pd, mask=ok, other=0.0).to(tl.float32)
    zt = tl.load(ZT + r64 * stride_t + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    lse_d = tl.load(LSE_D + rows, mask=ok_r, other=0.0)
    lse_t = tl.load(LSE_T + rows, mask=ok_r, other=0.0)
    scale = tl.load(SCALE + rows, mask=ok_r, other=0.0)
    g = (tl.exp(zd - lse_d[:, None]) - tl.exp(zt - lse_t[:, None])) * scale[:, None]
    tl.store(pd, g.to(ZD.dtype.element_ty), mask=ok)


def _check(zd: torch.Tensor, zt: torch.Tensor) -> None:
    if zd.shape != zt.shape or zd.dim() != 2 or zd.stride(1) != 1 or zt.stride(1) != 1:
        raise ValueError(f"soft_ce: logits must be [rows, D] with unit column stride, got "
                         f"{tuple(zd.shape)} / {tuple(zt.shape)}")


def soft_ce_rows(zd: torch.Tensor, zt: torch.Tensor, loss: torch.Tensor, lse_d: torch.Tensor,
                 lse_t: torch.Tensor, hit: torch.Tensor) -> None:
    """Per row of the head's logits `zd` and the target's `zt` [R, D] (any float dtype): the
    soft cross-entropy into `loss`, the log-sum-exps into `lse_d`, `lse_t` (float32 [R] each)
    and the argmaxes' agreement into `hit` (bool [R])."""
    _check(zd, zt)
    r, n = zd.shape
    if r:
        _rows_kernel[(r,)](zd, zt, loss, lse_d, lse_t, hit, n, zd.stride(0), zt.stride(0),
                           BLOCK=ROW_BLOCK, num_warps=8)


def soft_ce_grad_(zd: torch.Tensor, zt: torch.Tensor, lse_d: torch.Tensor, lse_t: torch.Tensor,
                  scale: torch.Tensor) -> torch.Tensor:
    """(softmax(zd) - softmax(zt)) * scale[:, None], the softmaxes from the rows' log-sum-exps
    (float32 [R] each; `scale` float32 [R]), written over `zd` in its dtype; returns `zd`."""
    _check(zd, zt)
    r, n = zd.shape
    if r and n:
        _grad_kernel[(triton.cdiv(r, TILE_R), triton.cdiv(n, TILE_C))](
            zd, zt, lse_d, lse_t, scale, r, n, zd.stride(0), zt.stride(0),
            TILE_R=TILE_R, TILE_C=TILE_C, num_warps=4)
    return zd
