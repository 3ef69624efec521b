"""What the deterministic mode's Linear costs: the engine's default dispatch (GEMV at one row,
the few-row GEMM at 2..16, cuBLAS above; layers/linear.py) against the tiled GEMM at every row
count (layers/rows_kernel.py, the mode's kernel), CUDA only. Variants: `det` (the mode's config,
rows_kernel.deterministic_config, 16-row tiles), `det64` (the same, 64-row tiles), `nosplit`
(its tiles without the split-K it gives large narrow weights), `n32` (32 columns a program, no
split: twice the programs of a 64-column config).

    python lab/benchmarks/det_linear_bench.py [--shapes 8b,smol] [--m 1,8,32,64,512]

Per (projection, M): microseconds a call (lab/benchmarks/gemv_bench.py's timing: one call per
weight copy, >= ~1 GB of them, in one CUDA graph) and each variant's ratio to the default; every
variant is first checked against the fp32 reference and for a row bit for bit alike alone and
among the M (the property the mode rests on).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from gemv_bench import graph_us, per_m, shape_sweep

from hotspec.layers import deterministic
from hotspec.layers.linear import linear
from hotspec.layers.rows_kernel import choose, deterministic_config, rows_linear

SHAPES = {  # name, weight rows, K, glu ([gate | up] with silu * up in the epilogue)
    "8b": [("8b.qkv", 6144, 4096, False), ("8b.gate_up", 28672, 4096, True),
           ("8b.o", 4096, 4096, False), ("8b.down", 4096, 14336, False),
           ("8b.lm_head", 128256, 4096, False)],
    "smol": [("smol.qkv", 960, 576, False), ("smol.gate_up", 3072, 576, True),
             ("smol.o", 576, 576, False), ("smol.down", 576, 1536, False),
             ("smol.lm_head", 49152, 576, False)],
}


def bench(name: str, n: int, k: int, glu: bool, m: int) -> dict:
    copies = max(2, min(64, (1 << 30) // (n * k * 2)))
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    lins = []
    for w in ws:
        lin = torch.nn.Linear(k, n, bias=False, device="meta")
        lin.weight = torch.nn.Parameter(w, requires_grad=False)
        lins.append(lin)
    ref = F.linear(x.float(), ws[0].float())
    if glu:
        gate, up = ref.chunk(2, dim=-1)
        ref = F.silu(gate) * up
    base = choose(n // 2 if glu else n, k, glu)
    variants = {"det": (deterministic_config(n // 2 if glu else n, k, glu), 16)}
    variants["det64"] = (variants["det"][0], 64)
    if variants["det"][0] != base:
        variants["nosplit"] = (base, 16)
    if base.BLOCK_N != 32:
        variants["n32"] = (replace(base, BLOCK_N=32), 16)
    row: dict = {"shape": name, "M": m, "N": n, "K": k,
                 "configs": {key: str(c) for key, (c, _) in variants.items()}}
    with torch.inference_mode():
        if not glu:  # (the engine's glu path is norm_mlp's; its plain gate_up is what cuBLAS does)
            row["default_us"] = graph_us(lambda i: linear(lins[i], x), copies)
        else:
            row["default_us"] = graph_us(lambda i: F.linear(x, ws[i]), copies)
        for key, (c, bm) in variants.items():
            def call(i: int, c=c, bm: int = bm) -> torch.Tensor:
                return rows_linear(x, ws[i], c, glu=glu, block_m=bm)
            y = call(0)
            alone = rows_linear(x[-1:].contiguous(), ws[0], c, glu=glu, block_m=bm)
            row[f"{key}_us"] = graph_us(call, copies)
            row[f"{key}_rel_err"] = round(((y.float() - ref).norm() / ref.norm()).item(), 5)
            row[f"{key}_row_invariant"] = bool(torch.equal(alone[0], y[-1]))
    with deterministic.mode(True), torch.inference_mode():  # what the engine's mode dispatches to
        if not glu:
            row["engine_det_us"] = graph_us(lambda i: linear(lins[i], x), copies)
    return row


def line(r: dict) -> str:
    d = r["default_us"]
    cols = "  ".join(f"{key} {r[key + '_us']:.1f} ({r[key + '_us'] / d:.2f})" for key in r["configs"])
    inv = all(v for key, v in r.items() if key.endswith("_row_invariant"))
    return f"{r['shape']:<14} {r['M']:>4} {d:>10.1f}  {cols}  {inv}"


if __name__ == "__main__":
    shape_sweep(__doc__, SHAPES, "8b,smol", "1,8,32,64,512",
                "projection        M  default us  variant us (x default) ... invariant",
                per_m(bench, line))
