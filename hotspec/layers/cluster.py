"""Thread-block clusters (Hopper and later): consecutive programs along the grid's x axis that the
hardware schedules together on one GPC and that can wait for each other.

`launch(fn, grid, ctas, ...)` is `fn[grid](...)` with every `ctas` consecutive programs along x
one cluster; program ids are unchanged (the cluster of program x is x // ctas, its rank x % ctas).
Triton's own route to clusters, the `num_ctas` compile option, splits a kernel's tensors across
the cluster's CTAs, and its CTA planner fails on a kernel of two dots (the attention kernel, Triton
3.6); here the kernel is compiled for one CTA as usual and only its launch asks for clusters:
Triton's launcher sets the cluster dimension from the kernel's packed metadata (num_warps,
num_ctas, shared), so `launch` sets num_ctas there. That is a reliance on Triton's launcher
internals: a Triton whose metadata does not have that form is an error that says so, never a
launch without clusters.

`sync()`, inside such a kernel, is the cluster's barrier: arrive with release and wait with
acquire semantics at cluster scope, so every store a CTA made before it, global memory included,
is seen by every CTA of the cluster after it. The decode attention uses it to merge its kv splits
without a second kernel (layers/attention/triton_kernels.py, CLUSTER). There is no CPU
interpreter for either: callers take another path there.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

CLUSTER_MAX = 16  # the most CTAs per cluster on Hopper (more than 8: non-portable, Triton allows 16)


@triton.jit
def sync():
    """Every thread of every CTA of the cluster arrives (release) and waits (acquire). Returns 0,
    for callers to add to an address that must not be read before the barrier."""
    return tl.inline_asm_elementwise(
        "barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;\n\t"
        "mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


def launch(fn: Any, grid: tuple[int, int, int], ctas: int, *args: Any, **kwargs: Any) -> None:
    """fn[grid](*args, **kwargs) with every `ctas` consecutive programs along x as one cluster
    (grid[0] a multiple of ctas; ctas 2..8 or 16). The compiled kernel (one per
    specialization: make `ctas` part of its constexprs) keeps the cluster size for every launch."""
    if not (2 <= ctas <= 8 or ctas == CLUSTER_MAX) or grid[0] % ctas:
        raise ValueError(f"cluster.launch: {ctas} CTAs per cluster over a grid of {grid[0]} along "
                         "x; use 2 to 8 or 16 CTAs that divide it")
    kernel = fn.warmup(*args, grid=grid, **kwargs)  # compiled, not launched
    if hasattr(kernel, "result"):
        kernel = kernel.result()
    meta = getattr(kernel, "packed_metadata", None)
    if not (isinstance(meta, tuple) and len(meta) == 3 and meta[1] in (1, ctas)
            and getattr(kernel.metadata, "global_scratch_size", 0) == 0):
        raise RuntimeError(
            f"cluster.launch: Triton {triton.__version__}'s compiled kernel does not have the "
            f"launch metadata (num_warps, num_ctas, shared) this relies on (got {meta!r}); turn "
            "the cluster path off (HOTSPEC_ATTN_CLUSTER=0) or update layers/cluster.py")
    if meta[1] != ctas:
        kernel.packed_metadata = (meta[0], ctas, meta[2])
    fn[(grid[0] // ctas, grid[1], grid[2])](*args, **kwargs)  # the launcher multiplies x back
