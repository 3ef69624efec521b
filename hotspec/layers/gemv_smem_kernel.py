"""The resident one-row GEMV with its weight slice in shared memory (Gluon: Triton's
layout-explicit dialect, for the shared-memory buffer and the cp.async copies that plain Triton
does not expose). gemv_kernels.gemv runs it for a config with PIPE 0 and BLOCK_K < K.

y[n] = w[n, :] . x for the program's BLOCK_N rows. Before its PDL wait a program issues cp.async
copies of its whole [BLOCK_N, K] weight slice into shared memory, in [BLOCK_N, BLOCK_K] chunks,
so it holds BLOCK_N x K weights on chip with few registers (4 x 4096 at 4 warps: 32 KB of
shared memory, 67 registers; six programs an SM). Where the kernel before leaves HBM idle
(o_proj's: the attention and its split combine) the resident programs fill it with their
weights. After the wait a program reads x, waits for its copies and reduces chunk by chunk.
CUDA only (Gluon has no interpreter)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp


@gluon.jit
def _gdc(op: gl.constexpr):
    gl.inline_asm_elementwise(op + "; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def gemv_smem_kernel(X, W, Y, N, stride_wn, K: gl.constexpr, BLOCK_K: gl.constexpr,
                     BLOCK_N: gl.constexpr, PDL: gl.constexpr):
    """K a multiple of BLOCK_K; rows past N are masked off (copied as zeros, not stored)."""
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [1, gl.num_warps()], [1, 0])
    sh: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    CHUNKS: gl.constexpr = K // BLOCK_K
    pid = gl.program_id(0)
    rows = pid.to(gl.int64) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, blk))
    cols = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, blk))
    n_ok = rows < N
    w_rows = W + rows[:, None] * stride_wn
    if PDL:
        _gdc("griddepcontrol.launch_dependents")
    buf = gl.allocate_shared_memory(gl.bfloat16, [CHUNKS, BLOCK_N, BLOCK_K], sh)
    for c in gl.static_range(CHUNKS):  # weights only before the wait (read-only)
        cp.async_copy_global_to_shared(buf.index(c), w_rows + (c * BLOCK_K + cols)[None, :],
                                       mask=n_ok[:, None], eviction_policy="evict_first")
    cp.commit_group()
    if PDL:
        _gdc("griddepcontrol.wait")
    acc = gl.zeros([BLOCK_N, BLOCK_K], gl.float32, blk)
    cp.wait_group(0)
    gl.thread_barrier()
    for c in gl.static_range(CHUNKS):
        x = gl.load(X + c * BLOCK_K + cols)
        acc += buf.index(c).load(blk).to(gl.float32) * x.to(gl.float32)[None, :]
    gl.store(Y + rows, gl.sum(acc, axis=1).to(Y.dtype.element_ty), mask=n_ok)
