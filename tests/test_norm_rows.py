"""layers/norm_rows_kernel.py: the pre-norm step and the projection after it (and the MLP's
silu(gate) * up) for a few rows in one kernel, against the norm then the Linear in fp32. On the CPU
the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, conftest)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from hotspec.layers import norm_rows_kernel as nr  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
BF16 = torch.bfloat16
SMALL = nr.RowsConfig(BLOCK_N=16, BLOCK_K=32, num_warps=4, num_stages=2)


def _round(t: torch.Tensor) -> torch.Tensor:
    """float32 -> bf16 -> float32, rounding as the kernel's casts do on this device."""
    if CUDA:
        return t.to(BF16).float()
    return (t.float().view(torch.int32) & -65536).view(torch.float32)  # interpreter: truncation


def _inputs(m: int, k: int, n_rows: int, res: bool, seed: int):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = (torch.randn(m, k, generator=g, device=DEV) * 2).to(BF16)
    r = (torch.randn(m, k, generator=g, device=DEV) * 2).to(BF16) if res else None
    nw = (1 + 0.1 * torch.randn(k, generator=g, device=DEV)).to(BF16)
    w = (torch.randn(n_rows, k, generator=g, device=DEV) / k ** 0.5).to(BF16)
    return x, r, nw, w


def _reference(x, r, nw, w, eps: float, glu: bool):
    """rms_norm (fused_kernels' rounding) then the Linear in fp32, then silu(gate) * up rounded
    as fused_kernels.silu_mul rounds; and the new residual stream."""
    s = _round(x.float() + r.float()) if r is not None else x.float()
    inv = torch.rsqrt((s * s).mean(-1, keepdim=True) + eps)
    y = F.linear(_round(nw.float() * _round(s * inv)), w.float())
    if glu:
        gate, up = _round(y).chunk(2, dim=-1)
        y = _round(gate / (1.0 + torch.exp(-gate))) * up
    return y, s


@pytest.mark.parametrize("m,k,n,glu,res", [
    (2, 72, 40, False, True),     # K not a multiple of the tile, a ragged column block
    (4, 64, 48, True, True),      # the MLP's kernel: gate and up accumulators
    (16, 96, 24, True, False),    # the first layer: no residual
    (40, 64, 32, False, True),    # a 64-row tile, rows masked
])
def test_norm_rows_matches_norm_then_linear(m, k, n, glu, res):
    """The new residual bit for bit; the output within bf16 rounding of the norm then the Linear
    (the kernel scales by 1/rms after the products: the rounding differs by design)."""
    x, r, nw, w = _inputs(m, k, 2 * n if glu else n, res, seed=m + k)
    y, s = nr.norm_rows(x, r, nw, 1e-5, w, SMALL, glu=glu)
    ref, s_ref = _reference(x, r, nw, w, 1e-5, glu)
    assert y.shape == (m, n) and y.dtype == BF16
    assert torch.equal(s.float(), s_ref) and (res or s is x)
    torch.testing.assert_close(y.float(), ref, rtol=3e-2, atol=3e-2)
    rel = ((y.float() - ref).norm() / ref.norm()).item()
    assert rel < 1.5e-2, rel


def test_norm_rows_several_row_blocks():
    """More rows than one tile holds would need a second row block: the launch refuses them
    (MAX_ROWS), and the largest count runs in one 64-row tile."""
    x, r, nw, w = _inputs(nr.MAX_ROWS, 32, 16, True, seed=3)
    y, s = nr.norm_rows(x, r, nw, 1e-5, w, SMALL)
    ref, _ = _reference(x, r, nw, w, 1e-5, False)
    torch.testing.assert_close(y.float(), ref, rtol=3e-2, atol=3e-2)
    x, r, nw, w = _inputs(nr.MAX_ROWS + 1, 32, 16, True, seed=3)
    with pytest.raises(ValueError, match="M must be"):
        nr.norm_rows(x, r, nw, 1e-5, w, SMALL)


def test_norm_rows_rejects_what_it_does_not_handle():
    x, r, nw, w = _inputs(4, 32, 16, True, seed=5)
    with pytest.raises(ValueError, match="bf16/fp16"):
        nr.norm_rows(x.float(), None, nw.float(), 1e-5, w.float())
    with pytest.raises(ValueError, match="even row count"):
        nr.norm_rows(x, r, nw, 1e-5, w[:15], glu=True)
    with pytest.raises(ValueError, match=r"x \[M, K\]"):
        nr.norm_rows(x, r, nw, 1e-5, w[:, :16])


def test_choose_and_block_m():
    assert [nr.block_m(m) for m in (2, 16, 17, 33, 64)] == [16, 16, 32, 64, 64]
    for m, n, k, glu in [(4, 6144, 4096, False), (4, 14336, 4096, True), (16, 960, 576, False),
                         (8, 1536, 576, True)]:
        cfg = nr.choose(m, n, k, glu)
        assert cfg.BLOCK_N >= 16 and k % cfg.BLOCK_K == 0


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("n,k,glu", [(6144, 4096, False), (14336, 4096, True), (960, 576, False),
                                     (1536, 576, True)])
@pytest.mark.parametrize("m", [2, 4, 16, 48])
def test_gpu_norm_rows_real_shapes(n, k, glu, m):
    """The engine's shapes (Llama-3.1-8B and SmolLM2-135M qkv and gate_up) with the configs the
    engine chooses, PDL on."""
    x, r, nw, w = _inputs(m, k, 2 * n if glu else n, True, seed=m)
    y, s = nr.norm_rows(x, r, nw, 1e-5, w, glu=glu)
    ref, s_ref = _reference(x, r, nw, w, 1e-5, glu)
    assert torch.equal(s.float(), s_ref)
    rel = ((y.float() - ref).norm() / ref.norm()).item()
    assert rel < 1e-2, rel
