"""Does an L2 prefetch on a side stream make the next GEMV read from L2? (layers/l2_prefetch.py)

The engine's HOTSPEC_L2_PREFETCH forks a prefetch of a layer's o_proj weight (then the start of
gate_up) before RoPE, attention and combine, a latency-bound window of about 10 us per 8B layer.
This isolates the mechanism. Each variant is one CUDA graph, replayed; each starts with an L2
flush (a 256 MB copy), then a window in which HBM is idle (`torch.cuda._sleep`, a spin standing in
for attention), then the GEMV of one decode row (the engine's: Triton GEMV where it is faster,
else cuBLAS):

    baseline    flush, window
    cold        flush, window, GEMV
    prefetched  flush, fork the prefetch, window, join, GEMV
    fork only   flush, fork the prefetch, window, join

GEMV time = variant - baseline. "fork only" - baseline shows whether the prefetch outlasts the
window (the join then waits for it). Budget: HOTSPEC_L2_PREFETCH_FRACTION of L2, as in the engine.

    python benchmarks/l2_prefetch_bench.py --shapes 4096x4096,28672x4096 --windows-us 0,5,10,20
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from hotspec.benchmark.device import device_name, graph_replay_ms
from hotspec.layers import gemv_kernels, l2_prefetch


def _gemv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    cfg = gemv_kernels.choose(1, *w.shape)
    return gemv_kernels.gemv(x, w, config=cfg) if cfg is not None else F.linear(x, w)


def _graph(fn) -> torch.cuda.CUDAGraph:
    fn()  # warm-up: compiles kernels, creates the side stream
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def _spin_rate(iters: int) -> float:
    """`torch.cuda._sleep` cycles per us on this GPU, timed."""
    cycles = 2_000_000
    ms = graph_replay_ms(_graph(lambda: torch.cuda._sleep(cycles)), iters)
    return cycles / (ms * 1e3)


def measure(n: int, k: int, window_us: float, iters: int, cycles_per_us: float) -> dict[str, float]:
    dev = torch.device("cuda")
    w = (torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16)
    x = torch.randn(1, k, device=dev).to(torch.bfloat16)
    src = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    spin = int(window_us * cycles_per_us)

    def window() -> None:
        if spin:
            torch.cuda._sleep(spin)

    def prefetched(gemv: bool) -> None:
        dst.copy_(src)
        branch = l2_prefetch.fork([w], 1)
        window()
        l2_prefetch.join(branch)
        if gemv:
            _gemv(x, w)

    def cold() -> None:
        dst.copy_(src)
        window()
        _gemv(x, w)

    def baseline() -> None:
        dst.copy_(src)
        window()

    ms = {name: graph_replay_ms(_graph(fn), iters) for name, fn in (
        ("baseline", baseline), ("cold", cold), ("prefetched", lambda: prefetched(True)),
        ("fork only", lambda: prefetched(False)))}
    base = ms["baseline"]
    return {"n": n, "k": k, "window_us": window_us, "baseline_us": base * 1e3,
            "cold_us": (ms["cold"] - base) * 1e3, "prefetched_us": (ms["prefetched"] - base) * 1e3,
            "fork_only_us": (ms["fork only"] - base) * 1e3}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="4096x4096,28672x4096", help="weights N x K (bf16), comma-separated")
    p.add_argument("--windows-us", default="0,5,10,20", help="idle windows before the GEMV, in us")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU (the prefetch is inline PTX; the interpreter does not run it)")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    windows = [float(v) for v in args.windows_us.split(",")]
    os.environ["HOTSPEC_L2_PREFETCH"] = "1"  # what this script measures
    l2_prefetch.switched_on.cache_clear()
    cycles_per_us = _spin_rate(args.iters)
    rows = [measure(n, k, win, args.iters, cycles_per_us) for n, k in shapes for win in windows]
    print(f"{device_name(torch.device('cuda'))}; one bf16 row through N x K; us, each after a 256 MB L2 "
          f"flush and an idle window; L2 budget {l2_prefetch.budget_fraction():.2f} of L2")
    print(f"{'N x K':>12} {'MB':>6} {'window':>7} {'cold':>7} {'prefetched':>11} {'fork only':>10} "
          f"{'ratio':>6}")
    for r in rows:
        mb = r["n"] * r["k"] * 2 / 1e6
        ratio = r["prefetched_us"] / r["cold_us"] if r["cold_us"] > 0 else float("nan")
        print(f"{r['n']:>6}x{r['k']:<5} {mb:>6.1f} {r['window_us']:>7.1f} {r['cold_us']:>7.2f} "
              f"{r['prefetched_us']:>11.2f} {r['fork_only_us']:>10.2f} {ratio:>6.2f}")
    if args.out:
        args.out.write_text(json.dumps({"device": device_name(torch.device("cuda")), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
