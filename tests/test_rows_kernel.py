"""layers/rows_kernel.py: the Triton GEMM of a few rows, and its glu epilogue (the MLP's
silu(gate) * up), against F.linear (then silu_mul) in fp32. On the CPU the kernel runs in
Triton's interpreter (TRITON_INTERPRET=1, conftest)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from hotspec.layers import rows_kernel as rk  # noqa: E402
from hotspec.layers.gemv_kernels import GemvConfig  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
BF16 = torch.bfloat16
SMALL = GemvConfig(BLOCK_N=16, BLOCK_K=32, num_warps=4, num_stages=2)


def _round(t: torch.Tensor) -> torch.Tensor:
    """float32 -> bf16 -> float32, rounding as the kernel's casts do on this device."""
    if CUDA:
        return t.to(BF16).float()
    return (t.float().view(torch.int32) & -65536).view(torch.float32)  # interpreter: truncation


def _inputs(m: int, k: int, n_rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = (torch.randn(m, k, generator=g, device=DEV) * 2).to(BF16)
    w = (torch.randn(n_rows, k, generator=g, device=DEV) / k ** 0.5).to(BF16)
    return x, w


def _reference(x: torch.Tensor, w: torch.Tensor, glu: bool) -> torch.Tensor:
    """F.linear in fp32; with glu, silu(gate) * up rounded as fused_kernels.silu_mul rounds."""
    y = F.linear(x.float(), w.float() if w.dtype != torch.float32 else w)
    if glu:
        gate, up = _round(y).chunk(2, dim=-1)
        y = _round(gate / (1.0 + torch.exp(-gate))) * up
    return y


def _check(y: torch.Tensor, ref: torch.Tensor) -> None:
    torch.testing.assert_close(y.float(), ref, rtol=1.6e-2, atol=1e-2)
    same = (y.float() == _round(ref)).float().mean().item()
    assert same >= 0.9, f"only {same:.3f} of the outputs are bit-identical to the reference"


@pytest.mark.parametrize("m,k,n,glu", [
    (2, 72, 40, False),    # K not a multiple of the tile, a ragged column block
    (4, 64, 48, True),     # gate and up accumulators, silu * up in the epilogue
    (16, 96, 24, True),
    (11, 64, 32, False),   # rows masked
])
def test_rows_linear_matches_linear(m, k, n, glu):
    x, w = _inputs(m, k, 2 * n if glu else n, seed=m + k)
    y = rk.rows_linear(x, w, SMALL, glu=glu)
    assert y.shape == (m, n) and y.dtype == BF16
    _check(y, _reference(x, w, glu))


def test_rows_linear_row_strided_x():
    """A row-strided x (a view of a wider buffer) reads its rows at their stride."""
    x, w = _inputs(rk.MAX_ROWS, 64, 16, seed=3)
    _check(rk.rows_linear(x[:, :32], w[:, :32], SMALL), _reference(x[:, :32], w[:, :32], False))


@pytest.mark.parametrize("glu,block_m", [(False, 16), (True, 16), (False, 64), (False, None),
                                         (True, None)])
def test_rows_linear_rows_are_batch_invariant(glu, block_m):
    """Past a tile's rows the rows go in further tiles, and every row comes out bit for bit as
    it does alone or among any other rows (the deterministic mode's linear), also where the
    tile's height follows the row count (block_m None: 32-row tiles here, 16 for a few rows
    alone); a bias is added in fp32 before the one rounding."""
    x, w = _inputs(2 * rk.MAX_ROWS + 5, 64, 32, seed=7)
    bias = None if glu else (torch.randn(32, device=DEV) / 4).to(BF16)
    every = rk.rows_linear(x, w, SMALL, glu=glu, bias=bias, block_m=block_m)
    ref = _reference(x, w, glu) + (0 if bias is None else bias.float())
    torch.testing.assert_close(every.float(), ref, rtol=1.6e-2, atol=1e-2)
    for rows in (slice(0, 1), slice(3, 4), slice(20, 37), slice(36, 37), slice(2, 30)):
        alone = rk.rows_linear(x[rows].contiguous(), w, SMALL, glu=glu, bias=bias, block_m=block_m)
        assert torch.equal(alone, every[rows]), rows
    assert rk.rows_linear(x[:0], w, SMALL, glu=glu, bias=bias).shape[0] == 0


@pytest.mark.parametrize("split,glu", [(2, False), (3, True), (3, False)])
def test_split_k_rows_are_batch_invariant_and_rearm_their_counters(split, glu):
    """Split-K (3 slices of 96 at 32-wide tiles: a short last one) sums its slices in order in
    the tile's last program: close to the reference, each row alike alone and among others, the
    same bits on a second call, and every counter back at 0 for the next call (or replay)."""
    x, w = _inputs(2 * rk.MAX_ROWS + 3, 96, 48, seed=split)
    cfg = GemvConfig(BLOCK_N=16, BLOCK_K=32, SPLIT_K=split, num_warps=4, num_stages=2)
    bias = None if glu else (torch.randn(48, device=DEV) / 4).to(BF16)
    every = rk.rows_linear(x, w, cfg, glu=glu, bias=bias)
    ref = _reference(x, w, glu) + (0 if bias is None else bias.float())
    torch.testing.assert_close(every.float(), ref, rtol=1.6e-2, atol=1e-2)
    assert torch.equal(rk.rows_linear(x, w, cfg, glu=glu, bias=bias), every)
    for rows in (slice(0, 1), slice(5, 21), slice(34, 35)):
        alone = rk.rows_linear(x[rows].contiguous(), w, cfg, glu=glu, bias=bias)
        assert torch.equal(alone, every[rows]), rows
    assert int(rk._counters(x.device, 1).abs().sum()) == 0


def test_rows_linear_rejects_what_it_does_not_handle():
    x, w = _inputs(4, 32, 16, seed=5)
    with pytest.raises(ValueError, match="bf16/fp16"):
        rk.rows_linear(x.double(), w.double())
    with pytest.raises(ValueError, match="even row count"):
        rk.rows_linear(x, w[:15], glu=True)
    with pytest.raises(ValueError, match="a bias of w's row count"):
        rk.rows_linear(x, w, bias=w[0])
    with pytest.raises(ValueError, match=r"x \[M, K\]"):
        rk.rows_linear(x, w[:, :16])


def test_choose_fits_shared_memory():
    for n, k, glu in [(6144, 4096, False), (14336, 4096, True), (960, 576, False), (1536, 576, True)]:
        cfg = rk.choose(n, k, glu)
        tiles = rk.MAX_ROWS + cfg.BLOCK_N * (2 if glu else 1)
        assert cfg.BLOCK_N >= 16 and cfg.num_stages * tiles * cfg.BLOCK_K * 2 <= rk.SMEM_BUDGET


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("n,k,glu", [(6144, 4096, False), (14336, 4096, True), (960, 576, False),
                                     (1536, 576, True)])
@pytest.mark.parametrize("m", [2, 4, 11, 16])
def test_gpu_rows_linear_real_shapes(n, k, glu, m):
    """The engine's shapes (Llama-3.1-8B and SmolLM2-135M qkv and gate_up) with the configs the
    engine chooses, PDL on."""
    x, w = _inputs(m, k, 2 * n if glu else n, seed=m)
    _check(rk.rows_linear(x, w, glu=glu), _reference(x, w, glu))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("n,k,glu", [(6144, 4096, False), (14336, 4096, True), (4096, 14336, False),
                                     (960, 576, False), (49152, 576, False)])
def test_gpu_rows_linear_rows_are_batch_invariant(n, k, glu):
    """The deterministic mode's linear (its config: split-K for the 8B's o and down) at the 8B's
    and SmolLM2's shapes (its LM head too): a row comes out bit for bit alike among 1 to 300
    rows, in tiles of 16 or 32 rows (`tile_rows`), and the same again on a second call."""
    cfg = rk.deterministic_config(n, k, glu)
    x, w = _inputs(300, k, 2 * n if glu else n, seed=n)
    every = rk.rows_linear(x, w, cfg, glu=glu)
    _check(every, _reference(x, w, glu))
    assert torch.equal(rk.rows_linear(x, w, cfg, glu=glu), every)
    for rows in (slice(0, 1), slice(7, 10), slice(100, 117), slice(40, 72), slice(0, 64),
                 slice(299, 300)):
        assert torch.equal(rk.rows_linear(x[rows].contiguous(), w, cfg, glu=glu), every[rows]), rows


def test_rows_config_takes_the_few_row_projections(monkeypatch):
    """Which Linears of 2..16 rows the Triton GEMM takes (fused.rows_config): the wide 8B qkv and
    gate_up and every SmolLM2 projection; not the large narrow 8B o and down (the split-K GEMV),
    not one row (decode's GEMV), not 17 rows (cuBLAS), not float32."""
    from hotspec.layers import fused

    monkeypatch.setattr(fused, "_on_device", lambda x: True)
    monkeypatch.setattr(fused, "_available", lambda: True)

    def cfg(m: int, n: int, k: int, glu: bool = False, dtype: torch.dtype = BF16):
        return fused.rows_config(torch.zeros(m, k, dtype=dtype), torch.zeros(n, k, dtype=dtype), glu)

    assert cfg(4, 6144, 4096) == rk.choose(6144, 4096, False)
    assert cfg(16, 28672, 4096, glu=True) == rk.choose(14336, 4096, True)
    assert all(cfg(4, n, k) is not None for n, k in [(960, 576), (576, 576), (576, 1536)])
    assert cfg(4, 4096, 4096) is None and cfg(16, 4096, 14336) is None
    assert cfg(1, 6144, 4096) is None and cfg(17, 6144, 4096) is None
    assert cfg(4, 6144, 4096, dtype=torch.float32) is None
