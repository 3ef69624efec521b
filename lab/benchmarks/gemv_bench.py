"""Decode GEMV: hotspec's Triton kernel (layers/gemv_kernels.py) against cuBLAS (F.linear), CUDA only.

    python lab/benchmarks/gemv_bench.py --shapes 8b,smol --m 1,8,16 --out gemv_h200.json
    python lab/benchmarks/gemv_bench.py --quick          # small config grid, a first look

Per (shape, M) it times F.linear (for the silu_mul down projections: fused_kernels.silu_mul then
F.linear, the engine's two kernels, and F.linear alone) and every Triton config of a pruned sweep
(phase 1: tiles, split-K and warps at num_stages=3; phase 2: stages 2 and 4 for the best two). A
config is timed only after its output matched the fp32 reference; failures are reported.

Timing: the weights are `copies` distinct tensors totalling >= ~1 GB (at most 512 copies: >= 340
MB for SmolLM2's; either way the 50 MB L2 never holds the next one). One call per copy is captured
in a CUDA graph in sequence, like the layers of a decode step, and a replay is timed with CUDA
events (median of REPS). Per-call time includes the in-graph launch gap, not Python. TB/s counts
weight bytes only. The sweep compiles ~250 kernel variants on a first run (Triton caches them).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict

import torch
import torch.nn.functional as F

from hotspec.layers.fused_kernels import silu_mul
from hotspec.layers.gemv_kernels import GemvConfig, bucket, gemv
from hotspec.runtime.timing import graph_replay_ms

SHAPES = {  # name, N, K, silu_mul (down: x is the [M, 2K] gate_up output)
    "8b": [("8b.qkv", 6144, 4096, False), ("8b.o", 4096, 4096, False),
           ("8b.gate_up", 28672, 4096, False), ("8b.down", 4096, 14336, True)],
    "smol": [("smol.qkv", 960, 576, False), ("smol.o", 576, 576, False),
             ("smol.gate_up", 3072, 576, False), ("smol.down", 576, 1536, True)],
}
REPS = 15
COPIES_CAP = 512  # SmolLM2 matrices: 512 x 0.7-3.5 MB is still 7x+ the L2
SMEM = 200 * 1024  # bytes of pipelined tiles the tl.dot path may stage


def grid(m: int, n: int, k: int, silu: bool, quick: bool, sms: int) -> list[GemvConfig]:
    """Phase-1 configs (num_stages=3), pruned: one 16-byte vector per thread per tile at least,
    at most 64 (M == 1: the fp32 accumulator tile) / 128 weight elements per thread, split-K
    only while there are fewer than two column tiles per SM, at most four programs per SM, and
    >= 2 K tiles per slice. BLOCK_N=128 only for silu_mul at M > 1 (each program recomputes
    silu(gate) * up for all 16 rows of its K range: wider column blocks amortise it)."""
    bns = (16, 32) if quick else (8, 16, 32, 64) + ((128,) if m > 1 and silu else ())
    bks = (256, 512) if quick else (128, 256, 512)
    out = []
    for bn, bk, split, nw in itertools.product(bns, bks, (1, 2) if quick else (1, 2, 4),
                                               (4,) if quick else (4, 8)):
        per_thread = bn * bk / (32 * nw)
        if (m > 1 and bn < 16) or bk > 2 * k or per_thread < 8 or per_thread > (64 if m == 1 else 128):
            continue
        tiles = math.ceil(n / bn)
        if split > 1 and (tiles >= 2 * sms or tiles * split > 4 * sms or k / split < 2 * bk):
            continue
        out.append(GemvConfig(bn, bk, split, nw, 3))
    return out


def fits(cfg: GemvConfig, m: int) -> bool:
    return m == 1 or cfg.num_stages * (16 + cfg.BLOCK_N) * cfg.BLOCK_K * 2 <= SMEM


def graph_us(call: Callable[[int], object], copies: int) -> float:
    """Median per-call microseconds of a CUDA graph of call(0), ..., call(copies - 1)."""
    call(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(copies):
            call(i)
    us = graph_replay_ms(graph, REPS) * 1e3 / copies
    del graph
    return us


def per_m(bench: Callable[..., dict], line: Callable[[dict], str]
          ) -> Callable[[tuple, list[int]], list[dict]]:
    """shape_sweep's `run` for a benchmark of one (projection, M): bench(*shape, m) at each M,
    each row printed as line(row)."""
    def run(shape: tuple, ms: list[int]) -> list[dict]:
        rows = []
        for m in ms:
            rows.append(bench(*shape, m))
            print(line(rows[-1]), flush=True)
        return rows
    return run


def shape_sweep(doc: str, shapes: dict[str, list], default_shapes: str, default_m: str,
                header: str, run: Callable[[tuple, list[int]], list[dict]]) -> None:
    """The lab's projection benchmarks' command line: --shapes (groups of `shapes`), --m (row
    counts), --out (JSON); `run(shape, ms)` measures one projection at every M and returns its
    rows, which are written to --out."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--shapes", default=default_shapes)
    p.add_argument("--m", default=default_m)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    ms = [int(v) for v in args.m.split(",")]
    if header:
        print(header)
    rows: list[dict] = []
    for group in args.shapes.split(","):
        for shape in shapes[group]:
            rows += run(shape, ms)
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


def label(cfg: GemvConfig) -> str:
    return f"{cfg.BLOCK_N}x{cfg.BLOCK_K} s{cfg.SPLIT_K} w{cfg.num_warps} st{cfg.num_stages}"


