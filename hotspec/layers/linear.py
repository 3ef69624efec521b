"""Linear layers on the decode fast path, and merging Linears that read the same input into one
(one GEMM instead of several)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hotspec.layers import deterministic, fused
from hotspec.layers.norm import RMSNorm


def linear(lin: nn.Linear, x: torch.Tensor, heuristic: bool = True) -> torch.Tensor:
    """lin(x) (x [..., in]) on CUDA in bf16: 2..fused.ROW_GEMV_MAX rows as one-row GEMVs side by
    side; for 2..16 rows the Triton GEMM of a few rows (layers/rows_kernel.py) where
    fused.rows_config takes the shape, else the Triton GEMV where it measured faster than cuBLAS
    (one row, or the split-K GEMV of the 8B o and down projections at 2..16 rows); else
    nn.Linear. A bias (Qwen2's qkv) rides the Triton kernels' epilogue. heuristic=False
    (the LM head): table rows of the GEMV only. The deterministic mode: the tiled GEMM at every
    row count, bias included."""
    det = exact_linear(lin, x)
    if det is not None:
        return det
    bias = lin.bias
    per_row = fused.row_gemv_config(x, lin.weight) if heuristic else None
    if per_row is not None:
        return fused.gemv(x, lin.weight, per_row, per_row=True, bias=bias)
    rows = fused.rows_config(x, lin.weight) if heuristic else None
    if rows is not None:
        return fused.rows_linear(x, lin.weight, rows, bias=bias)
    cfg = fused.gemv_config(x, lin.weight, heuristic=heuristic)
    if cfg is None or (bias is not None and cfg.PIPE == 0):  # (the resident GEMV has no bias)
        return lin(x)
    return fused.gemv(x, lin.weight, cfg, bias=bias)


def exact_linear(lin: nn.Linear, x: torch.Tensor) -> torch.Tensor | None:
    """lin(x) through the batch-invariant GEMM in the deterministic mode (layers/deterministic.py)
    where the fused kernels run on x, else None."""
    if not deterministic.on():
        return None
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    cfg = fused.deterministic_config(x2, lin.weight)
    if cfg is None:
        return None
    return fused.rows_linear(x2, lin.weight, cfg, bias=lin.bias).view(*x.shape[:-1], -1)


def plain_linear(lin: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """nn.Linear's own call (cuBLAS on CUDA), except in the deterministic mode (`exact_linear`):
    the draft heads' fc and LM head."""
    det = exact_linear(lin, x)
    return lin(x) if det is None else det


def norm_linear(norm: RMSNorm, lin: nn.Linear, x: torch.Tensor, residual: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(lin(norm(x + residual)), x + residual) for [T, H] x (residual None: lin(norm(x)), x): the
    pre-norm step and the projection after it (and its bias). One kernel for one row (or
    2..fused.ROW_GEMV_MAX rows side by side) where the GEMV runs
    (layers/norm_gemv_kernel.norm_gemv); else the norm, then `linear`."""
    cfg = fused.norm_gemv_config(x, lin.weight, norm.weight)
    if cfg is not None:
        return fused.norm_gemv(x, residual, norm.weight, norm.eps, lin.weight, cfg, lin.bias)
    if residual is None:
        return linear(lin, norm(x)), x
    y, stream = norm.add_forward(x, residual)
    return linear(lin, y), stream


def norm_mlp(norm: RMSNorm, gate_up: nn.Linear, down: nn.Linear, x: torch.Tensor,
             residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(down(silu(gate) * up) of norm(x + residual), x + residual) for a fused [gate | up]
    projection: the pre-norm step and the MLP. For 2..16 rows gate_up and silu * up are one
    Triton GEMM (layers/rows_kernel.py, glu) where it runs (in the deterministic mode at every
    row count); else `norm_linear`, then `silu_mul_linear` (one row: the norm folds into gate_up
    and silu * up into down)."""
    few = fused.row_gemv_config(x, gate_up.weight) is not None  # (then norm_linear takes them)
    rows = fused.rows_config(x, gate_up.weight, glu=True) \
        if gate_up.bias is None and not few else None
    if rows is not None:
        if residual is None:
            h, stream = norm(x), x
        else:
            h, stream = norm.add_forward(x, residual)
        return linear(down, fused.rows_linear(h, gate_up.weight, rows, glu=True)), stream
    y, stream = norm_linear(norm, gate_up, x, residual)
    return silu_mul_linear(down, y), stream


def silu_mul_linear(lin: nn.Linear, gate_up: torch.Tensor) -> torch.Tensor:
    """lin(silu(gate) * up) for a fused gate_up output [T, 2I]: one GEMV that applies silu * up
    as it reads its input where that measured fastest, else the fused silu_mul kernel (CUDA) or
    torch, then `linear`."""
    per_row = fused.row_gemv_config(gate_up, lin.weight, silu_mul=True)
    if per_row is not None:
        return fused.gemv(gate_up, lin.weight, per_row, silu_mul=True, per_row=True, bias=lin.bias)
    cfg = fused.gemv_config(gate_up, lin.weight, silu_mul=True)
    if cfg is not None and (lin.bias is None or cfg.PIPE != 0):
        return fused.gemv(gate_up, lin.weight, cfg, silu_mul=True, bias=lin.bias)
    if gate_up.dim() == 2 and fused.enabled(gate_up):
        return linear(lin, fused.silu_mul(gate_up))
    gate, up = gate_up.chunk(2, dim=-1)
    return linear(lin, F.silu(gate) * up)


def merge_linears(*linears: nn.Linear) -> nn.Linear:
    """One Linear whose output is the concatenation of `linears`' outputs (same input size,
    dtype and device; biases all present or all absent). The parts' weights are copied."""
    first = linears[0]
    if any(lin.in_features != first.in_features for lin in linears):
        raise ValueError("merge_linears: every part must read the same input size")
    has_bias = [lin.bias is not None for lin in linears]
    if any(has_bias) != all(has_bias):
        raise ValueError("merge_linears: biases must be all present or all absent")
    w = first.weight
    out = sum(lin.out_features for lin in linears)
    with torch.device("meta"):
        merged = nn.Linear(first.in_features, out, bias=has_bias[0])
    merged.weight = nn.Parameter(torch.cat([lin.weight.detach() for lin in linears]),
                                 requires_grad=w.requires_grad)
    if has_bias[0]:
        merged.bias = nn.Parameter(torch.cat([lin.bias.detach() for lin in linears]),
                                   requires_grad=w.requires_grad)
    return merged
