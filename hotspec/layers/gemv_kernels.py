"""Triton GEMV / skinny GEMM for decode: y = x @ w.T with x [M <= 16, K], w [N, K] (nn.Linear).

At batch-1 decode every Linear is a pure weight stream (M*K*2 bytes of x against N*K*2 of w), so
the kernel's only job is to keep HBM busy: a program owns BLOCK_N output columns (times one of
SPLIT_K slices of K) and streams its [BLOCK_N, K/SPLIT_K] weight panel in [BLOCK_N, BLOCK_K] tiles.

  M == 1   the products w * x accumulate elementwise into a [BLOCK_N, BLOCK_K] fp32 tile that is
           reduced over K once, after the loop (no tensor cores, no per-tile reductions).
           Triton does not software-pipeline this loop (num_stages does not reach it: each tile
           is loaded into registers, then used), so PIPE=2 does it by hand: the next tile's
           loads are issued before the current tile's products. With BLOCK_K = 8 * 32 *
           num_warps (1024 at 4 warps) the weight tile and x get the same register layout, so no
           tile goes through shared memory to change layout (at 512 every tile does).
  M > 1    x is padded to 16 rows (masked loads) and the tiles go through tl.dot, fp32 accumulate.

silu_mul=True: x is a fused gate_up output [M, 2K] = [gate | up]; the kernel reads both halves and
feeds h = silu(gate) * up to the product, rounded exactly as layers/fused_kernels.silu_mul and the
torch MLP round it: silu in fp32 rounded to the dtype, then the product rounded to the dtype.

Split-K (SPLIT_K > 1) is one launch: each program stores its fp32 partial [M, BLOCK_N] to a
workspace, then (after a CTA barrier) increments its output tile's counter; the program that
arrives last sums the SPLIT_K partials in slice order (deterministic, independent of arrival
order), stores y and resets the counter to 0, so the next launch and every CUDA-graph replay start
from zeroed counters. Workspace and counters are cached per (device, N, SPLIT_K, BLOCK_N) and must
be allocated outside CUDA-graph capture: call gemv once eagerly (a warm-up) or `prepare` first.
Calls sharing a workspace must not run concurrently (one stream, as in a decode step).

A bias (Qwen2's qkv) is added to the fp32 sum in the epilogue. per_row: M rows as M one-row
programs side by side in one launch (a grid axis), each row's bits those of its own launch.

The result is fp32-accumulated and rounded once to the input dtype, as cuBLAS does: it equals
F.linear up to the fp32 summation order (at most one ulp apart, bit-identical almost everywhere).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hotspec.layers import pdl, triton_interpret  # noqa: F401  (triton_interpret: the interpreter fix)

MAX_M = 16
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass(frozen=True)
class GemvConfig:
    BLOCK_N: int = 16
    BLOCK_K: int = 512
    SPLIT_K: int = 1
    num_warps: int = 4
    num_stages: int = 3
    # one-row kernels: weight tiles in registers per program; 2 issues the next tile's loads
    # before the current tile's products (Triton does not pipeline this loop: num_stages does
    # not reach it); 0 is the resident kernel: a program's whole row slice [BLOCK_N, K] is
    # loaded into registers before the PDL wait (BLOCK_K >= K); one row, no split-K
    PIPE: int = 1


# Where the kernel beats cuBLAS on the H200 (lab/benchmarks/gemv_bench.py; benchmarks/RESULTS.md):
# (M bucket, N, K, silu_mul) -> the fastest config. Bucket 1 runs the multiply-reduce kernel, 8
# and 16 the tl.dot one (2..16 rows: only where layers/rows_kernel.py does not run, see
# fused.rows_config). The 8B o row is the resident kernel
# (PIPE 0, 4 rows x the whole 4096 columns per program): its programs launch while the attention
# runs (the split combine PDL-chained before it) and load their weights then, so less of
# o_proj's stream is left after the attention. Absent (cuBLAS as fast or faster, or a win under
# 3 %): the 8B gate_up (28672 x 4096) at every M, every silu_mul down projection at M > 1 (each
# program recomputes silu for 16 padded rows), PIPE=2 on the 8B qkv, down and gate_up rows.
CONFIGS: dict[tuple[int, int, int, bool], GemvConfig] = {
    # Llama-3.1-8B
    (1, 6144, 4096, False): GemvConfig(8, 512, 1, 4, 2),     # qkv     14.8 us vs 15.4
    (1, 4096, 4096, False): GemvConfig(4, 4096, 1, 4, 1, PIPE=0),  # o, resident
    (1, 4096, 14336, True): GemvConfig(16, 512, 2, 4, 2),    # down    31.8 us vs 33.3 (+silu)
    (8, 4096, 4096, False): GemvConfig(32, 512, 1, 4, 4),    # o       11.3 us vs 12.7
    (16, 4096, 4096, False): GemvConfig(32, 512, 1, 4, 4),   # o       11.1 us vs 12.6
    # down on silu(gate) * up (layers/rows_kernel.py's glu output): one launch, PDL-chained,
    # against cuBLAS's split-K GEMM and its reduce kernel
    (8, 4096, 14336, False): GemvConfig(32, 512, 2, 4, 3),   # down    32.3 us vs 31.7
    (16, 4096, 14336, False): GemvConfig(32, 512, 2, 4, 3),  # down    33.0 us vs 32.4
    # SmolLM2-135M
    (1, 960, 576, False): GemvConfig(8, 512, 1, 4, 4),       # qkv     2.92 us vs 3.94
    (1, 576, 576, False): GemvConfig(8, 512, 1, 4, 3),       # o       2.81 us vs 3.56
    (1, 3072, 576, False): GemvConfig(8, 512, 1, 4, 4),      # gate_up 3.82 us vs 4.13
    (1, 576, 1536, True): GemvConfig(8, 512, 1, 8, 4),       # down    3.67 us vs 6.47 (+silu)
}
# Where the GEMV alone only ties cuBLAS but, with the add + RMSNorm before it folded in
# (layers/norm_gemv_kernel.py, one row), saves that norm's kernel: (N, K) -> config.
NORM_TIES: dict[tuple[int, int], GemvConfig] = {
    # 8B gate_up 57.8 us vs 57.7 alone; with the norm folded in, a faster decode step
    (28672, 4096): GemvConfig(16, 256, 1, 4, 4),
}
_SMS = 132  # H200; only the fallback heuristic uses it
# Unmeasured shapes at M == 1 up to this many weights take the heuristic config (every measured
# M == 1 shape this size won); larger ones and unmeasured M > 1 stay with cuBLAS.
_M1_MAX_WEIGHTS = 1 << 25


def bucket(M: int) -> int:
    """The CONFIGS row an M uses: 1, 8 (2..8) or 16 (9..16)."""
    return 1 if M == 1 else 8 if M <= 8 else MAX_M


def choose(M: int, N: int, K: int, silu_mul: bool = False, heuristic: bool = True
           ) -> GemvConfig | None:
    """The config to run x[M, K] @ w[N, K].T with, or None where cuBLAS is the faster choice.
    heuristic=False: table rows only, for Linears never measured against cuBLAS, such as the LM
    head."""
    if not 1 <= M <= MAX_M:
        return None
    key = (bucket(M), N, K, silu_mul)
    cfg = CONFIGS.get(key)
    if cfg is None and heuristic and M == 1 and N * K <= _M1_MAX_WEIGHTS:
        cfg = GemvConfig(8, 512 if K >= 512 else 128, 1, 4, 3)
    return cfg


def default_config(M: int, N: int, K: int) -> GemvConfig:
    """The table entry for (bucket(M), N, K), else a heuristic: the smallest column block the
    kernel allows (16 for M == 1, 32 for tl.dot), then split K until ~two programs per SM."""
    for silu in (False, True):
        if (bucket(M), N, K, silu) in CONFIGS:
            return CONFIGS[(bucket(M), N, K, silu)]
    block_n = 16 if M == 1 else 32
    block_k = 512 if K >= 2048 else 256 if K >= 512 else 128
    split = 1
    while split < 4 and triton.cdiv(N, block_n) * split < 2 * _SMS and K // (2 * split) >= block_k:
        split *= 2
    return GemvConfig(block_n, block_k, split, 4, 3)


@triton.jit
def _gemv_kernel(X, W, Y, WS, CNT, M, N, K, K_SPLIT, stride_xm, stride_wn, stride_ym,
                 SILU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
                 F32_DOT: tl.constexpr, PDL: tl.constexpr = False, PF_COLS: tl.constexpr = -1,
                 PRELOAD: tl.constexpr = False, PIPE: tl.constexpr = 1, ROWS=1, B=None,
                 HAS_BIAS: tl.constexpr = False):
    """Program (n, s, r): y[:, n*BLOCK_N:(n+1)*BLOCK_N] over k in [s*K_SPLIT, min((s+1)*K_SPLIT,
    K)). K_SPLIT is a multiple of BLOCK_K; EVEN_K: every slice is whole BLOCK_K tiles (no K mask).
    r: with BLOCK_M == 1, the row of ROWS this program computes (rows side by side,
    `gemv(per_row=True)`: each exactly as a launch of that row alone; a column block's ROWS
    programs are adjacent in launch order, so they can share its weights through L2; the
    first row's programs prefetch them).
    PDL (layers/pdl.py): the program's first weight panel goes to L2, and with PRELOAD its first
    (whole) weight tile into registers, before it waits for the kernel before; nothing else
    happens before the wait."""
    pid_n = tl.program_id(0) // ROWS  # a column block's rows launch side by side (L2 reuse)
    pid_r = tl.program_id(0) % ROWS
    pid_k = tl.program_id(1)
    k_lo = pid_k * K_SPLIT
    offs_n = tl.cast(pid_n, tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    if BLOCK_M == 1:
        X += pid_r.to(tl.int64) * stride_xm
        Y += pid_r.to(tl.int64) * stride_ym
    if PDL:
        pdl.launch_dependents(PDL)
        if pid_r == 0:
            pdl.prefetch_rows(W, offs_n, N, k_lo, tl.minimum(k_lo + K_SPLIT, K), stride_wn, 32,
                              PF_COLS)
    w0 = pdl.preload(W, offs_n, N, k_lo, stride_wn, BLOCK_K, PRELOAD)
    pdl.wait(PDL)
    _gemv_tile(X, W, Y, WS, CNT, M, N, K, K_SPLIT, stride_xm, stride_wn, stride_ym, pid_n, pid_k,
               w0, SILU, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, EVEN_K, F32_DOT, PRELOAD, PIPE, B,
               HAS_BIAS)


@triton.jit
def _x_tile(x_ptr, K, mask, SILU: tl.constexpr):
    """The GEMV's input at x_ptr: x itself, or silu(gate) * up for a [gate | up] row (gate at
    x_ptr, up K further), rounded as fused_kernels._silu_mul_kernel rounds: silu, then the
    product."""
    x = tl.load(x_ptr, mask=mask, other=0.0)
    if SILU:
        u = tl.load(x_ptr + K, mask=mask, other=0.0)
        g = x.to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(x.dtype).to(tl.float32)
        x = (s * u.to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def mac(acc, w, x, BLOCK_M: tl.constexpr, F32_DOT: tl.constexpr):
    """acc plus the tile's products: elementwise into [BLOCK_N, BLOCK_K] for one row (x [1, K]
    broadcast over w's rows), else x @ w.T through tl.dot into [BLOCK_M, BLOCK_N]."""
    if BLOCK_M == 1:
        return acc + w.to(tl.float32) * x.to(tl.float32)
    elif F32_DOT:  # the interpreter's bf16 dot multiplies raw bit patterns: go through fp32
        return tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    else:
        return tl.dot(x, tl.trans(w), acc)


