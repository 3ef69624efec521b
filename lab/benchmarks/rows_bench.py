"""The Linears of a few token rows (verify, draft_extend): hotspec's kernels against the kernels
they replace, CUDA only.

    python lab/benchmarks/rows_bench.py --shapes 8b,smol --m 4,8,16

Per (shape, M):
- the pre-norm projections (qkv; gate_up with silu * up): fused_kernels.rms_norm, then
  layers/rows_kernel.rows_linear over a config grid (--quick: the chosen config), against
  fused_kernels.rms_norm, then cuBLAS (then fused_kernels.silu_mul);
- the plain projections after them (o, down on silu(gate) * up): rows_linear at its chosen config
  and layers/gemv_kernels.gemv at the GEMV table's row (--gemv-grid: gemv_bench's config grid)
  against cuBLAS.
Every candidate's output is checked against the fp32 reference before it is timed. Timing as in
lab/benchmarks/gemv_bench.py: one call per distinct weight copy (>= ~1 GB of them) in one CUDA graph,
the median replay over the copies; per-call microseconds include the in-graph launch gap.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math

import torch
import torch.nn.functional as F
from gemv_bench import graph_us, label
from gemv_bench import grid as gemv_grid

from hotspec.layers.fused_kernels import rms_norm, silu_mul
from hotspec.layers.gemv_kernels import CONFIGS as TABLE
from hotspec.layers.gemv_kernels import GemvConfig, bucket, gemv
from hotspec.layers.rows_kernel import MAX_ROWS, choose, rows_linear

# name, weight rows, K, kind: "norm" (rows_linear), "glu" (rows_linear, [gate | up]), "plain" (gemv)
SHAPES = {
    "8b": [("8b.qkv", 6144, 4096, "norm"), ("8b.gate_up", 28672, 4096, "glu"),
           ("8b.o", 4096, 4096, "plain"), ("8b.down", 4096, 14336, "plain")],
    "smol": [("smol.qkv", 960, 576, "norm"), ("smol.gate_up", 3072, 576, "glu"),
             ("smol.o", 576, 576, "plain"), ("smol.down", 576, 1536, "plain")],
}


def rows_grid(k: int, glu: bool) -> list[GemvConfig]:
    bns = (16, 32, 64) if glu else (32, 64, 128)
    bks = [b for b in (64, 128, 256) if b <= 2 * k]
    return [GemvConfig(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=st)
            for bn, bk, nw, st in itertools.product(bns, bks, (4,), (3, 4)) if bn * bk / (32 * nw) >= 8]


def rows_label(c: GemvConfig) -> str:
    return f"{c.BLOCK_N}x{c.BLOCK_K} w{c.num_warps} st{c.num_stages}"


def bench(name: str, n_rows: int, k: int, kind: str, m: int, ws: list[torch.Tensor],
          args_full: bool = False, quick: bool = False) -> dict:
    dev = ws[0].device
    copies = len(ws)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    r = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    g = (1 + 0.1 * torch.randn(k, device=dev)).to(torch.bfloat16)
    glu = kind == "glu"
    row: dict = {"shape": name, "M": m, "kind": kind, "failed": {}, "configs": {}}
    if kind == "plain":
        ref = F.linear(x.float(), ws[0].float())
        row["base_us"] = graph_us(lambda i: F.linear(x, ws[i]), copies)
        def plain(cfg: GemvConfig, i: int) -> torch.Tensor:
            return gemv(x, ws[i], config=cfg)

        def rows(cfg: GemvConfig, i: int) -> torch.Tensor:
            return rows_linear(x, ws[i], cfg)

        cands = [("*rows " + rows_label(choose(n_rows, k, False)),
                  functools.partial(rows, choose(n_rows, k, False)))] if m <= MAX_ROWS else []
        if args_full and m <= 16:
            cands += [(label(c), functools.partial(plain, c))
                      for c in gemv_grid(m, n_rows, k, False, True, 132)]
        elif m <= 16 and (bucket(m), n_rows, k, False) in TABLE:
            c = TABLE[(bucket(m), n_rows, k, False)]
            cands.append(("table " + label(c), functools.partial(plain, c)))
    else:
        def separate(i: int) -> torch.Tensor:
            y = F.linear(rms_norm(x, g, 1e-5, r)[0], ws[i])
            return silu_mul(y) if glu else y

        ref = separate(0).float()
        row["base_us"] = graph_us(separate, copies)
        heur = choose(n_rows // 2 if glu else n_rows, k, glu)
        def fused(cfg: GemvConfig, i: int) -> torch.Tensor:
            return rows_linear(rms_norm(x, g, 1e-5, r)[0], ws[i], cfg, glu=glu)

        grid = [heur] if quick else rows_grid(k, glu)
        cands = [(("*" if c == heur else "") + rows_label(c), functools.partial(fused, c)) for c in grid]
    for lab, call in cands:
        try:
            out = call(0).float()
            if ((out - ref).norm() / ref.norm()).item() > 2e-2:
                row["failed"][lab] = "off the reference"
                continue
            row["configs"][lab] = graph_us(call, copies)
        except Exception as e:  # out of resources: report, go on
            row["failed"][lab] = f"{type(e).__name__}: {str(e)[:80]}"
    if row["configs"]:
        best = min(row["configs"], key=row["configs"].get)
        row.update(best=best, best_us=row["configs"][best])
        heur = [v for lab_, v in row["configs"].items() if lab_.startswith("*")]
        row["heuristic_us"] = heur[0] if heur else None
    print(f"{name} M={m}: base {row['base_us']:.1f} us, best {row.get('best')} "
          f"{row.get('best_us', float('nan')):.1f} us, heuristic {row.get('heuristic_us')}", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="8b,smol")
    ap.add_argument("--m", default="4,8,16")
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true",
                    help="pre-norm projections: only the chosen config")
    ap.add_argument("--gemv-grid", action="store_true",
                    help="plain projections: gemv_bench's config grid, not only the GEMV table's row")
    args = ap.parse_args()
    ms = [int(v) for v in args.m.split(",")]
    rows = []
    for group in args.shapes.split(","):
        for name, n_rows, k, kind in SHAPES[group]:
            copies = min(512, max(8, math.ceil(1e9 / (n_rows * k * 2))))
            gen = torch.Generator(device="cuda").manual_seed(0)
            ws = [(torch.randn(n_rows, k, device="cuda", generator=gen) / k ** 0.5).to(torch.bfloat16)
                  for _ in range(copies)]
            rows += [bench(name, n_rows, k, kind, m, ws, args.gemv_grid, args.quick) for m in ms]
            del ws
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"\n{'shape':13} {'M':>3} {'base us':>8} {'best us':>8} {'x':>5} {'heur us':>8}  best")
    for r in rows:
        b = r.get("best_us", float("nan"))
        h = r.get("heuristic_us") or float("nan")
        print(f"{r['shape']:13} {r['M']:>3} {r['base_us']:8.1f} {b:8.1f} {r['base_us'] / b:5.2f} "
              f"{h:8.1f}  {r.get('best')}")


if __name__ == "__main__":
    main()
