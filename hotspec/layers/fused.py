"""When to use the fused Triton kernels (layers/fused_kernels.py), and thin entry points to them.

They run for CUDA tensors whenever Triton imports; everything else (the CPU, CI) takes the torch
reference code next to each call site. The `fused_kernels` switch (hotspec/envs.py) turns them off
on CUDA too, to compare the two paths on a GPU. Nothing here imports Triton until a fast path
runs, so the engine runs on a CPU torch without Triton.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from typing import TYPE_CHECKING

import torch

from hotspec import envs
from hotspec.layers import deterministic

if TYPE_CHECKING:
    from hotspec.layers.gemv_kernels import GemvConfig

log = logging.getLogger("hotspec")
_SMS = 132  # H200: rows_config's rule of enough column blocks
# The most rows (2..) whose projections run as one-row GEMVs side by side, the norm folded in as
# at one row (row_gemv_config): the layer's launches of a decode step instead of the norm kernels
# plus the few-row tl.dot GEMM. 0: off; the H200 A/B against that path is lab/row_gemv_ab.sh
# (benchmarks/spec_phase_bench.py and decode_bench.py --row-gemv R).
ROW_GEMV_MAX = 0
ROW_GEMV_MAX_BYTES = 32 << 20  # larger weights (the 8B's) would not stay in L2 for every row


@functools.cache
def _available() -> bool:
    if not envs.switches().fused_kernels:
        return False
    try:
        if importlib.util.find_spec("triton") is None:  # the CPU torch wheel has none
            raise ImportError("no module named 'triton'")
        import hotspec.layers.fused_kernels  # noqa: F401
    except ImportError as e:  # no triton: the torch path, said once where it costs speed
        if torch.cuda.is_available():
            log.warning("fused Triton layer kernels unavailable (%s): CUDA runs the slower torch "
                        "layer code", e)
        return False
    return True


def enabled(x: torch.Tensor, *params: torch.Tensor) -> bool:
    """True when the fused kernels should handle `x` (a CUDA tensor, Triton importable) read with
    `params`. Never while autograd records: the kernels have no backward, so a trained draft head
    (training/) takes the torch code, or its gradients would silently stop at every norm."""
    if not (_on_device(x) and _available()):
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in (x, *params)))


def describe(device: torch.device) -> str:
    """One line for the start-up log: which layer-kernel paths run on `device` and the switch that
    turns each off, so a switch or a missing Triton shows at start-up, not only in a profile."""
    if device.type != "cuda":
        return "torch layer code (not CUDA)"
    if not _available():
        return "torch layer code (Triton unavailable or the fused_kernels switch off)"
    from hotspec.layers import pdl

    if deterministic.on():
        return "; ".join([
            "deterministic (batch-invariant): fused Triton norms, RoPE and greedy argmax; every "
            "Linear the tiled Triton GEMM at every row count, one config per weight (split-K for "
            "large narrow weights, slices summed in order); attention one tile over fixed "
            "128-key chunks merged in order, a tree's verify reading each node's keys as "
            "decode's sequence, a chain's causal",
            pdl.describe(device),
        ])
    return "; ".join([
        "fused Triton norms, RoPE and greedy argmax",
        "Triton GEMV where faster than cuBLAS, the norm (and a bias) folded in at one row"
        + (f" and 2-{ROW_GEMV_MAX} rows side by side" if ROW_GEMV_MAX > 1 else "")
        + "; Triton GEMM for 2-16 rows, SiLU*up in gate_up's epilogue" if _gemv_allowed()
        else "cuBLAS only (the gemv switch off)",
        pdl.describe(device),
    ])


def _on_device(x: torch.Tensor) -> bool:
    return x.is_cuda


def gemv_config(x: torch.Tensor, weight: torch.Tensor, silu_mul: bool = False,
                heuristic: bool = True) -> GemvConfig | None:
    """The Triton decode GEMV's config (layers/gemv_kernels.py) for `x @ weight.T` (x [M, K], or
    [M, 2K] = [gate | up] with silu_mul) when it runs here and measured faster than cuBLAS for the
    shape, else None (the caller runs nn.Linear); heuristic=False: table rows only (see
    gemv_kernels.choose). bf16/fp16 only: float32 stays with torch. The gemv switch off
    (hotspec/envs.py) keeps every Linear on cuBLAS."""
    if not _gemv_allowed():
        return None
    if x.dim() != 2 or x.stride(1) != 1:
        return None
    return _gemv_choice(x, x.shape[0], weight, silu_mul, heuristic)


def _gemv_choice(x: torch.Tensor, m: int, weight: torch.Tensor, silu_mul: bool, heuristic: bool
                 ) -> GemvConfig | None:
    """gemv_config for an input of m rows in x's dtype and device (its shape aside)."""
    if x.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != x.dtype:
        return None
    if weight.stride(1) != 1 or not enabled(x, weight):
        return None
    from hotspec.layers.gemv_kernels import choose

    return choose(m, weight.shape[0], weight.shape[1], silu_mul, heuristic)


