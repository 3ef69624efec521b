"""The pre-norm projections of a narrow model (SmolLM2, Qwen2.5-0.5B): what the default engine
runs (the residual add + RMSNorm kernel, then cuBLAS, then silu_mul for gate_up) against the norm
folded into the 16-row-tile GEMM (layers/norm_rows_kernel.py, which the deterministic mode runs at
every row count). Decides whether the default mode should fold too: at its few-row GEMM's 2..16
rows (`--m 2,4,8,16`), and at prefill chunks and verify batches of 17-512 rows. CUDA only.

    python lab/benchmarks/prenorm_bench.py [--shapes smol,qwen] [--m 16,32,64,128,256,512]

Per (projection, M): microseconds a call (lab/benchmarks/gemv_bench.py's timing: one call per
weight copy, >= ~1 GB of them, in one CUDA graph: weights from HBM, as in a forward pass) of the
engine's dispatch (`unfused`) and of the fold, the fold's ratio, and both outputs' error
against the fp32 reference. FOLD_TILES="BLOCK_K:num_stages:BLOCK_N ..." (environment) adds a
column per fold tiling (norm_rows_kernel's module constants), the engine's own last.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from gemv_bench import graph_us, per_m, shape_sweep

from hotspec.layers import norm_rows_kernel as nr
from hotspec.layers.fused_kernels import rms_norm, silu_mul
from hotspec.layers.norm_rows_kernel import norm_rows_linear

SHAPES = {  # name, weight rows, K, glu, bias
    "smol": [("smol.qkv", 960, 576, False, False), ("smol.gate_up", 3072, 576, True, False)],
    "qwen": [("qwen.qkv", 1152, 896, False, True), ("qwen.gate_up", 9728, 896, True, False)],
}
EPS = 1e-5
ENGINE = (nr.BLOCK_K, nr.NUM_STAGES, nr.BLOCK_N)
TILES = os.environ.get("FOLD_TILES", "").split()


def bench(name: str, n: int, k: int, glu: bool, has_bias: bool, m: int) -> dict:
    copies = max(2, min(64, (1 << 30) // (n * k * 2)))
    dev, dt = torch.device("cuda"), torch.bfloat16
    ws = [torch.randn(n, k, device=dev, dtype=dt) / k ** 0.5 for _ in range(copies)]
    bias = torch.randn(n, device=dev, dtype=dt) if has_bias else None
    x = torch.randn(m, k, device=dev, dtype=dt)
    res = torch.randn(m, k, device=dev, dtype=dt)
    g = (1 + 0.1 * torch.randn(k, device=dev)).to(dt)
    s = (x.float() + res.float())
    h = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS) * g.float()
    ref = F.linear(h, ws[0].float(), None if bias is None else bias.float())
    if glu:
        gate, up = ref.chunk(2, dim=-1)
        ref = F.silu(gate) * up

    def unfused(i: int) -> torch.Tensor:
        y, _ = rms_norm(x, g, EPS, residual=res)
        out = F.linear(y, ws[i], bias)
        return silu_mul(out) if glu else out

    def fold(i: int) -> torch.Tensor:
        return norm_rows_linear(x, res, g, EPS, ws[i], glu=glu, bias=bias)[0]

    row: dict = {"shape": name, "M": m, "N": n, "K": k}
    with torch.inference_mode():
        for tile in TILES:
            nr.BLOCK_K, nr.NUM_STAGES, nr.BLOCK_N = (int(v) for v in tile.split(":"))
            row[f"fold_{tile}_us"] = graph_us(fold, copies)
        nr.BLOCK_K, nr.NUM_STAGES, nr.BLOCK_N = ENGINE
        for key, call in (("unfused", unfused), ("fold", fold)):
            y = call(0)
            row[f"{key}_rel_err"] = round(((y.float() - ref).norm() / ref.norm()).item(), 5)
            row[f"{key}_us"] = graph_us(call, copies)
    row["fold_x"] = round(row["fold_us"] / row["unfused_us"], 3)
    return row


def line(r: dict) -> str:
    tiles = "".join(f"  {t} {r[f'fold_{t}_us']:.1f}" for t in TILES)
    return (f"{r['shape']:<14} {r['M']:>4} {r['unfused_us']:>10.1f} {r['fold_us']:>8.1f} "
            f"{r['fold_x']:>12.2f}  {r['unfused_rel_err']}, {r['fold_rel_err']}{tiles}")


if __name__ == "__main__":
    shape_sweep(__doc__, SHAPES, "smol,qwen", "16,32,64,128,256,512",
                "projection        M  unfused us  fold us  fold/unfused  rel err (unfused, fold)",
                per_m(bench, line))
