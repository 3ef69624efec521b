"""Tuning the deterministic mode's GEMM (layers/rows_kernel.py): for each projection of the 8B's
and SmolLM2's shapes, every tile config (columns a program, K tile, split-K slices; stages as
`choose` fits them) at decode's row counts, against the engine's default dispatch
(layers/linear.py); CUDA only.

    python lab/benchmarks/det_tune.py [--shapes 8b,smol] [--m 1,8,32] [--out FILE]

Per projection: the mode's current config (rows_kernel.deterministic_config) and the five
configs of the lowest summed time over the row counts, each as microseconds a call per M and
its ratio to the default (lab/benchmarks/gemv_bench.py's timing: one call per weight copy in one
CUDA graph, cold weights). The mode needs one config for every row count, so the sum decides.
"""

from __future__ import annotations

import itertools

import torch
from det_linear_bench import SHAPES
from gemv_bench import graph_us, shape_sweep

from hotspec.layers.gemv_kernels import GemvConfig
from hotspec.layers.linear import linear
from hotspec.layers.rows_kernel import SMEM_BUDGET, deterministic_config, rows_linear, tile_rows


def configs(n: int, k: int, glu: bool) -> list[GemvConfig]:
    out = []
    for bn, bk, split in itertools.product((16, 32, 64), (128, 256), (1, 2, 4)):
        if bk > triton_pow2(k) or (split > 1 and k // split < bk) or (glu and bn == 64):
            continue
        stages = 4  # (rows_linear lowers it where a taller tile would not fit: tile_stages)
        while stages > 2 and stages * (16 + bn * (2 if glu else 1)) * bk * 2 > SMEM_BUDGET:
            stages -= 1
        out.append(GemvConfig(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_warps=4,
                              num_stages=stages))
    return out


def triton_pow2(x: int) -> int:
    return 1 << (x - 1).bit_length()


def tune(name: str, n_rows: int, k: int, glu: bool, ms: list[int]) -> dict:
    n = n_rows // 2 if glu else n_rows
    copies = max(2, min(32, (1 << 30) // (n_rows * k * 2)))
    ws = [torch.randn(n_rows, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
          for _ in range(copies)]
    xs = {m: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for m in ms}
    lins = []
    for w in ws:
        lin = torch.nn.Linear(k, n_rows, bias=False, device="meta")
        lin.weight = torch.nn.Parameter(w, requires_grad=False)
        lins.append(lin)

    def default_call(i: int, m: int) -> torch.Tensor:
        return linear(lins[i], xs[m])

    def det_call(i: int, m: int, c: GemvConfig) -> torch.Tensor:
        return rows_linear(xs[m], ws[i], c, glu=glu, block_m=tile_rows(m))

    with torch.inference_mode():
        default = {m: graph_us(lambda i, m=m: default_call(i, m), copies) for m in ms}
        rows = []
        for cfg in [deterministic_config(n, k, glu)] + configs(n, k, glu):
            try:
                us = {m: graph_us(lambda i, m=m, c=cfg: det_call(i, m, c), copies) for m in ms}
            except Exception as e:  # (a config the compiler refuses)
                print(f"  {name} {cfg}: {type(e).__name__}", flush=True)
                continue
            rows.append((sum(us.values()), cfg, us))
    cur, best = rows[0], sorted(rows[1:], key=lambda r: r[0])[:5]
    print(f"{name}: default " + "  ".join(f"M{m} {default[m]:6.1f}" for m in ms))
    for tag, (_, cfg, us) in [("current", cur)] + [("best", r) for r in best]:
        cols = "  ".join(f"M{m} {us[m]:6.1f} ({us[m] / default[m]:.2f})" for m in ms)
        print(f"  {tag:<8} {cfg.BLOCK_N:>3}x{cfg.BLOCK_K:<3} s{cfg.SPLIT_K} st{cfg.num_stages}  "
              f"{cols}", flush=True)
    return {"shape": name, "default": default, "current": [str(cur[1]), cur[2]],
            "best": [[str(c), us] for _, c, us in best]}


if __name__ == "__main__":
    shape_sweep(__doc__, SHAPES, "8b,smol", "1,8,32", "", lambda shape, ms: [tune(*shape, ms)])
