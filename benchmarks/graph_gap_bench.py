"""What makes the launches in a CUDA graph start later after the kernel before?

Session 12 found (RESULTS "Session 12", calls 7-11) that with a two-kernel Triton argmax at the
end of the 8B decode graph every plain launch in the replay started 0.4-0.6 us after the kernel
before instead of 0.1 us (idle per replay 40 against 11 us), while extra torch kernels changed
nothing. This isolates it: a graph of N tiny torch kernels, then one extra kernel of each kind
(torch; Triton with 4 or 1 warps, a 1-D or 2-D grid, an int8 store, the PDL launch attribute),
replayed back to back. The table gives the replay time and the mean start-to-start time per
kernel; a property that widens every gap shows as a jump of (N x the gap change).

What it showed (RESULTS "Session 12", H200): no kernel kind matters. **The first graph captured
in the process** replays at 0.93 us per tiny kernel, every later one at 1.11 us, whichever
variant comes first (`--reverse` flips it), at 100, 200 and 300 kernels, though each graph is
destroyed before the next is captured.

    python3 benchmarks/graph_gap_bench.py [--kernels 200] [--replays 200] [--reverse | --pair | --study]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import triton
import triton.language as tl


@triton.jit
def _touch(X, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(X + offs, tl.load(X + offs, mask=ok) + 1, mask=ok)


@triton.jit
def _touch_i8(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(Y + offs, (tl.load(X + offs, mask=ok) > 0).to(tl.int8), mask=ok)


def variants(x: torch.Tensor, y8: torch.Tensor) -> dict[str, Callable[[], object]]:
    n = x.numel()
    return {
        "none": lambda: None,
        "torch add": lambda: x.add_(1),
        "triton 4 warps, grid (4,)": lambda: _touch[(4,)](x, n, BLOCK=1024, num_warps=4),
        "triton 1 warp, grid (4,)": lambda: _touch[(4,)](x, n, BLOCK=1024, num_warps=1),
        "triton 2-D grid (1, 4)": lambda: _touch[(1, 4)](x, n, BLOCK=1024, num_warps=4),
        "triton int8 store": lambda: _touch_i8[(4,)](x, y8, n, BLOCK=1024, num_warps=4),
        "triton launch_pdl": lambda: _touch[(4,)](x, n, BLOCK=1024, num_warps=4, launch_pdl=True),
        "triton 1 warp + 2-D": lambda: (_touch[(1, 4)](x, n, BLOCK=1024, num_warps=4),
                                        _touch[(1,)](x, n, BLOCK=1024, num_warps=1)),
    }


def time_replays(g: torch.cuda.CUDAGraph, replays: int, repeats: int = 5) -> float:
    """us per replay of `g`: 10 warm-up replays, then the best of `repeats` timings of `replays`
    back-to-back replays."""
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(replays):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) * 1e3 / replays)
    return best


def replay_us(n_kernels: int, extra: Callable[[], object], replays: int, body: str) -> float:
    x = torch.zeros(4096, device="cuda")

    def work() -> None:
        for _ in range(n_kernels):
            if body == "torch":
                x.add_(1)
            else:
                _touch[(4,)](x, x.numel(), BLOCK=1024, num_warps=4)
        extra()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        work()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        work()
    return time_replays(g, replays)


def pair(n_kernels: int, replays: int) -> list[str]:
    """Two identical graphs A and B (A captured first), both kept alive, timed B, A, B, A: is the
    fast one the first captured, the first replayed, or neither once both exist?"""
    xs = [torch.zeros(4096, device="cuda") for _ in range(2)]
    graphs = []
    for x in xs:
        for _ in range(n_kernels):  # warm up outside the capture
            x.add_(1)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n_kernels):
                x.add_(1)
        graphs.append(g)
    out = []
    for name in "BABA":
        us = time_replays(graphs["AB".index(name)], replays, repeats=1)
        out.append(f"pair: graph {name} ({'first' if name == 'A' else 'second'} captured) "
                   f"{us:.1f} us = {us / n_kernels:.3f} us / kernel")
    return out


# --study: each scenario in a fresh process (the effect is per process): what comes before the
# timed graph A of N tiny kernels
SCENARIOS = {
    "alone": "A is the process's only graph",
    "after-dummy": "a one-kernel graph captured, replayed and destroyed first",
    "after-dummy-kept": "a one-kernel graph captured and replayed first, kept alive",
    "after-dummy-unreplayed": "a one-kernel graph captured first, never replayed, destroyed",
    "after-dummy-priority": "as after-dummy, then A captured on a high-priority stream",
    "after-dummy-shared-pool": "as after-dummy-kept, A captured into the dummy's memory pool",
    "after-big": "a graph of N tiny kernels captured, replayed 1000 times and destroyed first",
    "after-big-kept": "as after-big, the graph kept alive",
    "after-big-unreplayed": "a graph of N tiny kernels captured first, never replayed, destroyed",
}


def scenario(name: str, n_kernels: int, replays: int) -> float:
    """A's replay time (us) after what scenario `name` does first."""
    x = torch.zeros(4096, device="cuda")
    stream, pool, keep = None, None, []
    if name != "alone":
        big = name.startswith("after-big")
        d = torch.cuda.CUDAGraph()
        with torch.cuda.graph(d):
            for _ in range(n_kernels if big else 1):
                x.add_(1)
        if not name.endswith("-unreplayed"):
            for _ in range(1000 if big else 1):
                d.replay()
        torch.cuda.synchronize()
        if name in ("after-dummy-kept", "after-dummy-shared-pool", "after-big-kept"):
            keep.append(d)
            pool = d.pool() if name == "after-dummy-shared-pool" else None
        else:
            del d
        if name == "after-dummy-priority":
            stream = torch.cuda.Stream(priority=-100)  # clamped to the highest priority
    for _ in range(n_kernels):
        x.add_(1)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool, stream=stream):
        for _ in range(n_kernels):
            x.add_(1)
    return time_replays(g, replays)


