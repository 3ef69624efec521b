"""Programmatic Dependent Launch (Hopper and later): a kernel may start while the one before it in
the stream is still finishing, do the work that does not depend on it, then wait for it.

A decode step at batch 1 is ~200 small kernels in a row, each a pure weight stream; between two
of them the memory system idles while the last programs of one drain and the first of the next
ramp up. On by default on Hopper (HOTSPEC_PDL=0 turns it off; RESULTS "Session 8": 8B decode
4.33 -> 4.24 ms, SmolLM2 0.74 -> 0.60 ms, with the norm-GEMV on):
- the norms, the attention kernel and its split combine signal at their start that the next
  kernel may launch (`launch_dependents`; it orders nothing, so it is always safe);
- the decode GEMVs (layers/gemv_kernels.py, layers/norm_gemv_kernel.py) are launched with the PDL
  attribute: each pulls its own weight panel into L2, when the weight is small enough for that
  to pay (`prefetch_cols`), loads its first weight tile into registers (`preload`, one row),
  then waits for the kernel before it (`wait`).
  Weights are read-only, so that is the only work done before the wait: every read of an
  activation and every write (whose memory a CUDA graph's pool may share with a buffer the
  kernel before still reads) comes after.
Kernels launched without the attribute (cuBLAS, torch ops) keep the stream's plain ordering.

The step's other Triton kernels (RMSNorm, RoPE/KV store, attention, its split combine) are
PDL-launched too when the step has more than one row (`chained`): each waits for the kernel before
at its very start (`wait`, before any load or store), so only its launch and the residency of its
programs overlap the kernel before. Measured on the H200 (RESULTS "Session 9"): SmolLM2 decode at
batch 8 0.98 -> 0.87 ms and the speculative step at batch 1 (12-row verify, 8-row draft) faster,
but SmolLM2 decode at batch 1 0.60 -> 0.66 ms slower (the 8B shape at batch 1: 4.24 either way),
hence the row rule. Measured again in session 12, with the preload (o_proj's programs would preload
while attention runs): at one row still slower, 8B 4.08 -> 4.11 ms, SmolLM2's shape 0.55 -> 0.62.
One exception since session 21: the attention and its split combine are chained at one row too
when the o_proj after them is the resident GEMV (gemv_kernels, PIPE 0: each program loads its
whole weight slice before its wait), so that those programs launch and stream their weights
while the attention leaves HBM idle (8B batch 1: 3.82-3.83 against 3.86-3.87 ms).
HOTSPEC_PDL_ALL=1 chains every step, =0 none (A/B runs).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from hotspec.layers.switches import on_off


@functools.cache
def l2_bytes(index: int) -> int:
    """The L2 size of CUDA device `index`."""
    return int(torch.cuda.get_device_properties(index).L2_cache_size)


def l2_share(name: str, default: float) -> float:
    """A share of the device's L2 from environment variable `name` (unset: `default`): a number in
    [0, 1], else an error that names the variable."""
    v = os.environ.get(name, str(default))
    try:
        f = float(v)
    except ValueError:
        f = -1.0
    if not 0 <= f <= 1:
        raise ValueError(f"{name}={v!r}: use a share of L2 in [0, 1]")
    return f


@functools.cache
def _switch() -> bool:
    return os.environ.get("HOTSPEC_PDL", "1") not in ("", "0")


def prefetch_cols(w: torch.Tensor) -> int:
    """Columns of its weight panel a GEMV program over `w` prefetches to L2 before its wait: -1
    (all) when the weight fits in a third of the device's L2, else 0. A prefetch of weights that
    do not fit is evicted before use and read twice (RESULTS "Session 8": the 8B shape's GEMV
    weights, 34-235 MB against the H200's 50 MB L2, made decode 5.17 ms whole-panel against 4.24
    ms without; SmolLM2's, at most 3.5 MB, gain 0.66 -> 0.60 ms). Only the first 512 columns
    (no preload): 4.13 ms, 1024: 4.25, against 4.07 with `preload`'s one tile in registers, in
    one call (session 10).
    HOTSPEC_PDL_PREFETCH=<columns> overrides it (-1 all, 0 none) for A/B runs, and
    HOTSPEC_PDL_PREFETCH_L2=<fraction> moves the bound (A/B: 0.7, which takes in the 8B o_proj,
    33.5 MB, to overlap the attention before it, made the 8B step 4.27 ms instead of 4.24)."""
    forced = _prefetch_override()
    if forced is not None:
        return forced
    if w.device.type != "cuda":
        return 0
    index = w.device.index if w.device.index is not None else torch.cuda.current_device()
    return -1 if w.numel() * w.element_size() <= _prefetch_l2_fraction() * l2_bytes(index) else 0


@functools.cache
def _prefetch_l2_fraction() -> float:
    return l2_share("HOTSPEC_PDL_PREFETCH_L2", 1 / 3)


@functools.cache
def _prefetch_override() -> int | None:
    v = os.environ.get("HOTSPEC_PDL_PREFETCH", "")
    return int(v) if v else None


def preloads(use_pdl: bool, eligible: bool, slice_k: int, block_k: int) -> bool:
    """Whether a GEMV program loads its first weight tile into registers before its PDL wait
    (HOTSPEC_PDL_PRELOAD, on by default; 0 turns it off): the panel's start is read from HBM while
    the kernel before drains, and is used from registers, not read again. Only with PDL, for
    `eligible` launches (one row: the tl.dot GEMV of 2-16 rows did not gain, RESULTS
    "Session 11") where the shortest K slice a program owns, `slice_k`, holds a whole tile (a
    ragged rest is left to the masked loop).
    Measured on the H200 (RESULTS "Session 10"), 8B shape at batch 1, two runs each in one call:
    4.13 ms without, 4.06-4.07 with it; SmolLM2's shape 0.56-0.57 -> 0.55 ms. Two tiles were
    slower (4.21 ms: the registers held across the wait cost more than they hide) and were
    dropped."""
    return _preload_switch() and use_pdl and eligible and slice_k >= block_k


@functools.cache
def _preload_switch() -> bool:
    return on_off("HOTSPEC_PDL_PRELOAD", True)


def enabled(device: torch.device) -> bool:
    """Whether kernels on `device` use PDL: the switch, a CUDA device of compute capability 9+,
    and not Triton's interpreter (which has no grid dependency control)."""
    if not _switch() or device.type != "cuda":
        return False
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device()) >= 9


