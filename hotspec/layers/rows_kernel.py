"""The projections of a few token rows (verify, draft_extend and the tree draft: 2..16 rows)
as Triton tl.dot GEMMs, PDL-chained like decode's GEMVs, and the MLP's silu(gate) * up as the
gate_up projection's epilogue.

    y = x @ W.T                                  [M, N]
    glu: W = [gate | up] (2N rows), y = silu(x @ Wg.T) * (x @ Wu.T)    [M, N]

A program owns the (up to) 16 rows and BLOCK_N output columns and streams its weight panel (with glu:
the gate rows and the up rows of the same columns, two accumulators) in [BLOCK_N, BLOCK_K] tiles;
x's row tiles (a few KB, from L2) feed tl.dot directly. The glu epilogue rounds as
fused_kernels.silu_mul does after a GEMM (gate and up rounded to the dtype, silu rounded, the
product rounded), so it equals gate_up then silu_mul up to the fp32 summation order, and neither
the [M, 2N] gate_up output nor the silu_mul kernel exists.

The RMSNorm before the projection is its own PDL-chained kernel for a wide row: the GEMM's loop
must stay loads feeding tl.dot, or its loads stop being pipelined (at the 8B shape a norm
inside the loop measured 2-3x slower: benchmarks/RESULTS.md), and a narrow row's norm folded in
as a second pass over K measured 1.4-3x the norm plus this GEMM at 1..16 rows.

PDL (layers/pdl.py): every launch has the attribute; a program pulls its weight panel into L2 when
the weight fits a third of L2 (pdl.prefetch_cols), signals that the next kernel may launch, then
waits for the kernel before: nothing else is read before the wait.
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch
import triton
import triton.language as tl

from hotspec.layers import pdl, triton_interpret  # noqa: F401  (triton_interpret: the interpreter fix)
from hotspec.layers.gemv_kernels import GemvConfig, mac

MAX_ROWS = 16  # the most rows one launch handles: one 16-row tile (taller tiles measured slower
# than cuBLAS at the 8B shape's 32 rows)
SMEM_BUDGET = 200 * 1024  # bytes of pipelined x and weight tiles (the H200 has 227 KB a block)
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def choose(n: int, k: int, glu: bool) -> GemvConfig:
    """The tiles for x [rows, k] against n output columns (glu: a weight of 2n rows), as a
    gemv_kernels config (this kernel has no split-K and ignores PIPE), from
    lab/benchmarks/rows_bench.py on the H200: 256-wide K tiles (masked where K is not a
    multiple: SmolLM2's 576 still runs fastest so), 64 columns for a wide single-accumulator
    output and 32 with glu (two accumulators) or a narrow output, 4 stages (3 for the 8B-sized
    glu panel). The pipelined tiles are kept within SMEM_BUDGET."""
    bn = 32 if glu or n <= 2048 else 64
    bk = min(256, triton.next_power_of_2(k))
    stages = 3 if glu and n > 2048 else 4
    while stages * (MAX_ROWS + bn * (2 if glu else 1)) * bk * 2 > SMEM_BUDGET:
        if stages > 2:
            stages -= 1
        else:
            bk //= 2
    return GemvConfig(BLOCK_N=bn, BLOCK_K=bk, num_warps=4, num_stages=stages)


def tile_stages(cfg: GemvConfig, block_m: int, glu: bool) -> int:
    """cfg's pipeline stages, fewer (down to 2) where tiles of block_m rows (taller than `choose`
    planned for) would not fit SMEM_BUDGET."""
    stages = cfg.num_stages
    while stages > 2 and stages * (block_m + cfg.BLOCK_N * (2 if glu else 1)) * cfg.BLOCK_K * 2 \
            > SMEM_BUDGET:
        stages -= 1
    return stages


TILE_HEIGHTS = (16, 32)  # rows a tile may hold: both compile to mma.sync m16n8k16 on sm_90


def tile_rows(m: int) -> int:
    """Rows a tile holds for an x of m rows: 16 up to 16 rows, else 32 (a weight panel read once
    per 32 rows, not per 16). Both heights run a row through the same m16n8k16 MMAs over the
    same K tiles in the same order, so a row's result is the same bits at either height and the
    deterministic mode may choose it by the row count (tests/test_kernels_compile_sm90.py checks
    the instruction, tests/test_rows_kernel.py the bits on the GPU). 64 rows would compile to
    wgmma (m64nNk16), another instruction, so they are not used."""
    return 16 if m <= 16 else 32


SMS = 132  # the H200's (and H100's) SMs: deterministic_config's one wave


def deterministic_config(n: int, k: int, glu: bool) -> GemvConfig:
    """The deterministic mode's config for x [rows, k] against n output columns, the same at
    every row count (the mode's batch invariance): `choose`'s tiles, and for a weight of at
    least 16 MB with fewer column blocks than half the SMs (the 8B's o and down projections: 64
    at one row) a split-K that fills a wave, up to 4 slices of at least two K tiles each."""
    cfg = choose(n, k, glu)
    blocks = triton.cdiv(n, cfg.BLOCK_N)
    if n * k * (2 if glu else 1) < 1 << 23 or blocks >= SMS // 2:
        return cfg
    split = max(1, min(4, triton.cdiv(SMS, blocks), k // (2 * cfg.BLOCK_K)))
    return replace(cfg, SPLIT_K=split)


@triton.jit
def _rows_kernel(X, W, Y, B, WS, CNT, M, N, K, K_SPLIT, stride_xm, stride_wn, stride_ym,
                 GLU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, F32_DOT: tl.constexpr,
                 HAS_BIAS: tl.constexpr = False, SPLIT_K: tl.constexpr = 1,
                 PDL: tl.constexpr = False, PF_COLS: tl.constexpr = -1):
    """Program (m, n, s): rows [m*BLOCK_M, +BLOCK_M) (masked past M) x output columns
    [n*BLOCK_N, +BLOCK_N) over K slice s; m varies fastest, so a weight panel's row tiles run
    side by side and read it from HBM about once (a long prefill's many tiles). A row's result
    depends on its own x row and the tiles alone, never on M or the other rows (the
    deterministic mode's batch invariance rests on it).
    SPLIT_K > 1: each slice's fp32 partial goes to the workspace WS [SPLIT_K, M, N (2N with
    glu)]; the tile's last program to arrive (its counter in CNT) sums the partials in slice
    order, whatever the arrival order, finishes the tile and re-arms the counter."""
    pid_m, pid_n, offs_m, offs_n, offs_k, m_ok, n_ok, rows = tile_start(
        W, M, N, K, stride_wn, GLU, BLOCK_M, BLOCK_N, BLOCK_K, PDL, PF_COLS)
    pid_k = tl.program_id(2)
    x_ptr = X + rows * stride_xm + offs_k[None, :]
    w_ptr = W + offs_n[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    for k in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            x_ok = m_ok[:, None]
            w_ok = n_ok[:, None]
        else:
            k_ok = (k + offs_k) < k_hi
            x_ok = m_ok[:, None] & k_ok[None, :]
            w_ok = n_ok[:, None] & k_ok[None, :]
        x = tl.load(x_ptr + k, mask=x_ok, other=0.0)
        w = tl.load(w_ptr + k, mask=w_ok, other=0.0, eviction_policy="evict_first")
        acc = mac(acc, w, x, BLOCK_M, F32_DOT)
        if GLU:
            w_up = tl.load(w_ptr + k + N * stride_wn, mask=w_ok, other=0.0,
                           eviction_policy="evict_first")
            acc_up = mac(acc_up, w_up, x, BLOCK_M, F32_DOT)
    out_ok = m_ok[:, None] & n_ok[None, :]
    y_ptr = Y + rows * stride_ym + offs_n[None, :]
    if SPLIT_K == 1:
        _finish(acc, acc_up, B, y_ptr, offs_n, n_ok, out_ok, X.dtype.element_ty, GLU, HAS_BIAS)
    else:
        width = N * 2 if GLU else N
        ws = WS + rows * width + offs_n[None, :]
        tl.store(ws + pid_k.to(tl.int64) * M * width, acc, mask=out_ok)
        if GLU:
            tl.store(ws + pid_k.to(tl.int64) * M * width + N, acc_up, mask=out_ok)
        tl.debug_barrier()  # every thread's partial is written before the tile's counter moves
        cnt = CNT + pid_n * tl.num_programs(0) + pid_m
        if tl.atomic_add(cnt, 1, sem="acq_rel") == SPLIT_K - 1:  # last in: sum in slice order
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                acc += tl.load(ws + s * M * width, mask=out_ok, other=0.0, cache_modifier=".cg")
                if GLU:
                    acc_up += tl.load(ws + s * M * width + N, mask=out_ok, other=0.0,
                                      cache_modifier=".cg")
            tl.atomic_xchg(cnt, 0)
            _finish(acc, acc_up, B, y_ptr, offs_n, n_ok, out_ok, X.dtype.element_ty, GLU,
                    HAS_BIAS)


@triton.jit
def tile_start(W, M, N, K, stride_wn, GLU: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
               PF_COLS: tl.constexpr):
    """A row-tile GEMM program's start: its tile (program (m, n, ...): m varies fastest, so a
    weight panel's row tiles run side by side and read it about once), then with PDL its weight
    panel pulled into L2 and the next kernel let launch, then the wait for the kernel before.
    Returns (pid_m, pid_n, offs_m, offs_n, offs_k, m_ok, n_ok, rows [BLOCK_M, 1] int64)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.cast(pid_n, tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    if PDL:
        pdl.launch_dependents(PDL)
        pdl.prefetch_rows(W, offs_n, N, 0, K, stride_wn, 32, PF_COLS)
        if GLU:
            pdl.prefetch_rows(W, offs_n + N, 2 * N, 0, K, stride_wn, 32, PF_COLS)
    pdl.wait(PDL)
    return pid_m, pid_n, offs_m, offs_n, offs_k, m_ok, n_ok, offs_m[:, None].to(tl.int64)


@triton.jit
def _finish(acc, acc_up, B, y_ptr, offs_n, n_ok, out_ok, dt: tl.constexpr, GLU: tl.constexpr,
            HAS_BIAS: tl.constexpr):
    """The tile's epilogue: the bias in fp32, one rounding; with GLU silu(gate) * up, rounded as
    fused_kernels._silu_mul_kernel rounds."""
    if HAS_BIAS:
        acc += tl.load(B + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y = acc.to(dt)
    if GLU:
        gate = y.to(tl.float32)
        up = acc_up.to(dt).to(tl.float32)
        y = ((gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32) * up).to(dt)
    tl.store(y_ptr, y, mask=out_ok)


def _check(x: torch.Tensor, w: torch.Tensor, glu: bool, what: str) -> None:
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"{what}: x [M, K] and w [N, K], got {tuple(x.shape)}, {tuple(w.shape)}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32) or w.dtype != x.dtype:
        raise ValueError(f"{what}: bf16/fp16/fp32 x and w of one dtype only")
    if x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"{what}: unit stride along K")
    if glu and w.shape[0] % 2:
        raise ValueError(f"{what}: a [gate | up] weight has an even row count, got {w.shape[0]}")


def rows_linear(x: torch.Tensor, w: torch.Tensor, config: GemvConfig | None = None, *,
                glu: bool = False, bias: torch.Tensor | None = None,
                use_pdl: bool | None = None, block_m: int | None = None) -> torch.Tensor:
    """x [M, K] @ w.T (+ bias) in MAX_ROWS-row tiles; glu: w is [gate | up] [2N, K] and the
    result is silu(x @ gate.T) * (x @ up.T) [M, N]. bf16/fp16 (fp32 through fp32 dots), unit
    stride along K; anything else raises ValueError (callers take F.linear). The engine's fast
    path sends it 2..MAX_ROWS rows; the deterministic mode every row count (layers/linear.py).
    block_m: rows a tile holds (a power of two >= 16; None: `tile_rows`' choice)."""
    _check(x, w, glu, "rows_linear")
    if bias is not None and (glu or bias.shape != (w.shape[0],)):
        raise ValueError("rows_linear: a bias of w's row count, without glu")
    m, k = x.shape
    n = w.shape[0] // 2 if glu else w.shape[0]
    cfg = config or choose(n, k, glu)
    use_pdl = pdl.enabled(x.device) if use_pdl is None else use_pdl
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    block_m = block_m or tile_rows(m)
    split, stages = cfg.SPLIT_K, tile_stages(cfg, block_m, glu)
    k_split = triton.cdiv(triton.cdiv(k, split), cfg.BLOCK_K) * cfg.BLOCK_K
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, cfg.BLOCK_N), split)
    ws = cnt = y
    if split > 1:
        ws = torch.empty((split, m, 2 * n if glu else n), dtype=torch.float32, device=x.device)
        cnt = _counters(x.device, grid[0] * grid[1])
    _rows_kernel[grid](
        x, w, y, bias if bias is not None else w, ws, cnt, m, n, k, k_split,
        x.stride(0), w.stride(0), y.stride(0),
        GLU=glu, BLOCK_M=block_m, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K,
        EVEN_K=k % cfg.BLOCK_K == 0 and k_split * split == k,
        F32_DOT=_INTERPRET or x.dtype == torch.float32, HAS_BIAS=bias is not None, SPLIT_K=split,
        PDL=use_pdl, PF_COLS=pdl.prefetch_cols(w), num_warps=cfg.num_warps,
        num_stages=stages, **({"launch_pdl": True} if use_pdl else {}))
    return y


MAX_SPLIT_TILES = 1 << 16  # output tiles a split-K call may have (its counters, 256 KB)
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _counters(device: torch.device, tiles: int) -> torch.Tensor:
    """Zeroed split-K tile counters on `device`, shared by every call (one stream: calls never
    overlap, and each call's last programs re-arm theirs). Allocated on first use, which must
    not be under CUDA-graph capture: a capture's warm-up call allocates them."""
    if tiles > MAX_SPLIT_TILES:
        raise ValueError(f"rows_linear: a split-K call of {tiles} output tiles, at most "
                         f"{MAX_SPLIT_TILES}: fewer rows a call")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _COUNTERS:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("rows_linear's split-K counters are allocated on first use, which "
                               "must not be under CUDA-graph capture: call it once eagerly first")
        _COUNTERS[device] = torch.zeros(MAX_SPLIT_TILES, dtype=torch.int32, device=device)
    return _COUNTERS[device]