def gemv_resident(like: torch.Tensor, rows: int, lin: torch.nn.Linear) -> bool:
    """Whether `linear(lin, x)` for an x of `rows` rows in `like`'s dtype and device runs the
    resident GEMV (gemv_kernels, PIPE 0), whose kernels before it are then PDL-chained
    (pdl.chained's `before_resident`): the 8B o_proj at one row."""
    if lin.bias is not None or not _gemv_allowed():
        return False
    cfg = _gemv_choice(like, rows, lin.weight, False, True)
    return cfg is not None and cfg.PIPE == 0


def _gemv_allowed() -> bool:
    """The GEMVs (and the norm folded into one) run: the gemv switch on, not the deterministic
    mode (a GEMV computes one row otherwise than the GEMM computes it among others)."""
    return envs.switches().gemv and not deterministic.on()


def deterministic_config(x: torch.Tensor, weight: torch.Tensor, glu: bool = False
                         ) -> GemvConfig | None:
    """In the deterministic mode (layers/deterministic.py), where the fused kernels run on x: the
    tiled GEMM's config for `x @ weight.T` at any row count, chosen from the weight's shape alone
    (layers/rows_kernel.deterministic_config), so a row computes alike in every batch; else None.
    An input the kernel cannot take raises: the mode never falls back to a batch-dependent
    kernel silently."""
    if not deterministic.on() or not enabled(x, weight):
        return None
    if x.dim() != 2 or x.stride(1) != 1 or weight.stride(1) != 1 or weight.dtype != x.dtype \
            or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"deterministic mode: no batch-invariant GEMM for x {tuple(x.shape)} "
                         f"{x.dtype} (stride {x.stride()}) @ weight {tuple(weight.shape)} "
                         f"{weight.dtype}: [M, K] inputs of the weight's dtype, unit stride")
    from hotspec.layers.rows_kernel import deterministic_config as config

    n, k = weight.shape
    return config(n // 2 if glu else n, k, glu)


def row_gemv_config(x: torch.Tensor, weight: torch.Tensor, silu_mul: bool = False
                    ) -> GemvConfig | None:
    """For x of 2..ROW_GEMV_MAX rows: the one-row GEMV config to run each row with, side by side
    in one launch (gemv(per_row=True)), where one row has one without split-K and the weight is
    at most ROW_GEMV_MAX_BYTES (its rows' programs read it from L2); else None."""
    if not 2 <= (x.shape[0] if x.dim() == 2 else 0) <= ROW_GEMV_MAX or not _rows_fit(weight):
        return None
    if not _gemv_allowed() or x.stride(1) != 1:
        return None
    cfg = _gemv_choice(x, 1, weight, silu_mul, True)
    return cfg if cfg is not None and cfg.SPLIT_K == 1 and cfg.PIPE in (1, 2) else None


def _rows_fit(weight: torch.Tensor) -> bool:
    """A weight small enough for its rows' programs to read from L2 (ROW_GEMV_MAX_BYTES)."""
    return weight.numel() * weight.element_size() <= ROW_GEMV_MAX_BYTES


def norm_gemv_config(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor
                     ) -> GemvConfig | None:
    """The GEMV config to run `norm(x) @ weight.T` in one kernel with (layers/norm_gemv_kernel.py):
    one row (or up to ROW_GEMV_MAX rows side by side), a one-row GEMV config without split-K, the
    norm weight in x's dtype; else None."""
    if x.dim() != 2 or not 1 <= x.shape[0] <= max(1, ROW_GEMV_MAX) or norm_weight.dtype != x.dtype:
        return None
    if x.shape[0] > 1 and not _rows_fit(weight):
        return None
    if not enabled(x, norm_weight):
        return None
    cfg = gemv_config(x[:1], weight)
    if cfg is None and _gemv_allowed():
        from hotspec.layers.gemv_kernels import NORM_TIES

        cfg = NORM_TIES.get((weight.shape[0], weight.shape[1]))
    if cfg is None or cfg.SPLIT_K != 1 or cfg.PIPE == 0:  # (no resident norm-GEMV)
        return None
    return cfg


def rows_config(x: torch.Tensor, weight: torch.Tensor, glu: bool = False) -> GemvConfig | None:
    """The config to run `x @ weight.T` (glu: silu(gate) * up of a [gate | up] weight) with the
    Triton GEMM of a few rows (layers/rows_kernel.py): 2..MAX_ROWS rows, bf16/fp16, the Triton
    GEMVs allowed, and a weight under 32 MB or enough column blocks for about half the SMs (a
    large narrow output, such as the 8B o and down projections, keeps the split-K GEMV or
    cuBLAS); else None."""
    if deterministic.on():
        return deterministic_config(x, weight, glu)
    if x.dim() != 2 or x.stride(1) != 1 or not _gemv_allowed():
        return None
    if x.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != x.dtype:
        return None
    from hotspec.layers.rows_kernel import MAX_ROWS, choose

    m, (n, k) = x.shape[0], weight.shape
    if not 2 <= m <= MAX_ROWS or weight.stride(1) != 1 or not enabled(x, weight):
        return None
    cfg = choose(n // 2 if glu else n, k, glu)
    wide = -(-(n // 2 if glu else n) // cfg.BLOCK_N) >= _SMS // 2
    return cfg if wide or n * k < 1 << 24 else None


def rows_linear(x: torch.Tensor, weight: torch.Tensor, config: GemvConfig, glu: bool = False,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    from hotspec.layers.rows_kernel import rows_linear as kernel

    return kernel(x, weight, config, glu=glu, bias=bias)


def norm_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
              weight: torch.Tensor, config: GemvConfig, bias: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    from hotspec.layers.norm_gemv_kernel import norm_gemv as kernel

    return kernel(x, residual, norm_weight, eps, weight, config, bias)


def gemv(x: torch.Tensor, weight: torch.Tensor, config: GemvConfig, silu_mul: bool = False,
         per_row: bool = False, bias: torch.Tensor | None = None) -> torch.Tensor:
    from hotspec.layers.gemv_kernels import gemv as kernel

    return kernel(x, weight, silu_mul=silu_mul, config=config, per_row=per_row, bias=bias)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None, out: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    from hotspec.layers.fused_kernels import rms_norm as kernel

    return kernel(x, weight, eps, residual, out)


def embed_norm_pair(ids: torch.Tensor, embed: torch.Tensor, w_embed: torch.Tensor, eps_embed: float,
                    feature: torch.Tensor, w_feature: torch.Tensor, eps_feature: float
                    ) -> torch.Tensor:
    from hotspec.layers.norm_pair_kernel import embed_norm_pair as kernel

    return kernel(ids, embed, w_embed, eps_embed, feature, w_feature, eps_feature)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    from hotspec.layers.fused_kernels import silu_mul as kernel

    return kernel(gate_up)


def rope_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
               cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               loc: torch.Tensor) -> torch.Tensor:
    from hotspec.layers.fused_kernels import rope_store as kernel

    return kernel(q, k, v, positions, cos, sin, k_cache, v_cache, loc)
