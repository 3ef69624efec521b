"""Does the weight's memory layout limit a batch-1 GEMV's bandwidth? (issue 5's 90 % target)

The engine's GEMV (layers/gemv_kernels.py) reads W [N, K] row-major: a program's tile of BLOCK_N
rows x BLOCK_K columns is BLOCK_N separate runs of 2 * BLOCK_K bytes, N * 2 * K... apart. Stored
tiled instead ([N / BLOCK_N, K / BLOCK_K, BLOCK_N, BLOCK_K], each program's whole panel one
contiguous run), every load is one contiguous stretch. This benchmark times, on one matrix shape,
one minimal GEMV kernel over both layouts (the only difference is the address of a tile), the
engine's own GEMV on the row-major weight, and a pure read of the tiled weight (no x, no
products), each as 20 launches in one CUDA graph, and prints TB/s of weight bytes:

    python benchmarks/weight_layout_bench.py --shapes 28672x4096,4096x14336

Results are checked against torch (fp32 matmul of the same bf16 values) before timing.

Measured on the H200 (RESULTS "Session 17"): alone, the tiled layout streams ~4 % faster with the
same kernel (gate_up 4 x 1024: 4.20 -> 4.36 TB/s; down: 4.09 -> 4.27), but the engine's 8B
decode step, its GEMVs reading tiled copies (code at fdbba10, HOTSPEC_GEMV_TILED), was no faster
(3.99 against 3.95 ms; per shape at best a tie), so the engine keeps row-major weights.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import torch
import triton
import triton.language as tl

from hotspec.benchmark.device import device_name, graph_replay_ms
from hotspec.layers import triton_interpret  # noqa: F401  (the interpreter fix)


@triton.jit
def layout_gemv(X, W, Y, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                TILED: tl.constexpr, READ_ONLY: tl.constexpr):
    """y[n] = sum_k W[n, k] x[k] for this program's BLOCK_N rows; W row-major (TILED False) or
    tiled (TILED True: tile (p, j) at element (p * K / BLOCK_K + j) * BLOCK_N * BLOCK_K).
    READ_ONLY: sum the weights alone (no x), the layout's streaming bound."""
    pid = tl.program_id(0)
    r = tl.arange(0, BLOCK_N)
    c = tl.arange(0, BLOCK_K)
    rows = pid * BLOCK_N + r
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if TILED:
            base = (pid.to(tl.int64) * (K // BLOCK_K) + k // BLOCK_K) * (BLOCK_N * BLOCK_K)
            w = tl.load(W + base + r[:, None] * BLOCK_K + c[None, :], eviction_policy="evict_first")
        else:
            w = tl.load(W + rows[:, None].to(tl.int64) * K + (k + c)[None, :],
                        eviction_policy="evict_first")
        if READ_ONLY:
            acc += w.to(tl.float32)
        else:
            acc += w.to(tl.float32) * tl.load(X + k + c)[None, :].to(tl.float32)
    tl.store(Y + rows, tl.sum(acc, 1).to(Y.dtype.element_ty))


@triton.jit
def rows_gemv(X, W, Y, N, K, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """Row-major W, each program's ROWS rows read one after another in [1, BLOCK_K] tiles: the
    same contiguous stream as the tiled layout, without changing the layout."""
    pid = tl.program_id(0)
    c = tl.arange(0, BLOCK_K)
    for i in tl.static_range(ROWS):
        row = pid * ROWS + i
        acc = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            w = tl.load(W + row.to(tl.int64) * K + k + c, eviction_policy="evict_first")
            acc += w.to(tl.float32) * tl.load(X + k + c).to(tl.float32)
        tl.store(Y + row, tl.sum(acc, 0).to(Y.dtype.element_ty))


def run_rows(x: torch.Tensor, w: torch.Tensor, rows: int, block_k: int,
             num_warps: int = 4) -> torch.Tensor:
    n, k = w.shape
    y = torch.empty(n, dtype=x.dtype, device=x.device)
    rows_gemv[(n // rows,)](x, w, y, n, k, ROWS=rows, BLOCK_K=block_k, num_warps=num_warps)
    return y


def tiled(w: torch.Tensor, block_n: int, block_k: int) -> torch.Tensor:
    """W [N, K] -> [N / block_n, K / block_k, block_n, block_k], contiguous."""
    n, k = w.shape
    return w.view(n // block_n, block_n, k // block_k, block_k).permute(0, 2, 1, 3).contiguous()


def run_layout(x: torch.Tensor, w: torch.Tensor, block_n: int, block_k: int, tiled_w: bool,
               read_only: bool = False, num_warps: int = 4) -> torch.Tensor:
    n, k = (w.shape[0] * w.shape[2], w.shape[1] * w.shape[3]) if tiled_w else w.shape
    y = torch.empty(n, dtype=x.dtype, device=x.device)
    layout_gemv[(n // block_n,)](x, w, y, n, k, BLOCK_N=block_n, BLOCK_K=block_k, TILED=tiled_w,
                                 READ_ONLY=read_only, num_warps=num_warps)
    return y


def check(n: int, k: int, block_n: int, block_k: int, device: torch.device) -> None:
    """Both layouts give torch's y (fp32 products of the same bf16 values) up to rounding."""
    g = torch.Generator(device="cpu").manual_seed(0)
    w = torch.randn(n, k, generator=g).to(torch.bfloat16).to(device)
    x = torch.randn(k, generator=g).to(torch.bfloat16).to(device)
    want = (w.float() @ x.float())
    for t in (False, True, None):
        if t is None:
            got = run_rows(x, w, block_n, block_k).float()
        else:
            got = run_layout(x, tiled(w, block_n, block_k) if t else w, block_n, block_k, t).float()
        err = ((got - want).norm() / want.norm()).item()
        if err > 1e-2:
            raise AssertionError(f"layout_gemv tiled={t} {n}x{k}: relative error {err:.3g}")


def graph_us(fn, launches: int = 20, reps: int = 7) -> float:
    """Median us per launch of `launches` calls of fn captured in one CUDA graph."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    return graph_replay_ms(graph, reps) * 1e3 / launches


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="28672x4096,4096x14336", help="NxK,...")
    p.add_argument("--tiles", default="8x512,4x1024,16x256,8x1024", help="BLOCK_NxBLOCK_K,...")
    p.add_argument("--rows", default="", help="ROWSxBLOCK_K,... for rows_gemv (row-major, rows in turn)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("weight_layout_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    from hotspec.layers.gemv_kernels import gemv

    dev = torch.device("cuda")
    print(f"{device_name(dev)}; bf16, one row; us per launch (20 launches in a CUDA "
          "graph, median of 7) and TB/s of weight bytes")
    print(f"{'shape':>12} {'kernel':<34} {'us':>8} {'TB/s':>6}")
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        w = torch.randn(n, k, device=dev).to(torch.bfloat16)
        x = torch.randn(1, k, device=dev).to(torch.bfloat16)
        rate = w.numel() * 2 / 1e6  # weight MB: MB / us = TB/s
        us = graph_us(partial(gemv, x, w, use_pdl=False))
        print(f"{shape:>12} {'engine gemv (row-major, no PDL)':<34} {us:8.2f} {rate / us:6.2f}")
        for tile in args.tiles.split(","):
            bn, bk = (int(v) for v in tile.split("x"))
            check(256, 2048, bn, bk, dev)
            wt = tiled(w, bn, bk)
            for warps in (4, 8):
                for name, fn in ((f"{bn}x{bk} w{warps} row-major", partial(
                                     run_layout, x[0], w, bn, bk, False, num_warps=warps)),
                                 (f"{bn}x{bk} w{warps} tiled", partial(
                                     run_layout, x[0], wt, bn, bk, True, num_warps=warps)),
                                 (f"{bn}x{bk} w{warps} tiled, read only", partial(
                                     run_layout, x[0], wt, bn, bk, True, True, num_warps=warps))):
                    us = graph_us(fn)
                    print(f"{shape:>12} {name:<34} {us:8.2f} {rate / us:6.2f}", flush=True)
            del wt
        for tile in filter(None, args.rows.split(",")):
            r, bk = (int(v) for v in tile.split("x"))
            check(256, 2048, r, min(bk, 2048), dev)
            for warps in (4, 8):
                us = graph_us(partial(run_rows, x[0], w, r, bk, num_warps=warps))
                name = f"{r} rows in turn x {bk} w{warps} row-major"
                print(f"{shape:>12} {name:<34} {us:8.2f} {rate / us:6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
