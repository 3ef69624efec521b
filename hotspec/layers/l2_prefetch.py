"""Pull the next weights into L2 on a side stream while latency-bound kernels run
(HOTSPEC_L2_PREFETCH=1; an A/B switch, off until the H200 measures it).

At batch-1 decode of the 8B shape, RoPE/KV store, attention and its split combine take about
10 us per layer and read about 2 MB (RESULTS "Session 9"): HBM idles while they run, long enough
to stream ~40 MB. The o_proj weight read right after them (33.5 MB) fits in the H200's 50 MB L2.
So `Attention.attend` forks a prefetch of its o_proj weight, then of the start of the MLP's
gate_up weight while the budget lasts (HOTSPEC_L2_PREFETCH_FRACTION of L2; the default 0.7 is
o_proj and 1.5 MB of gate_up on the H200), onto a side stream before RoPE (`fork`), and joins
it before the o_proj GEMV (`join`), which then reads from L2; so do the gate_up programs whose
rows were prefetched. In a CUDA graph the fork and join are captured as a parallel branch of the
step.

Session 9's PDL attempt at the same window (`HOTSPEC_PDL_PREFETCH_L2=0.7`: the o_proj GEMV
prefetching its own weight) gained nothing, because a PDL-launched GEMV only starts once the
kernel before it (the split combine) has started, which leaves the combine's 2 us, not attention's
10. A prefetch changes no value, so this can only cost time, never correctness.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

_LINE = 128  # bytes per L2 line: one prefetch instruction each
_LINES = 1024  # lines per program per loop step
_MAX_PROGRAMS = 32


@dataclass(frozen=True)
class Branch:
    """A prefetch forked onto `stream`; `join` makes the current stream wait for it."""
    stream: torch.cuda.Stream


@functools.cache
def switched_on() -> bool:
    return os.environ.get("HOTSPEC_L2_PREFETCH", "0") not in ("", "0")


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
def l2_bytes(index: int) -> int:
    """The L2 size of CUDA device `index`."""
    return int(torch.cuda.get_device_properties(index).L2_cache_size)


@functools.cache
def budget_fraction() -> float:
    """The share of L2 a fork may fill (HOTSPEC_L2_PREFETCH_FRACTION; 0.7 holds the 8B o_proj)."""
    return l2_share("HOTSPEC_L2_PREFETCH_FRACTION", 0.7)


def enabled(w: torch.Tensor, rows: int) -> bool:
    """Whether to prefetch `w` ahead of a projection over `rows` token rows: the switch, a
    contiguous CUDA weight of 2-byte elements, few rows (a decode or speculative step, where the
    projection is a weight stream; a prefill is compute-bound) and not Triton's interpreter (it
    runs no inline PTX)."""
    if not (switched_on() and w.is_cuda and w.element_size() == 2 and w.is_contiguous() and rows <= 16):
        return False
    return os.environ.get("TRITON_INTERPRET", "0") in ("", "0")


def fork(weights: Sequence[torch.Tensor], rows: int) -> Branch | None:
    """Start pulling `weights` into L2, in order, until the L2 fraction is used up, on a side
    stream after what the current stream has queued so far; None (nothing done) where `enabled`
    says no for the first weight (the others are skipped where it says no for them)."""
    if not weights or not enabled(weights[0], rows):
        return None
    device = weights[0].device
    index = device.index if device.index is not None else torch.cuda.current_device()
    todo = plan([w for w in weights if enabled(w, rows)], int(budget_fraction() * l2_bytes(index)))
    side = _side_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for w, lines in todo:
            prefetch(w, lines)
    return Branch(side)


def join(branch: Branch | None) -> None:
    """Order what the current stream queues next after the forked prefetch (a no-op for None)."""
    if branch is not None:
        torch.cuda.current_stream(branch.stream.device).wait_stream(branch.stream)


def plan(weights: Sequence[torch.Tensor], budget: int) -> list[tuple[torch.Tensor, int]]:
    """(weight, 128-byte lines from its start) to prefetch: the weights in order, whole while the
    `budget` bytes last, the first one that does not fit in part, none after it."""
    todo = []
    for w in weights:
        lines = min(w.numel() * w.element_size(), budget) // _LINE
        if lines <= 0:
            break
        todo.append((w, lines))
        budget -= lines * _LINE
    return todo


def prefetch(w: torch.Tensor, lines: int) -> None:
    """Issue an L2 prefetch (evict-last) for the first `lines` 128-byte lines of contiguous `w`,
    on the current stream; reads nothing back, writes nothing."""
    if not w.is_contiguous():
        raise ValueError("l2_prefetch: contiguous weights only")
    grid = (min(_MAX_PROGRAMS, triton.cdiv(lines, _LINES)),)
    _prefetch_kernel[grid](w, lines, STRIDE=_LINE // w.element_size(), LINES=_LINES, num_warps=4)


@functools.cache
def _side_stream(device: torch.device) -> torch.cuda.Stream:
    # created on first use, in the eager warm-up pass that precedes every CUDA-graph capture
    return torch.cuda.Stream(device=device)


@triton.jit
def _prefetch_kernel(P, n_lines, STRIDE: tl.constexpr, LINES: tl.constexpr):
    """Program p prefetches lines p*LINES.., stepping by the grid; lines past the end clamp to the
    last one (prefetching a line twice costs nothing)."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * LINES
    for start in range(pid * LINES, n_lines, step):
        offs = tl.minimum(start + tl.arange(0, LINES), n_lines - 1).to(tl.int64)
        tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; // $0", "=r,l",
                                  [P + offs * STRIDE], dtype=tl.int32, is_pure=False, pack=1)