def study(n_kernels: int, replays: int) -> list[str]:
    """Every scenario in its own process: A's replay time and time per kernel."""
    import subprocess
    import sys

    rows = [f"{'scenario':<26} {'replay us':>10} {'us / kernel':>12}  what comes before A"]
    for name, what in SCENARIOS.items():
        out = subprocess.run([sys.executable, __file__, "--scenario", name, "--kernels", str(n_kernels),
                              "--replays", str(replays)], capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"scenario {name} failed: {out.stderr[-2000:]}")
        us = float(out.stdout.split()[-1])
        rows.append(f"{name:<26} {us:>10.1f} {us / n_kernels:>12.3f}  {what}")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernels", type=int, default=200, help="tiny kernels in the graph before the extra one")
    p.add_argument("--replays", type=int, default=200)
    p.add_argument("--reverse", action="store_true", help="measure the variants in reverse order")
    p.add_argument("--body", choices=("torch", "triton", "both"), default="both")
    p.add_argument("--pair", action="store_true",
                   help="instead: two identical graphs, both alive, timed B, A, B, A")
    p.add_argument("--study", action="store_true",
                   help="instead: graph A timed after each of SCENARIOS, each in a fresh process")
    p.add_argument("--scenario", choices=tuple(SCENARIOS), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.scenario:
        print(f"replay_us {scenario(args.scenario, args.kernels, args.replays):.3f}")
        return
    if args.study:
        print("\n".join(study(args.kernels, args.replays)))
        return
    if args.pair:
        print("\n".join(pair(args.kernels, args.replays)))
        return
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"{args.kernels} tiny kernels + one extra, best of 5 x {args.replays} replays")
    print(f"{'body':>7} {'extra kernel':<28} {'replay us':>10} {'us / kernel':>12}")
    for body in ("torch", "triton") if args.body == "both" else (args.body,):
        x8 = torch.zeros(4096, device="cuda")
        y8 = torch.zeros(4096, dtype=torch.int8, device="cuda")
        items = list(variants(x8, y8).items())
        for name, fn in reversed(items) if args.reverse else items:
            us = replay_us(args.kernels, fn, args.replays, body)
            print(f"{body:>7} {name:<28} {us:>10.1f} {us / (args.kernels + 1):>12.3f}")


if __name__ == "__main__":
    main()