def bench_m(name: str, ws: list[torch.Tensor], m: int, silu: bool, quick: bool, sms: int) -> dict:
    """One (shape, M) row: cuBLAS, then the sweep, fastest config first in `best`."""
    n, k = ws[0].shape
    copies, wbytes = len(ws), n * k * 2
    x = torch.randn(m, 2 * k if silu else k, device=ws[0].device, dtype=torch.bfloat16)
    h = silu_mul(x) if silu else x
    ref = F.linear(h.float(), ws[0].float())
    row: dict = {"shape": name, "N": n, "K": k, "M": m, "silu_mul": silu, "copies": copies,
                 "weight_bytes": wbytes, "failed": {}}
    if silu:
        row["cublas_us"] = graph_us(lambda i: F.linear(silu_mul(x), ws[i]), copies)
        row["cublas_linear_only_us"] = graph_us(lambda i: F.linear(h, ws[i]), copies)
    else:
        row["cublas_us"] = graph_us(lambda i: F.linear(x, ws[i]), copies)
    timed: dict[str, tuple[GemvConfig, float]] = {}

    def run(cfg: GemvConfig) -> None:
        try:
            y = gemv(x, ws[0], silu_mul=silu, config=cfg)
            bad = ((y.float() - ref).abs() > 1e-2 + 1.6e-2 * ref.abs()).sum().item()
            if bad:
                row["failed"][label(cfg)] = f"{bad} outputs off the reference"
                return
            timed[label(cfg)] = (cfg, graph_us(lambda i: gemv(x, ws[i], silu_mul=silu, config=cfg),
                                               copies))
        except Exception as e:  # compile errors (out of resources): report, go on
            row["failed"][label(cfg)] = f"{type(e).__name__}: {str(e)[:100]}"

    for cfg in grid(m, n, k, silu, quick, sms):
        run(cfg)
    if not quick:  # phase 2: pipeline depth for the two best
        for cfg, _ in sorted(timed.values(), key=lambda c: c[1])[:2]:
            for st in (2, 4):
                alt = GemvConfig(cfg.BLOCK_N, cfg.BLOCK_K, cfg.SPLIT_K, cfg.num_warps, st)
                if fits(alt, m):
                    run(alt)
    row["configs"] = {lab: us for lab, (_, us) in sorted(timed.items(), key=lambda t: t[1][1])}
    row["cublas_tbs"] = wbytes / row["cublas_us"] / 1e6
    if timed:
        cfg, us = min(timed.values(), key=lambda c: c[1])
        row.update(best=label(cfg), best_config=asdict(cfg), triton_us=us,
                   triton_tbs=wbytes / us / 1e6, speedup=row["cublas_us"] / us)
    print(f"{name} M={m}: cuBLAS {row['cublas_us']:.1f} us, best {row.get('best')} "
          f"{row.get('triton_us', float('nan')):.1f} us, {len(timed)} timed, "
          f"{len(row['failed'])} failed", flush=True)
    return row


def bench_shape(name: str, n: int, k: int, silu: bool, ms: list[int], quick: bool) -> list[dict]:
    """Rows for every M of one weight shape, sharing `copies` distinct weights of >= ~1 GB."""
    copies = min(COPIES_CAP, max(8, math.ceil(1e9 / (n * k * 2))))
    gen = torch.Generator(device="cuda").manual_seed(0)
    ws = [torch.randn(n, k, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.02
          for _ in range(copies)]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = [bench_m(name, ws, m, silu, quick, sms) for m in ms]
    ws.clear()
    torch.cuda.empty_cache()
    return rows


def report(rows: list[dict]) -> None:
    """The compact table, failures, and a CONFIGS table to paste into gemv_kernels."""
    print(f"{'shape':13} {'M':>2} {'cuBLAS us':>9} {'TB/s':>5}  {'best Triton config':22} "
          f"{'us':>7} {'TB/s':>5} {'speedup':>7}")
    for r in rows:
        print(f"{r['shape']:13} {r['M']:>2} {r['cublas_us']:9.1f} {r['cublas_tbs']:5.2f}  "
              f"{r.get('best', '-'):22} {r.get('triton_us', float('nan')):7.1f} "
              f"{r.get('triton_tbs', float('nan')):5.2f} {r.get('speedup', float('nan')):7.2f}")
        for lab, why in r["failed"].items():
            print(f"    failed {lab}: {why}")
    print("\n# gemv_kernels.CONFIGS candidates (measured best; keep the wins):")
    for r in rows:
        if "best_config" in r and bucket(r["M"]) == r["M"]:
            c = r["best_config"]
            print(f"    ({r['M']}, {r['N']}, {r['K']}, {r['silu_mul']}): GemvConfig({c['BLOCK_N']}, "
                  f"{c['BLOCK_K']}, {c['SPLIT_K']}, {c['num_warps']}, {c['num_stages']}),  "
                  f"# {r['shape']} {r['speedup']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="8b,smol", help="comma list of: " + ",".join(SHAPES))
    ap.add_argument("--m", default="1,8,16", help="batch rows (1..16)")
    ap.add_argument("--quick", action="store_true", help="small config grid")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gemv_bench needs a CUDA GPU")
    ms = [int(v) for v in args.m.split(",")]
    t0 = time.time()
    rows = [r for key in args.shapes.split(",") for shape in SHAPES[key]
            for r in bench_shape(*shape, ms, args.quick)]
    print(f"\n{torch.cuda.get_device_name()}, {time.time() - t0:.0f} s")
    report(rows)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
