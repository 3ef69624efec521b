"""Does a persistent kernel beat a chain of PDL-launched GEMV kernels at one row? (issue 5)

An 8B decode layer at batch 1 loses ~7 us per layer at its four GEMV boundaries (o_proj ->
gate_up -> down -> qkv: each kernel's ramp and drain; RESULTS "Session 16", call 8's timeline).
This benchmark times the same four weight streams (4096x4096, 28672x4096, 4096x14336, 6144x4096:
436 MB per layer, the 8B layer's GEMV bytes) two ways, each as a CUDA graph over `--layers`
distinct weight sets (so L2 never holds the next one):

  chain       hotspec's one-row GEMV kernels (layers/gemv_kernels.py) with their table configs,
              PDL-launched as in the decode step: four kernels per layer;
  persistent  one kernel per layer, `programs-per-sm` x SMs programs, all resident at once: each
              program streams its share of a phase's rows, counts itself in on the phase's
              counter (a release add), loads its first tile of the next phase's weight into
              registers, then waits (acquire loads) until every program has counted itself in.
              No kernel boundary between the phases.

Both compute y = W4 (W3 (W2 (W1 x))[:14336])[:4096] rounded to bf16 after each phase (no norm or
SiLU: only the streams and boundaries are compared) and are checked against torch before timing.
Prints per-layer microseconds and the fraction of 4.37 TB/s.

    python benchmarks/persistent_chain_bench.py --layers 8 --programs-per-sm 2,4

GPU only. The barrier needs every program resident: the program count is capped at what the
compiled kernel's registers and shared memory allow per SM, and a larger request is an error.
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
import triton.language as tl

from hotspec.benchmark.device import device_name, graph_replay_ms
from hotspec.layers.gemv_kernels import CONFIGS, NORM_TIES, gemv

# (N, K) of each phase; phase i reads the first K of phase i - 1's output
PHASES = [(4096, 4096), (28672, 4096), (4096, 14336), (6144, 4096)]
# the engine's one-row rows for them (gate_up runs as a norm-GEMV there; down with its SiLU)
CHAIN_CONFIGS = [CONFIGS[(1, 4096, 4096, False)], NORM_TIES[(28672, 4096)],
                 CONFIGS[(1, 4096, 14336, True)], CONFIGS[(1, 6144, 4096, False)]]
PEAK_TB_S = 4.37


@triton.jit
def _first_tile(W, pid, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program pid's first weight tile of a phase: rows pid * BLOCK_N + [0, BLOCK_N), columns
    [0, BLOCK_K) (0 outside W)."""
    offs_n = (pid * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    return tl.load(W + offs_n[:, None] * stride_wn + offs_k[None, :],
                   mask=(offs_n < N)[:, None] & (offs_k < K)[None, :], other=0.0,
                   eviction_policy="evict_first")


@triton.jit
def _w(W, offs_n, n_ok, kk, K, stride_wn):
    return tl.load(W + offs_n[:, None] * stride_wn + kk[None, :],
                   mask=n_ok[:, None] & (kk < K)[None, :], other=0.0, eviction_policy="evict_first")


@triton.jit
def _x(X, kk, K):
    """Columns kk of the phase's input, written by other programs of this kernel: past L1."""
    return tl.load(X + kk, mask=kk < K, other=0.0, cache_modifier=".cg").to(tl.float32)[None, :]


@triton.jit
def _rows(W, X, Y, nb, N, K, stride_wn, w0, PRELOADED: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr, PIPE: tl.constexpr):
    """Y[nb * BLOCK_N + i] = sum_k W[., k] * X[k], fp32 accumulation, rounded to Y's dtype.
    PIPE=2: the next weight tile's loads are issued before this tile's products (as
    layers/gemv_kernels' PIPE)."""
    offs_n = (nb * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    if PIPE == 2:
        if PRELOADED:
            w_cur = w0
        else:
            w_cur = _w(W, offs_n, n_ok, offs_k, K, stride_wn)
        k_cur = 0
        for k in range(BLOCK_K, K, BLOCK_K):
            w_nxt = _w(W, offs_n, n_ok, k + offs_k, K, stride_wn)
            acc += w_cur.to(tl.float32) * _x(X, k_cur + offs_k, K)
            w_cur = w_nxt
            k_cur = k
        acc += w_cur.to(tl.float32) * _x(X, k_cur + offs_k, K)
    else:
        k_start = 0
        if PRELOADED:
            acc += w0.to(tl.float32) * _x(X, offs_k, K)
            k_start = BLOCK_K
        for k in range(k_start, K, BLOCK_K):
            acc += _w(W, offs_n, n_ok, k + offs_k, K, stride_wn).to(tl.float32) * _x(X, k + offs_k, K)
    tl.store(Y + offs_n, tl.sum(acc, axis=1).to(Y.dtype.element_ty), mask=n_ok)


@triton.jit
def _phase(W, X, Y, N, K, stride_wn, pid, P, w0, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
           PIPE: tl.constexpr):
    """Row blocks pid, pid + P, ... of one phase; the first with the preloaded tile w0."""
    blocks = tl.cdiv(N, BLOCK_N)
    if pid < blocks:
        _rows(W, X, Y, pid, N, K, stride_wn, w0, True, BLOCK_N, BLOCK_K, PIPE)
    for nb in range(pid + P, blocks, P):
        _rows(W, X, Y, nb, N, K, stride_wn, w0, False, BLOCK_N, BLOCK_K, PIPE)


@triton.jit
def _arrive(CNT):
    """This program has finished the phase: a release add on the phase's counter (after the CTA
    barrier, so every thread's stores are done). The release is a MEMBAR.ALL.GPU, which may
    also wait for the thread's loads in flight, so the next phase's tile is loaded after it."""
    tl.debug_barrier()
    tl.atomic_add(CNT, 1, sem="release")


@triton.jit
def _wait(CNT, P):
    """Until all P programs have arrived: a spin on an acquire add of 0, which Triton lowers to
    an acquire load (no read-modify-write, so P programs polling one address do not
    serialise)."""
    while tl.atomic_add(CNT, 0, sem="acquire") < P:  # (Triton 3.6: ld.global.gpu.acquire)
        pass
    tl.debug_barrier()


@triton.jit
def _chain_kernel(X0, W1, W2, W3, W4, Y1, Y2, Y3, Y4, CNT, P,
                  N1, K1, N2, K2, N3, K3, N4, K4, s1, s2, s3, s4,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PIPE: tl.constexpr = 1):
    pid = tl.program_id(0)
    w0 = _first_tile(W1, pid, N1, K1, s1, BLOCK_N, BLOCK_K)
    _phase(W1, X0, Y1, N1, K1, s1, pid, P, w0, BLOCK_N, BLOCK_K, PIPE)
    _arrive(CNT + 0)
    w0 = _first_tile(W2, pid, N2, K2, s2, BLOCK_N, BLOCK_K)  # in flight while it waits: weights only
    _wait(CNT + 0, P)
    _phase(W2, Y1, Y2, N2, K2, s2, pid, P, w0, BLOCK_N, BLOCK_K, PIPE)
    _arrive(CNT + 1)
    w0 = _first_tile(W3, pid, N3, K3, s3, BLOCK_N, BLOCK_K)
    _wait(CNT + 1, P)
    _phase(W3, Y2, Y3, N3, K3, s3, pid, P, w0, BLOCK_N, BLOCK_K, PIPE)
    _arrive(CNT + 2)
    w0 = _first_tile(W4, pid, N4, K4, s4, BLOCK_N, BLOCK_K)
    _wait(CNT + 2, P)
    _phase(W4, Y3, Y4, N4, K4, s4, pid, P, w0, BLOCK_N, BLOCK_K, PIPE)


def _launch_args(x: torch.Tensor, ws: list[torch.Tensor], outs: list[torch.Tensor],
                 cnt: torch.Tensor, programs: int) -> list[object]:
    dims = [d for w in ws for d in (w.shape[0], w.shape[1])]
    return [x, *ws, *outs, cnt, programs, *dims, *(w.stride(0) for w in ws)]


def persistent_layer(x: torch.Tensor, ws: list[torch.Tensor], outs: list[torch.Tensor],
                     cnt: torch.Tensor, programs: int, block_n: int, block_k: int,
                     pipe: int = 1) -> None:
    """One layer's four phases in one launch; cnt: 3 zeroed int32 counters (left at `programs`).
    On a GPU every one of the `programs` must be resident at once (`resident_per_sm`)."""
    _chain_kernel[(programs,)](*_launch_args(x, ws, outs, cnt, programs), BLOCK_N=block_n,
                               BLOCK_K=block_k, PIPE=pipe, num_warps=4)


def chain_layer(x: torch.Tensor, ws: list[torch.Tensor]) -> torch.Tensor:
    y = x
    for w, cfg in zip(ws, CHAIN_CONFIGS):
        y = gemv(y[:, :w.shape[1]], w, config=cfg)
    return y


def reference_layer(x: torch.Tensor, ws: list[torch.Tensor]) -> torch.Tensor:
    y = x.float()
    for w in ws:
        y = (y[:, :w.shape[1]] @ w.float().t()).to(x.dtype).float()
    return y.to(x.dtype)


def resident_per_sm(launch_args: list[object], block_n: int, block_k: int, pipe: int,
                    dev: torch.device) -> tuple[int, str]:
    """How many programs of the persistent kernel, compiled for `launch_args` (the real ones:
    Triton specialises on them) but not launched, fit on one SM (registers, shared memory,
    threads), and what the kernel uses. A grid larger than that would never open its barriers."""
    props = torch.cuda.get_device_properties(dev)
    k = _chain_kernel.warmup(*launch_args, BLOCK_N=block_n, BLOCK_K=block_k, PIPE=pipe,
                             num_warps=4, grid=(1,))
    k._init_handles()
    regs = max(1, k.n_regs) * 128
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // regs  # (64K on sm_80-sm_90)
    smem = max(1, k.metadata.shared)
    by_smem = props.shared_memory_per_multiprocessor // smem
    by_threads = props.max_threads_per_multi_processor // 128
    return min(by_regs, by_smem, by_threads), f"{k.n_regs} registers, {k.metadata.shared} B shared"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=8, help="distinct weight sets in each graph")
    p.add_argument("--programs-per-sm", default="2,4", help="comma-separated; persistent grid")
    p.add_argument("--block-n", type=int, default=8)
    p.add_argument("--block-k", type=int, default=512)
    p.add_argument("--pipe", type=int, choices=(1, 2), default=1,
                   help="2: the next weight tile's loads issued before this tile's products")
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("persistent_chain_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    gen = torch.Generator(device=dev).manual_seed(0)
    layers = [[(torch.randn(n, k, generator=gen, device=dev) / k ** 0.5).to(torch.bfloat16)
               for n, k in PHASES] for _ in range(args.layers)]  # each phase keeps the scale
    x = torch.randn(1, 4096, generator=gen, device=dev).to(torch.bfloat16)
    layer_bytes = sum(n * k * 2 for n, k in PHASES)
    ideal_us = layer_bytes / (PEAK_TB_S * 1e12) * 1e6

    def run_chain() -> torch.Tensor:
        y = x
        for ws in layers:
            y = chain_layer(y[:, :4096], ws)
        return y

    outs = [[torch.empty(1, n, dtype=torch.bfloat16, device=dev) for n, _ in PHASES]
            for _ in layers]
    cnt = torch.zeros(args.layers, 3, dtype=torch.int32, device=dev)

    def run_persistent(programs: int) -> torch.Tensor:
        cnt.zero_()
        y = x
        for ws, o, c in zip(layers, outs, cnt):
            persistent_layer(y, ws, o, c, programs, args.block_n, args.block_k, args.pipe)
            y = o[3][:, :4096]
        return outs[-1][3]

    want = x
    for ws in layers:
        want = reference_layer(want[:, :4096], ws)

    def timed(label: str, fn) -> tuple[str, float, torch.Tensor]:
        out = fn()  # warm-up: compile, allocate
        torch.cuda.synchronize()
        err = ((out.float() - want.float()).norm() / want.float().norm()).item()
        if not err < 2e-2:  # bf16 rounding after each of 4 x layers phases: ~1e-2 at most
            raise SystemExit(f"{label}: relative error {err:.3g} against torch")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn()
        return label, graph_replay_ms(g, args.iters) * 1e3 / args.layers, out

    rows = [timed("chain (4 PDL GEMV kernels)", run_chain)]
    uses = ""
    for pps in (int(v) for v in args.programs_per_sm.split(",")):
        cap, uses = resident_per_sm(_launch_args(x, layers[0], outs[0], cnt[0], pps * sms),
                                    args.block_n, args.block_k, args.pipe, dev)
        if pps > cap:  # said in the output: the barrier would hang
            print(f"persistent, {pps} programs per SM: not run, the kernel ({uses}) fits {cap} "
                  "per SM", file=sys.stderr)
            continue
        rows.append(timed(f"persistent, {pps} x {sms} programs",
                          lambda n=pps * sms: run_persistent(n)))
    print(f"{device_name(dev)}; {args.layers} layers of {layer_bytes / 1e6:.1f} MB, one row, "
          f"bf16; persistent: BLOCK_N {args.block_n}, BLOCK_K {args.block_k}, PIPE {args.pipe}, "
          f"{uses}")
    print(f"{'variant':<52} {'us/layer':>9} {'of 4.37 TB/s':>12}")
    for label, us, _ in rows:
        print(f"{label:<52} {us:>9.1f} {ideal_us / us:>12.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
