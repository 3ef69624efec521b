"""Programmatic Dependent Launch (Hopper and later): a kernel may start while the one before it in
the stream is still finishing, do the work that does not depend on it, then wait for it.

A decode step at batch 1 is ~200 small kernels in a row, each a pure weight stream; between two
of them the memory system idles while the last programs of one drain and the first of the next
ramp up. On by default on Hopper (the pdl switch, hotspec/envs.py, turns it off):
- the norms, the attention kernel and its split combine signal at their start that the next
  kernel may launch (`launch_dependents`; it orders nothing, so it is always safe);
- the decode GEMVs (layers/gemv_kernels.py, layers/norm_gemv_kernel.py) are launched with the PDL
  attribute: each pulls its own weight panel into L2 when the weight is small enough for that to
  pay (`prefetch_cols`), loads its first weight tile into registers (`preloads`, one row), then
  waits for the kernel before it (`wait`).
  Weights are read-only, so that is the only work done before the wait: every read of an
  activation and every write (whose memory a CUDA graph's pool may share with a buffer the
  kernel before still reads) comes after.
Kernels launched without the attribute (cuBLAS, torch ops) keep the stream's plain ordering.

The step's other Triton kernels (RMSNorm, RoPE/KV store, attention, its split combine) are
PDL-launched too when the step has more than one row, or when the kernel after them is the
resident GEMV (`chained`): each waits for the kernel before at its very start (`wait`, before any
load or store), so only its launch and the residency of its programs overlap the kernel before.
At one row that overlap costs more than it hides, except before the resident GEMV, whose
programs load their whole weight slice before their wait and so should launch while the
attention still leaves HBM idle.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from hotspec import envs

_PREFETCH_L2_SHARE = 1 / 3  # a weight within this share of L2 is prefetched; a larger one is not


@functools.cache
def l2_bytes(index: int) -> int:
    """The L2 size of CUDA device `index`."""
    return int(torch.cuda.get_device_properties(index).L2_cache_size)


def prefetch_cols(w: torch.Tensor) -> int:
    """Columns of its weight panel a GEMV program over `w` prefetches to L2 before its wait: -1
    (all) when the weight fits in a third of the device's L2, else 0: a prefetch of weights that
    L2 cannot hold is evicted before use and read twice."""
    if w.device.type != "cuda":
        return 0
    index = w.device.index if w.device.index is not None else torch.cuda.current_device()
    return -1 if w.numel() * w.element_size() <= _PREFETCH_L2_SHARE * l2_bytes(index) else 0


def preloads(use_pdl: bool, eligible: bool, slice_k: int, block_k: int) -> bool:
    """Whether a GEMV program loads its first weight tile into registers before its PDL wait: the
    panel's start is read from HBM while the kernel before drains, and is used from registers,
    not read again. Only with PDL, for `eligible` launches (one row: the tl.dot GEMV of 2-16 rows
    does not gain) where the shortest K slice a program owns, `slice_k`, holds a whole tile (a
    ragged rest is left to the masked loop)."""
    return use_pdl and eligible and slice_k >= block_k


def enabled(device: torch.device) -> bool:
    """Whether kernels on `device` use PDL: the switch, a CUDA device of compute capability 9+,
    and not Triton's interpreter (which has no grid dependency control)."""
    if not envs.switches().pdl or device.type != "cuda":
        return False
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device()) >= 9


def chained(device: torch.device, rows: int, before_resident: bool = False) -> bool:
    """Whether a non-GEMV Triton kernel over `rows` token rows on `device` is PDL-launched (it then
    calls `wait` first thing): with `enabled`, when rows > 1 or the kernel after it is the resident
    GEMV (`before_resident`: gemv_kernels, PIPE 0). Inside a CUDA graph the row count is the
    captured batch's, so the choice is fixed per graph."""
    return enabled(device) and (rows > 1 or before_resident)


def launch_kwargs(device: torch.device, rows: int, before_resident: bool = False) -> dict[str, bool]:
    """Launch options of a kernel that waits first thing when `chained` (the PDL attribute)."""
    return {"launch_pdl": True} if chained(device, rows, before_resident) else {}


def describe(device: torch.device) -> str:
    """Which kernels on `device` are PDL-launched, for the start-up log."""
    if not enabled(device):
        return "no PDL (Hopper or later only, with the pdl switch on)"
    return ("PDL for the GEMVs, each loading its first weight tile before its wait, and, in steps "
            "of more than one row or before a resident GEMV, the other kernels")


@functools.cache
def _capability(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


@triton.jit
def launch_dependents(PDL: tl.constexpr):
    """Let the next kernel in the stream launch (if it was launched with the PDL attribute)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait(PDL: tl.constexpr):
    """Wait until the kernel before has finished and its writes are visible."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def prefetch_rows(W, offs_n, N, k_lo, k_hi, stride_wn, CHUNK: tl.constexpr, COLS: tl.constexpr):
    """Pull rows `offs_n` (clamped to N) of W, columns [k_lo, k_hi) (only the first COLS of them
    when COLS >= 0; prefetch_cols), into L2: one prefetch per 128-byte line (64 two-byte
    elements), CHUNK lines per row at a time. Prefetches read nothing back and write nothing; a
    line named twice by the clamping costs nothing."""
    rows = tl.minimum(offs_n, N - 1)
    end = k_hi
    if COLS >= 0:
        end = tl.minimum(k_hi, k_lo + COLS)
    for k in range(k_lo, end, 64 * CHUNK):
        cols = tl.minimum(k + tl.arange(0, CHUNK) * 64, end - 1)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l",
                                  [W + rows[:, None] * stride_wn + cols[None, :]],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def preload(W, offs_n, N, k_lo, stride_wn, BLOCK_K: tl.constexpr, ON: tl.constexpr):
    """With ON, a program's first weight tile: rows `offs_n` of W (past N: 0), columns
    k_lo + [0, BLOCK_K); else a dummy scalar. Weights only: safe before `wait`."""
    if ON:
        cols = k_lo + tl.arange(0, BLOCK_K)
        return tl.load(W + offs_n[:, None] * stride_wn + cols[None, :], mask=(offs_n < N)[:, None],
                       other=0.0, eviction_policy="evict_first")
    else:
        return 0.0