def chained(device: torch.device, rows: int, before_resident: bool = False) -> bool:
    """Whether a non-GEMV Triton kernel over `rows` token rows on `device` is PDL-launched (it then
    calls `wait` first thing): with `enabled`, when rows > 1 or the kernel after it is the resident
    GEMV (`before_resident`; HOTSPEC_PDL_ALL=1: always; =0: never). Inside a CUDA graph the row
    count is the captured batch's, so the choice is fixed per graph.
    Why `before_resident`: the resident GEMV's programs load their whole weight slice before their
    wait (gemv_kernels, PIPE 0), so they should become resident while the attention still runs;
    a kernel launched plainly between them (the split combine) would hold their launch back until
    the attention ends (RESULTS "Session 21")."""
    if not enabled(device):
        return False
    mode = _all_switch()
    return rows > 1 or before_resident if mode == "auto" else mode == "1"


def launch_kwargs(device: torch.device, rows: int, before_resident: bool = False) -> dict[str, bool]:
    """Launch options of a kernel that waits first thing when `chained` (the PDL attribute)."""
    return {"launch_pdl": True} if chained(device, rows, before_resident) else {}


def describe(device: torch.device) -> str:
    """Which kernels on `device` are PDL-launched, for the start-up log."""
    if not enabled(device):
        return "no PDL (Hopper or later only; HOTSPEC_PDL=0 turns it off)"
    pre = (", each loading its first weight tile before its wait (HOTSPEC_PDL_PRELOAD=0 turns it off),"
           if _preload_switch() else " (no weight tile loaded before the wait: HOTSPEC_PDL_PRELOAD=0)")
    return f"PDL for the GEMVs{pre} " + {"auto": "and, in steps of more than one row or before a resident "
                                           "GEMV, the other kernels",
                                   "1": "and every other kernel (HOTSPEC_PDL_ALL=1)",
                                   "0": "only (HOTSPEC_PDL_ALL=0)"}[_all_switch()]


@functools.cache
def _all_switch() -> str:
    v = os.environ.get("HOTSPEC_PDL_ALL", "auto")
    if v not in ("auto", "0", "1"):
        raise ValueError(f"HOTSPEC_PDL_ALL={v!r}: use auto (the default), 1 or 0")
    return v


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
    line named twice by the clamping costs nothing. (Until session 10 the clamp was K - 1, so a
    COLS below 64 * CHUNK = 2048 still pulled whole chunks of 2048 columns: session 8's
    "512 columns" figure, 4.69 ms at the 8B shape, was in fact about half of every panel.)"""
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
