"""layers/norm_rows_kernel.py: the RMSNorm folded into the tiled GEMM after it (the
deterministic mode's narrow rows, at every row count), against the norm then
F.linear (then silu * up) in fp32, and a row's bits alike alone and in any batch. On the CPU the
kernel runs in Triton's interpreter (TRITON_INTERPRET=1, conftest)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from hotspec.layers import norm_rows_kernel as nr  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
BF16 = torch.bfloat16


def _round(t: torch.Tensor) -> torch.Tensor:
    """float32 -> bf16 -> float32, rounding as the kernel's casts do on this device."""
    if CUDA:
        return t.to(BF16).float()
    return (t.float().view(torch.int32) & -65536).view(torch.float32)  # interpreter: truncation


def _inputs(m: int, k: int, n_rows: int, seed: int):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(m, k, generator=g, device=DEV).to(BF16)
    res = torch.randn(m, k, generator=g, device=DEV).to(BF16)
    gain = (1 + torch.randn(k, generator=g, device=DEV) / 4).to(BF16)
    w = (torch.randn(n_rows, k, generator=g, device=DEV) / k ** 0.5).to(BF16)
    return x, res, gain, w


def _reference(x, res, gain, w, glu: bool, eps: float = 1e-5):
    s = x.float() + (res.float() if res is not None else 0)
    h = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * gain.float()
    y = F.linear(h, w.float())
    if glu:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y


@pytest.mark.parametrize("m,k,n_rows,glu,with_res", [(3, 72, 40, False, True),
                                                     (37, 64, 48, True, True),
                                                     (5, 96, 24, False, False)])
def test_norm_rows_linear_matches_the_norm_then_linear(m, k, n_rows, glu, with_res):
    """Close to the fp32 norm then linear (a K that is no power of two, ragged column blocks,
    rows past a tile, glu); the stream is x + residual rounded once, and without a residual
    it is x itself; a bias is added."""
    x, res, gain, w = _inputs(m, k, n_rows, seed=m)
    r = res if with_res else None
    bias = None if glu else (torch.randn(n_rows, device=DEV) / 4).to(BF16)
    y, s = nr.norm_rows_linear(x, r, gain, 1e-5, w, glu=glu, bias=bias)
    ref = _reference(x, r, gain, w, glu) + (0 if bias is None else bias.float())
    torch.testing.assert_close(y.float(), ref, rtol=3e-2, atol=3e-2)
    if with_res:
        assert torch.equal(s.float(), _round(x.float() + res.float()))
    else:
        assert s is x


def test_norm_rows_rows_are_batch_invariant():
    """A row's output (and stream) is the same bits alone, among a few rows and among 37."""
    x, res, gain, w = _inputs(37, 64, 48, seed=9)
    every, s_every = nr.norm_rows_linear(x, res, gain, 1e-5, w, glu=True)
    for rows in (slice(0, 1), slice(20, 23), slice(36, 37)):
        y, s = nr.norm_rows_linear(x[rows].contiguous(), res[rows].contiguous(), gain, 1e-5, w,
                                   glu=True)
        assert torch.equal(y, every[rows]) and torch.equal(s, s_every[rows]), rows


def test_norm_rows_refuses_what_it_does_not_fold():
    x, res, gain, w = _inputs(2, 64, 16, seed=1)
    assert not nr.folds(x.float(), w.float())
    wide = torch.zeros(2, nr.NORM_ROWS_MAX_K + 64, dtype=BF16, device=DEV)
    assert not nr.folds(wide, torch.zeros(4, wide.shape[1], dtype=BF16, device=DEV))
    with pytest.raises(ValueError, match="norm_rows_linear"):
        nr.norm_rows_linear(x.float(), None, gain, 1e-5, w.float())


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("n_rows,k,glu", [(960, 576, False), (3072, 576, True), (1152, 896, False)])
def test_gpu_norm_rows_real_shapes(n_rows, k, glu):
    """SmolLM2's qkv and gate_up, Qwen2.5-0.5B's qkv: close to the reference, a row alike among
    1 to 300 rows."""
    x, res, gain, w = _inputs(300, k, n_rows, seed=n_rows)
    every, _ = nr.norm_rows_linear(x, res, gain, 1e-5, w, glu=glu)
    torch.testing.assert_close(every.float(), _reference(x, res, gain, w, glu), rtol=3e-2,
                               atol=3e-2)
    for rows in (slice(0, 1), slice(7, 10), slice(100, 117), slice(299, 300)):
        y, _ = nr.norm_rows_linear(x[rows].contiguous(), res[rows].contiguous(), gain, 1e-5, w,
                                   glu=glu)
        assert torch.equal(y, every[rows]), rows


@pytest.mark.parametrize("bias", [False, True])
def test_the_norm_folds_in_the_deterministic_mode_only(bias, monkeypatch):
    """norm_linear of narrow rows is the fold's one kernel in the deterministic mode (its bits,
    close to the reference) and the norm then the projection outside it, at every row count. (On
    the CPU the fused path is forced, in the interpreter.)"""
    from torch import nn

    from hotspec.layers import deterministic, fused
    from hotspec.layers.linear import norm_linear
    from hotspec.layers.norm import RMSNorm

    if not CUDA:
        monkeypatch.setattr(fused, "enabled", lambda *a: True)

    x, res, gain, w = _inputs(17, 576, 960, seed=3)
    lin = nn.Linear(576, 960, bias=bias, device=DEV, dtype=BF16).requires_grad_(False)
    lin.weight.copy_(w)
    norm = RMSNorm(576, 1e-5).to(DEV, BF16).requires_grad_(False)
    norm.weight.copy_(gain)
    for m in (1, 4, 16, 17):
        xs, rs = x[:m].contiguous(), res[:m].contiguous()
        assert not fused.norm_rows_ok(xs, lin.weight, norm.weight), m
        with deterministic.mode(True):
            assert fused.norm_rows_ok(xs, lin.weight, norm.weight), m
            y, s = norm_linear(norm, lin, xs, rs)
        want, want_s = nr.norm_rows_linear(xs, rs, gain, 1e-5, w, bias=lin.bias)
        assert torch.equal(y, want) and torch.equal(s, want_s), m
        ref = _reference(xs, rs, gain, w, False) + (lin.bias.float() if bias else 0)
        torch.testing.assert_close(y.float(), ref, rtol=3e-2, atol=3e-2)