@triton.jit
def _w_tile(w_ptr, n_ok, k_ok, EVEN_K: tl.constexpr):
    """A [BLOCK_N, BLOCK_K] weight tile (rows past N, and columns outside the slice unless EVEN_K,
    read as 0), streamed past L1."""
    if EVEN_K:
        return tl.load(w_ptr, mask=n_ok[:, None], other=0.0, eviction_policy="evict_first")
    return tl.load(w_ptr, mask=n_ok[:, None] & k_ok[None, :], other=0.0,
                   eviction_policy="evict_first")


@triton.jit
def _row_pipelined(acc, w0, w_ptr, x_ptr, n_ok, offs_k, K, k_lo, k_hi, SILU: tl.constexpr,
                   BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PRELOAD: tl.constexpr):
    """The one-row loop over tiles [k_lo, k_hi) with two weight tiles in registers (PIPE=2): the
    loads of tile i + 1 are issued before tile i's products, so each program keeps a tile in
    flight while it computes. The same products summed in the same order as the plain loop (bits
    equal). With PRELOAD, w0 is tile 0 (loaded before the PDL wait)."""
    if PRELOAD:
        w_cur = w0
    else:
        w_cur = _w_tile(w_ptr, n_ok, (k_lo + offs_k) < k_hi, EVEN_K)
    k_cur = k_lo
    for k in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
        w_nxt = _w_tile(w_ptr + (k - k_lo), n_ok, (k + offs_k) < k_hi, EVEN_K)
        if EVEN_K:
            x = _x_tile(x_ptr + (k_cur - k_lo), K, offs_k[None, :] >= 0, SILU)
        else:
            x = _x_tile(x_ptr + (k_cur - k_lo), K, ((k_cur + offs_k) < k_hi)[None, :], SILU)
        acc += w_cur.to(tl.float32) * x.to(tl.float32)
        w_cur = w_nxt
        k_cur = k
    x = _x_tile(x_ptr + (k_cur - k_lo), K, ((k_cur + offs_k) < k_hi)[None, :], SILU)
    return acc + w_cur.to(tl.float32) * x.to(tl.float32)


