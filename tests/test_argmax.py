"""layers/argmax: the engine's greedy pick is torch.argmax to the index: the first maximum, NaN
the largest, across chunk boundaries, in fp32 and bf16. On the CPU the Triton kernel runs in the
interpreter (TRITON_INTERPRET=1, set by conftest.py) at small vocabularies; the `gpu` test
repeats it at the 8B vocabulary, SmolLM2's, and the 32k FR-Spec head's."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from hotspec.layers import argmax as am  # noqa: E402
from hotspec.layers.argmax_kernel import CHUNK, argmax_rows  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _rows(r: int, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = (torch.randn(r, n, device=DEV, generator=g) * 3).to(dtype)
    top = x.float().max() + 1
    x[0, n // 3] = x[0, n - 1] = top  # a tie across chunks: the first wins
    if r > 1:
        x[1] = float("-inf")  # a row of -inf: index 0, as torch
    if r > 2:
        x[2, 0] = float("inf")
        x[2, n // 2] = x[2, n - 2] = float("nan")  # NaN beats +inf; the first NaN wins
    if r > 3:
        x[3, -1] = top + 1  # the very last element
    return x


def _check(r: int, n: int, dtype: torch.dtype, seed: int = 0, use_pdl: bool = False) -> None:
    x = _rows(r, n, dtype, seed)
    got = argmax_rows(x, use_pdl=use_pdl)
    want = x.argmax(-1)
    assert got.dtype == torch.int64 and torch.equal(got, want), (got.tolist(), want.tolist())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("n", [1, 7, CHUNK, 3 * CHUNK + 5])
def test_argmax_rows_is_torch_argmax(n, dtype) -> None:
    _check(5 if n > 3 else 1, n, dtype, seed=n)


def test_argmax_dispatch_keeps_leading_dims(monkeypatch) -> None:
    """`argmax` over [B, N, V] (verify's logits) gives [B, N]; the kernel path when fused kernels
    apply (forced here, on the CPU), torch's otherwise."""
    x = _rows(6, 300, torch.float32, seed=3).view(2, 3, 300)
    for kernel in (True, False):
        monkeypatch.setattr(am.fused, "enabled", lambda t, *p, k=kernel: k)
        assert torch.equal(am.argmax(x), x.argmax(-1)) and am.argmax(x).shape == (2, 3)


def test_second_destination_gets_the_same_indices(monkeypatch) -> None:
    """`also` (the overlap schedule's carry): its first R elements get the indices, the rest is
    untouched, on the kernel path (forced here, on the CPU) and torch's; a destination of the
    wrong kind is an error that says what it must be."""
    x = _rows(5, 300, torch.float32, seed=4)
    want = x.argmax(-1)
    for kernel in (True, False):
        monkeypatch.setattr(am.fused, "enabled", lambda t, *p, k=kernel: k)
        carry = torch.full((8,), -7, dtype=torch.int64, device=DEV)
        assert torch.equal(am.argmax(x, also=carry), want)
        assert torch.equal(carry[:5], want) and carry[5:].eq(-7).all(), kernel
    for bad in (torch.zeros(8, dtype=torch.int32, device=DEV), torch.zeros(4, dtype=torch.int64, device=DEV),
                torch.zeros(16, dtype=torch.int64, device=DEV)[::2]):
        with pytest.raises(ValueError, match="unit-stride int64 vector of at least 5"):
            argmax_rows(x, out2=bad)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [128256, 49152, 32768])
@pytest.mark.parametrize("r", [1, 12, 64])
def test_gpu_argmax_rows(r, n) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        for seed in range(3):
            _check(r, n, dtype, seed, use_pdl=False)
            _check(r, n, dtype, seed + 10, use_pdl=torch.cuda.get_device_capability()[0] >= 9)


@pytest.mark.gpu
def test_gpu_pdl_argmax_waits_for_the_logits_in_a_graph() -> None:
    """The PDL-launched argmax reads the logits only after the kernel that writes them has
    finished: a CUDA graph of (a 128k-wide bf16 matmul writing fresh logits, the argmax),
    replayed with new inputs, gives torch's index every time."""
    from hotspec.layers import pdl

    if not pdl.enabled(DEV):
        pytest.skip("PDL needs Hopper")
    g = torch.Generator(device=DEV).manual_seed(7)
    h = torch.randn(4, 512, device=DEV, generator=g, dtype=torch.bfloat16)
    w = torch.randn(128256, 512, device=DEV, generator=g, dtype=torch.bfloat16)
    am.argmax(h @ w.T)  # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = h @ w.T
        out = am.argmax(logits)
    for i in range(20):
        h.copy_(torch.randn(4, 512, device=DEV, generator=g, dtype=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, logits.argmax(-1)), f"replay {i}"
