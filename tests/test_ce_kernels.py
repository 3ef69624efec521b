"""training/ce_kernels: the fused soft cross-entropy kernels equal chunked_ce's torch ops (loss,
log-sum-exps, argmax agreement with torch's first-index ties, and the logits' gradient) in float32
and bf16, across column blocks and ragged tails. On the CPU they run in Triton's interpreter
(TRITON_INTERPRET=1, set by conftest.py); the `gpu` test repeats it at Qwen2.5's vocabulary."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from hotspec.training import ce_kernels  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _logits(r: int, d: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=DEV).manual_seed(seed)
    zd = (torch.randn(r, d, device=DEV, generator=g) * 4).to(dtype)
    zt = (zd.float() + torch.randn(r, d, device=DEV, generator=g) * 2).to(dtype)
    top = float(zd.float().max()) + 1
    zd[0, 1] = zd[0, d - 1] = top  # a tie across column blocks: the first index wins
    zt[0, 1] = float(zt.float().max()) + 1  # and agrees with the target's argmax
    if r > 1:
        zt[1, d - 1] = float(zt.float().max()) + 1  # the target's argmax in the ragged tail
    return zd, zt


def _reference(zd: torch.Tensor, zt: torch.Tensor) -> tuple[torch.Tensor, ...]:
    lp = torch.log_softmax(zd.float(), -1)
    pt = torch.softmax(zt.float(), -1)
    return (-(pt * lp).sum(-1), torch.logsumexp(zd.float(), -1), torch.logsumexp(zt.float(), -1),
            zd.float().argmax(-1) == zt.float().argmax(-1))


def _check(r: int, d: int, dtype: torch.dtype, seed: int = 0) -> None:
    zd, zt = _logits(r, d, dtype, seed)
    out = [torch.empty(r, device=DEV) for _ in range(3)] + [torch.empty(r, dtype=torch.bool, device=DEV)]
    ce_kernels.soft_ce_rows(zd, zt, *out)
    loss, lse_d, lse_t, hit = out
    ref = _reference(zd, zt)
    torch.testing.assert_close(loss, ref[0], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(lse_d, ref[1])
    torch.testing.assert_close(lse_t, ref[2])
    assert torch.equal(hit, ref[3]) and bool(hit[0]) and (r < 2 or not bool(hit[1]))
    scale = torch.rand(r, device=DEV, generator=torch.Generator(device=DEV).manual_seed(seed + 1))
    want = ((torch.softmax(zd.float(), -1) - torch.softmax(zt.float(), -1)) * scale[:, None]).to(dtype)
    got = ce_kernels.soft_ce_grad_(zd, zt, lse_d, lse_t, scale)
    assert got.data_ptr() == zd.data_ptr()  # in place
    # bf16: one rounding of the same float32 value, up to an ulp apart
    big = float(want.float().abs().max())
    tol = {} if dtype == torch.float32 else {"rtol": 2 ** -7, "atol": 2 ** -10 * big}
    torch.testing.assert_close(got.float(), want.float(), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_soft_ce_kernels_equal_the_torch_ops(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ce_kernels, "ROW_BLOCK", 16)  # 3 blocks and a ragged tail of 7
    monkeypatch.setattr(ce_kernels, "TILE_R", 4)
    monkeypatch.setattr(ce_kernels, "TILE_C", 16)
    _check(r=6, d=39, dtype=dtype)
    _check(r=3, d=5, dtype=dtype, seed=1)  # a row shorter than the lanes: most never see a column


def test_soft_ce_kernels_refuse_other_layouts() -> None:
    zd = torch.zeros(3, 8, device=DEV)
    with pytest.raises(ValueError, match="unit column stride"):
        ce_kernels.soft_ce_rows(zd.T, zd.T, *[torch.empty(8, device=DEV)] * 3,
                                torch.empty(8, dtype=torch.bool, device=DEV))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_soft_ce_kernels_at_qwen_vocabulary(dtype: torch.dtype) -> None:
    _check(r=441, d=151_936, dtype=dtype)


@pytest.mark.gpu
def test_soft_cross_entropy_through_the_kernels_equals_the_dense_formula() -> None:
    """chunked_ce on CUDA (the kernels) under the trainer's bf16 autocast, several row chunks and
    vocabulary blocks, against the dense formula: loss, argmax agreement and both gradients."""
    import torch.nn.functional as F

    from hotspec.training import chunked_ce

    n, d, hidden = 1000, 151_936, 64
    g = torch.Generator(device=DEV).manual_seed(0)
    w = torch.randn(d, hidden, device=DEV, generator=g)
    h = torch.randn(n, hidden, device=DEV, generator=g)
    rows = w + 0.5 * torch.randn(d, hidden, device=DEV, generator=g)
    final = h + 0.5 * torch.randn(n, hidden, device=DEV, generator=g)
    weight = torch.rand(n, device=DEV, generator=g)

    def dense(h: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp = torch.log_softmax(F.linear(h, w).float(), dim=-1)
        p = torch.softmax(F.linear(final, rows).float(), dim=-1)
        return -(p * logp).sum(-1), logp.argmax(-1) == p.argmax(-1)

    out = []
    for fn in (chunked_ce.soft_cross_entropy, lambda a, b: dense(a, b)):
        a, b = h.clone().requires_grad_(), w.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, hit = fn(a, b) if fn is not chunked_ce.soft_cross_entropy else fn(a, b, final, rows)
        (loss * weight).sum().backward()
        out.append((loss.detach(), hit, a.grad, b.grad))
    (loss, hit, dh, dw), (ref_loss, ref_hit, ref_dh, ref_dw) = out
    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-3)
    assert (hit == ref_hit).float().mean() > 0.99  # (bf16 logits: a near-tie may round apart)
    for got, ref in ((dh, ref_dh), (dw, ref_dw)):
        torch.testing.assert_close(got, ref, rtol=0, atol=2 ** -6 * float(ref.abs().max()))
