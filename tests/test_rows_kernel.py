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


def _norm_reference(x: torch.Tensor, r: torch.Tensor | None, g: torch.Tensor, eps: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + r) * g rounded where fused_kernels.rms_norm rounds, x + r) in fp32 values."""
    s = _round(x.float() + r.float()) if r is not None else x.float()
    inv = torch.rsqrt((s * s).sum(-1, keepdim=True) / s.shape[-1] + eps)
    return _round(g.float() * _round(s * inv)), s


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


@pytest.mark.parametrize("m,k,n,glu,res", [
    (3, 72, 40, False, True),    # K not a multiple of the tile
    (4, 64, 48, True, True),     # the MLP: norm, gate_up, silu * up in one kernel
    (16, 96, 24, False, False),  # the first layer: no residual
])
def test_norm_rows_linear_matches_norm_then_linear(m, k, n, glu, res):
    """The norm folded in: the new residual stream bit for bit, the output as rms_norm then the
    projection compute it (the same rounding: bit-equal up to the fp32 summation order)."""
    x, w = _inputs(m, k, 2 * n if glu else n, seed=7 * m + k)
    g = torch.Generator(device=DEV).manual_seed(k)
    r = (torch.randn(m, k, generator=g, device=DEV) * 2).to(BF16) if res else None
    nw = (1 + 0.1 * torch.randn(k, generator=g, device=DEV)).to(BF16)
    y, s = rk.norm_rows_linear(x, r, nw, 1e-5, w, SMALL, glu=glu)
    h, s_ref = _norm_reference(x, r, nw, 1e-5)
    assert torch.equal(s.float(), s_ref) and (res or s is x)
    _check(y, _reference(h, w, glu))
    with pytest.raises(ValueError, match="norm weight"):
        rk.norm_rows_linear(x, r, nw[:-1], 1e-5, w, SMALL, glu=glu)


def test_rows_linear_row_strided_x_and_the_row_limit():
    """A row-strided x (a view of a wider buffer) reads its rows at their stride; MAX_ROWS rows
    run and one more is refused."""
    x, w = _inputs(rk.MAX_ROWS, 64, 16, seed=3)
    _check(rk.rows_linear(x[:, :32], w[:, :32], SMALL), _reference(x[:, :32], w[:, :32], False))
    x, w = _inputs(rk.MAX_ROWS + 1, 32, 16, seed=3)
    with pytest.raises(ValueError, match="M must be"):
        rk.rows_linear(x, w, SMALL)


def test_rows_linear_rejects_what_it_does_not_handle():
    x, w = _inputs(4, 32, 16, seed=5)
    with pytest.raises(ValueError, match="bf16/fp16"):
        rk.rows_linear(x.float(), w.float())
    with pytest.raises(ValueError, match="even row count"):
        rk.rows_linear(x, w[:15], glu=True)
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
    x, w = torch.zeros(4, 576, dtype=BF16), torch.zeros(960, 576, dtype=BF16)
    assert fused.rows_config(x, w, norm=True) is None, "the engine folds no norm by default"
    monkeypatch.setattr(fused, "NORM_FOLD_MAX_K", 1024)
    assert fused.rows_config(x, w, norm=True) == rk.choose(960, 576, False)
    assert fused.rows_config(torch.zeros(4, 4096, dtype=BF16), torch.zeros(6144, 4096, dtype=BF16),
                             norm=True) is None


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("n,k,glu", [(960, 576, False), (1536, 576, True), (1152, 896, False)])
@pytest.mark.parametrize("m", [2, 5, 16])
def test_gpu_norm_rows_linear_small_hidden(n, k, glu, m):
    """The norm folded in at small hidden sizes (SmolLM2's 576, Qwen2.5-0.5B's 896), PDL on."""
    x, w = _inputs(m, k, 2 * n if glu else n, seed=m + 1)
    r, _ = _inputs(m, k, 1, seed=m + 2)
    nw = (1 + 0.1 * torch.randn(k, device=DEV)).to(BF16)
    y, s = rk.norm_rows_linear(x, r, nw, 1e-6, w, glu=glu)
    h, s_ref = _norm_reference(x, r, nw, 1e-6)
    assert torch.equal(s.float(), s_ref)
    _check(y, _reference(h, w, glu))


@pytest.mark.parametrize("res", [True, False], ids=["add+norm", "norm"])
def test_layer_paths_fold_the_norm_where_the_rule_allows(monkeypatch, res):
    """linear.norm_linear and norm_mlp at 4 rows with the few-row kernels (interpreter on the
    CPU): folding the norm in (fused.NORM_FOLD_MAX_K) gives the stream bit for bit and the
    output within bf16 rounding of the norm kernel followed by the GEMM."""
    from torch import nn

    from hotspec.layers import fused
    from hotspec.layers.linear import norm_linear, norm_mlp
    from hotspec.layers.norm import RMSNorm

    monkeypatch.setattr(fused, "_on_device", lambda x: True)
    monkeypatch.setattr(fused, "_available", lambda: True)
    torch.manual_seed(5)
    h, inter = 64, 48
    norm = RMSNorm(h, 1e-5).to(BF16)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(h))
    qkv, gate_up, down = (nn.Linear(a, b, bias=False).to(BF16).requires_grad_(False)
                          for a, b in [(h, 96), (h, 2 * inter), (inter, h)])
    x = torch.randn(4, h).to(BF16)
    r = torch.randn(4, h).to(BF16) if res else None

    calls = []
    real = fused.norm_rows_linear
    monkeypatch.setattr(fused, "norm_rows_linear", lambda *a, **k: calls.append(1) or real(*a, **k))

    def run(fold_k: int):
        monkeypatch.setattr(fused, "NORM_FOLD_MAX_K", fold_k)
        with torch.no_grad():
            return norm_linear(norm, qkv, x, r), norm_mlp(norm, gate_up, down, x, r)

    (y0, s0), (m0, t0) = run(0)
    assert calls == []
    (y1, s1), (m1, t1) = run(1024)
    assert calls == [1, 1], "both pre-norm projections fold the norm"
    assert torch.equal(s0, s1) and torch.equal(t0, t1)
    for a, b in [(y1, y0), (m1, m0)]:
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)
