"""Greedy argmax over a vocabulary row, split across many programs.

torch.argmax reduces a row in one thread block: over the 8B shape's 128,256 logits at batch 1
that one block works while the rest of the card idles. Here each row is cut into chunks: one
program per (row, chunk) finds the chunk's largest value and its first index, then one program
per row picks the largest of those, the first on ties. The result is torch.argmax's: the first
index of the maximum, NaN counting as larger than everything (torch's rule), for any float dtype
(no cast needed).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotspec.layers import pdl, triton_interpret  # noqa: F401  (the interpreter fix)

BLOCK = 1024  # elements a program reads per iteration
CHUNK = 2 * BLOCK  # elements of a row per program (a 128k row: 63 programs)
MAX_CHUNKS = 256


@triton.jit
def _pick(v, nan, idx):
    """The winner among lanes (value v, NaN flag, index): a NaN if any, else the largest value;
    the smallest index among equals. Returns (value, NaN flag, index)."""
    any_nan = tl.max(nan.to(tl.int32), 0) > 0
    m = tl.max(v, 0)
    cand = tl.where(any_nan, nan, v == m)
    return m, any_nan, tl.min(tl.where(cand, idx, 2**31 - 1), 0)


@triton.jit
def _partial_kernel(X, PV, PN, PI, n, stride_x, chunk, n_chunks, BLOCK: tl.constexpr,
                    PDL: tl.constexpr = False):
    pdl.launch_dependents(PDL)
    pdl.wait(PDL)
    row = tl.program_id(0)
    c = tl.program_id(1)
    lo = c * chunk
    hi = tl.minimum(lo + chunk, n)
    best_v = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    best_n = tl.zeros([BLOCK], dtype=tl.int1)
    best_i = tl.full([BLOCK], 2**31 - 1, dtype=tl.int32)
    base = X + row.to(tl.int64) * stride_x
    for k in range(lo, hi, BLOCK):
        offs = k + tl.arange(0, BLOCK)
        ok = offs < hi
        x = tl.load(base + offs, mask=ok, other=float("-inf")).to(tl.float32)
        nan = x != x
        # per lane the offsets only grow, so strict comparisons keep the first index of a tie; a
        # lane's first element is always taken (a row of -inf still has an argmax)
        better = (nan & ~best_n) | ((nan == best_n) & (x > best_v))
        take = ok & ((best_i == 2**31 - 1) | better)
        best_v = tl.where(take, x, best_v)
        best_n = tl.where(take, nan, best_n)
        best_i = tl.where(take, offs, best_i)
    m, any_nan, i = _pick(best_v, best_n, best_i)
    tl.store(PV + row * n_chunks + c, m)
    tl.store(PN + row * n_chunks + c, any_nan.to(tl.int8))
    tl.store(PI + row * n_chunks + c, i)


@triton.jit
def _final_kernel(PV, PN, PI, OUT, OUT2, n_chunks, BLOCK_C: tl.constexpr, PDL: tl.constexpr = False,
                  HAS_OUT2: tl.constexpr = False):
    pdl.wait(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_C)
    ok = offs < n_chunks
    v = tl.load(PV + row * n_chunks + offs, mask=ok, other=float("-inf"))
    nan = tl.load(PN + row * n_chunks + offs, mask=ok, other=0) != 0
    i = tl.load(PI + row * n_chunks + offs, mask=ok, other=2**31 - 1)
    _, _, best = _pick(v, nan, i)
    tl.store(OUT + row, best.to(tl.int64))
    if HAS_OUT2:
        tl.store(OUT2 + row, best.to(tl.int64))


def argmax_rows(x: torch.Tensor, use_pdl: bool = False, out2: torch.Tensor | None = None
                ) -> torch.Tensor:
    """int64 [R]: the first index of each row's maximum of x [R, V] (unit stride along V).
    use_pdl: both kernels PDL-launched (Hopper; see argmax.py), each waiting first thing.
    out2: a second int64 destination (its first R elements, unit stride) the final kernel
    writes the same indices to (the overlap schedule's carry: no copy kernel after it)."""
    r, n = x.shape
    if out2 is not None and (out2.dtype != torch.int64 or out2.dim() != 1 or out2.numel() < r
                             or out2.stride(0) != 1 or out2.device != x.device):
        raise ValueError(f"argmax_rows: out2 must be a unit-stride int64 vector of at least {r} "
                         f"elements on {x.device}, got {out2.dtype} {tuple(out2.shape)}")
    out = torch.empty(r, dtype=torch.int64, device=x.device)
    if r == 0:
        return out
    n_chunks = min(triton.cdiv(n, CHUNK), MAX_CHUNKS)
    chunk = triton.cdiv(triton.cdiv(n, n_chunks), BLOCK) * BLOCK
    n_chunks = triton.cdiv(n, chunk)
    pv = torch.empty((r, n_chunks), dtype=torch.float32, device=x.device)
    pn = torch.empty((r, n_chunks), dtype=torch.int8, device=x.device)
    pi = torch.empty((r, n_chunks), dtype=torch.int32, device=x.device)
    _partial_kernel[(r, n_chunks)](x, pv, pn, pi, n, x.stride(0), chunk, n_chunks, BLOCK=BLOCK,
                                   num_warps=4, PDL=use_pdl, **({"launch_pdl": True} if use_pdl else {}))
    _final_kernel[(r,)](pv, pn, pi, out, out if out2 is None else out2, n_chunks,
                        BLOCK_C=max(16, triton.next_power_of_2(n_chunks)), num_warps=1,
                        PDL=use_pdl, HAS_OUT2=out2 is not None,
                        **({"launch_pdl": True} if use_pdl else {}))
    return out