@triton.jit
def _gemv_tile(X, W, Y, WS, CNT, M, N, K, K_SPLIT, stride_xm, stride_wn, stride_ym, pid_n, pid_k,
               w0, SILU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
               F32_DOT: tl.constexpr, PRELOAD: tl.constexpr, PIPE: tl.constexpr = 1, B=None,
               HAS_BIAS: tl.constexpr = False):
    offs_n = tl.cast(pid_n, tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    m_ok = offs_m < M
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    w_ptr = W + offs_n[:, None] * stride_wn + (k_lo + offs_k)[None, :]
    x_ptr = X + offs_m[:, None].to(tl.int64) * stride_xm + (k_lo + offs_k)[None, :]
    if BLOCK_M == 1:  # elementwise products, reduced over K once after the loop
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = k_lo
    if BLOCK_M == 1 and PIPE == 2:  # the next tile's loads in flight during this tile's products
        acc = _row_pipelined(acc, w0, w_ptr, x_ptr, n_ok, offs_k, K, k_lo, k_hi, SILU, BLOCK_K,
                             EVEN_K, PRELOAD)
        k_start = k_hi  # (the loop below runs no step)
    elif PRELOAD:  # the first tile, loaded before the wait (whole): the loop's first step
        acc = mac(acc, w0, _x_tile(x_ptr, K, m_ok[:, None], SILU), BLOCK_M, F32_DOT)
        k_start = k_lo + BLOCK_K
        w_ptr += BLOCK_K
        x_ptr += BLOCK_K
    for k in range(k_start, k_hi, BLOCK_K):
        if EVEN_K:
            w = tl.load(w_ptr, mask=n_ok[:, None], other=0.0, eviction_policy="evict_first")
            x = _x_tile(x_ptr, K, m_ok[:, None], SILU)
        else:
            k_ok = (k + offs_k) < k_hi
            w = tl.load(w_ptr, mask=n_ok[:, None] & k_ok[None, :], other=0.0,
                        eviction_policy="evict_first")
            x = _x_tile(x_ptr, K, m_ok[:, None] & k_ok[None, :], SILU)
        acc = mac(acc, w, x, BLOCK_M, F32_DOT)
        w_ptr += BLOCK_K
        x_ptr += BLOCK_K
    if BLOCK_M == 1:
        acc = tl.sum(acc, axis=1)[None, :]
    out_mask = m_ok[:, None] & n_ok[None, :]
    y_ptr = Y + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:  # added in fp32 before the one rounding, as cuBLAS's epilogue adds it
            acc += tl.load(B + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr, acc.to(Y.dtype.element_ty), mask=out_mask)
    else:
        # workspace [SPLIT_K, MAX_M=16, N] fp32
        ws_ptr = WS + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(ws_ptr + pid_k.to(tl.int64) * 16 * N, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's partial is written before the tile's counter moves
        arrived = tl.atomic_add(CNT + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:  # last one in: reduce in slice order, then re-arm the counter
            tot = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                tot += tl.load(ws_ptr + s * 16 * N, mask=out_mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                tot += tl.load(B + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptr, tot.to(Y.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(CNT + pid_n, 0)


_WORKSPACES: dict[tuple[torch.device, int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def prepare(N: int, config: GemvConfig, device: torch.device | str) -> None:
    """Allocate (once) the split-K workspace and zeroed counters gemv uses for this output width
    and config. Needed before CUDA-graph capture unless an eager call already did it."""
    if config.SPLIT_K == 1:
        return
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device, N, config.SPLIT_K, config.BLOCK_N)
    if key not in _WORKSPACES:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("gemv split-K workspace is allocated on first use, which must not "
                               "be under CUDA-graph capture: run gemv once eagerly or call prepare")
        ws = torch.empty((config.SPLIT_K, MAX_M, N), dtype=torch.float32, device=device)
        cnt = torch.zeros(triton.cdiv(N, config.BLOCK_N), dtype=torch.int32, device=device)
        _WORKSPACES[key] = (ws, cnt)


def gemv(x: torch.Tensor, w: torch.Tensor, *, silu_mul: bool = False,
         config: GemvConfig | None = None, use_pdl: bool | None = None,
         per_row: bool = False, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (or [M, 2K] = [gate | up] with silu_mul) @ w[N, K].T -> [M, N] in x's dtype.

    bf16/fp16 only, 1 <= M <= 16, unit stride along K for x and w (x's row stride is free);
    anything else raises ValueError (callers fall back to F.linear). use_pdl: launch with
    Programmatic Dependent Launch (layers/pdl.py; None: pdl.enabled). per_row: the M rows as M
    one-row GEMVs side by side in one launch (a one-row config, PIPE 1 or 2, no split-K), each
    row's bits those of its launch alone; else M > 1 goes through tl.dot. bias [N] (x's dtype):
    added to the fp32 sum before its one rounding, as F.linear's epilogue adds it."""
    if x.dim() != 2 or w.dim() != 2:
        raise ValueError(f"gemv: x and w must be 2-D, got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.dtype not in (torch.bfloat16, torch.float16) or w.dtype != x.dtype:
        raise ValueError(f"gemv: bf16/fp16 x and w of one dtype only (got {x.dtype}, {w.dtype}); "
                         "use F.linear for float32")
    m, kx = x.shape
    n, k = w.shape
    if not 1 <= m <= MAX_M:
        raise ValueError(f"gemv: M must be in [1, {MAX_M}], got {m}; use F.linear")
    if kx != (2 * k if silu_mul else k):
        raise ValueError(f"gemv: x has {kx} columns, expected {2 * k if silu_mul else k} "
                         f"for w {tuple(w.shape)} (silu_mul={silu_mul})")
    if x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError("gemv: x and w need unit stride along K")
    cfg = config or default_config(m, n, k)
    if cfg.PIPE not in (0, 1, 2):
        raise ValueError(f"gemv: PIPE is 0 (resident), 1 or 2 (weight tiles in registers), got {cfg.PIPE}")
    if per_row and (cfg.SPLIT_K != 1 or cfg.PIPE not in (1, 2)):
        raise ValueError(f"gemv: per_row runs one-row programs without split-K, PIPE 1 or 2 "
                         f"(got SPLIT_K={cfg.SPLIT_K}, PIPE={cfg.PIPE})")
    if bias is not None and (bias.shape != (n,) or bias.dtype != x.dtype or cfg.PIPE == 0):
        raise ValueError(f"gemv: a bias is [N={n}] in x's dtype, and not with PIPE 0 (got "
                         f"{tuple(bias.shape)} {bias.dtype}, PIPE={cfg.PIPE})")
    if cfg.PIPE == 0:
        from hotspec.layers.gemv_resident import gemv_resident

        return gemv_resident(x, w, cfg, silu_mul, use_pdl)
    one_row = m == 1 or per_row
    if not one_row and cfg.BLOCK_N < 16:
        raise ValueError(f"gemv: M > 1 uses tl.dot, which needs BLOCK_N >= 16 (got {cfg.BLOCK_N})")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    k_split = triton.cdiv(triton.cdiv(k, cfg.SPLIT_K), cfg.BLOCK_K) * cfg.BLOCK_K
    ws = cnt = y
    if cfg.SPLIT_K > 1:
        prepare(n, cfg, x.device)
        ws, cnt = _WORKSPACES[(x.device, n, cfg.SPLIT_K, cfg.BLOCK_N)]
    rows = m if per_row else 1
    grid = (triton.cdiv(n, cfg.BLOCK_N) * rows, cfg.SPLIT_K)
    use_pdl = pdl.enabled(x.device) if use_pdl is None else use_pdl
    even_k = k % cfg.BLOCK_K == 0 and k_split * cfg.SPLIT_K == k
    _gemv_kernel[grid](
        x, w, y, ws, cnt, 1 if per_row else m, n, k, k_split, x.stride(0), w.stride(0),
        y.stride(0), SILU=silu_mul, BLOCK_M=1 if one_row else MAX_M, BLOCK_N=cfg.BLOCK_N,
        BLOCK_K=cfg.BLOCK_K, SPLIT_K=cfg.SPLIT_K, EVEN_K=even_k, F32_DOT=_INTERPRET, PDL=use_pdl,
        PF_COLS=pdl.prefetch_cols(w),
        PRELOAD=pdl.preloads(use_pdl, one_row, k - (cfg.SPLIT_K - 1) * k_split,
                             cfg.BLOCK_K),
        PIPE=cfg.PIPE if one_row else 1, ROWS=rows, B=y if bias is None else bias,
        HAS_BIAS=bias is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **({"launch_pdl": True} if use_pdl else {}))
    return y
