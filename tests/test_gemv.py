"""The decode GEMV kernel (layers/gemv_kernels.py) against F.linear (and silu * up, then F.linear).

On the CPU the kernel runs in Triton's interpreter at small shapes whose N and K are not multiples
of the blocks. The reference is the fp32 product of the same (rounded) inputs, rounded once to
bf16 the way the kernel's final cast rounds: to nearest on CUDA, by truncation in the interpreter
(its float32 -> bf16 cast drops the low bits), so nearly every element must match bit for bit and
every one within an ulp. The `gpu` tests repeat this at Llama-3.1-8B and SmolLM2 shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from hotspec.layers import gemv_kernels as gk  # noqa: E402
from hotspec.layers import norm_gemv_kernel as ng  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
BF16 = torch.bfloat16
SMALL = gk.GemvConfig(BLOCK_N=16, BLOCK_K=32, SPLIT_K=1, num_warps=4, num_stages=2)
N, K = 40, 72  # 2.5 column blocks, 2.25 K blocks
# (N, K, silu_mul): Llama-3.1-8B qkv, o, gate_up, down; SmolLM2-135M qkv, o, gate_up, down
REAL = [(6144, 4096, False), (4096, 4096, False), (28672, 4096, False), (4096, 14336, True),
        (960, 576, False), (576, 576, False), (3072, 576, False), (576, 1536, True)]


def _round(t: torch.Tensor) -> torch.Tensor:
    """float32 -> bf16 -> float32, rounding as the kernel's casts do on this device."""
    if CUDA:
        return t.to(BF16).float()
    return (t.float().view(torch.int32) & -65536).view(torch.float32)  # interpreter: truncation


def _hidden(x: torch.Tensor, k: int) -> torch.Tensor:
    """silu(gate) * up in fp32 values, rounded where the MLP (and fused_kernels.silu_mul) rounds."""
    g, u = x[:, :k].float(), x[:, k:].float()
    return _round(_round(g / (1.0 + torch.exp(-g))) * u)


def _check(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, silu: bool, exact: float = 0.95) -> None:
    h = _hidden(x, w.shape[1]) if silu else x.float()
    ref = F.linear(h, w.float())  # fp32, no tf32 (torch's default for matmul)
    assert y.dtype == x.dtype and y.shape == (x.shape[0], w.shape[0])
    torch.testing.assert_close(y.float(), ref, rtol=1.6e-2, atol=1e-2)
    same = (y.float() == _round(ref)).float().mean().item()
    assert same >= exact, f"only {same:.3f} of the outputs are bit-identical to the reference"


def _inputs(m: int, n: int, k: int, silu: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=DEV).manual_seed(seed)
    w = (torch.randn(n, k, generator=g, device=DEV) * 0.05).to(BF16)
    x = (torch.randn(m, 2 * k if silu else k, generator=g, device=DEV) * 2).to(BF16)
    return x, w


def _norm_inputs(m: int, k: int, seed: int, res: bool = True
                 ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """A residual [m, k] (None without res) and an RMSNorm weight [k] for the norm-GEMV."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    r = (torch.randn(m, k, generator=g, device=DEV) * 2).to(BF16) if res else None
    nw = (1 + 0.1 * torch.randn(k, generator=g, device=DEV)).to(BF16)
    return r, nw


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_gemv_matches_linear(m, silu):
    x, w = _inputs(m, N, K, silu, seed=m)
    _check(gk.gemv(x, w, silu_mul=silu, config=SMALL), x, w, silu)


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("split", [2, 3])
def test_split_k_matches_and_rearms_its_counters(m, split):
    """One-launch split-K (3 splits: a short last slice) equals SPLIT_K=1 up to summation order,
    is deterministic, and leaves its tile counters at zero for the next launch."""
    x, w = _inputs(m, N, K, True, seed=10 + split)
    cfg = gk.GemvConfig(16, 32, split, 4, 2)
    first = gk.gemv(x, w, silu_mul=True, config=cfg)
    _check(first, x, w, True)
    torch.testing.assert_close(first, gk.gemv(x, w, silu_mul=True, config=SMALL), rtol=1.6e-2,
                               atol=1e-2)
    assert torch.equal(gk.gemv(x, w, silu_mul=True, config=cfg), first), "second launch differs"
    _, cnt = gk._WORKSPACES[(x.device, N, split, 16)]
    assert not cnt.any(), "the last program of each tile resets its counter"


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("block_n", [1, 16])
def test_resident_row_matches_linear(silu, block_n):
    """PIPE 0 (a program's whole [BLOCK_N, K] weight slice in one load, no K loop): K = 72 pads to
    128 columns and N = 40 leaves a ragged last block; the result is F.linear's."""
    x, w = _inputs(1, N, K, silu, seed=60 + block_n)
    y = gk.gemv(x, w, silu_mul=silu, config=gk.GemvConfig(block_n, K, 1, 4, 1, PIPE=0))
    _check(y, x, w, silu)


def test_resident_needs_the_whole_row_slice():
    x, w = _inputs(1, N, 64, False, seed=61)
    with pytest.raises(ValueError, match="BLOCK_K 32 must be >= K 64"):
        gk.gemv(x, w, config=gk.GemvConfig(2, 32, 1, 4, 1, PIPE=0))


@pytest.mark.parametrize("silu,split", [(False, 1), (True, 1), (True, 2), (False, 3)])
def test_pipelined_row_loop_same_bits(silu, split):
    """PIPE=2 (the next weight tile's loads issued before the current tile's products) sums the
    same products in the same order as PIPE=1: equal bits, with ragged K slices and N."""
    x, w = _inputs(1, N, K, silu, seed=50 + split)
    one = gk.gemv(x, w, silu_mul=silu, config=gk.GemvConfig(16, 32, split, 4, 1))
    two = gk.gemv(x, w, silu_mul=silu, config=gk.GemvConfig(16, 32, split, 4, 1, PIPE=2))
    _check(two, x, w, silu)
    assert torch.equal(one, two)


@pytest.mark.parametrize("res", [True, False], ids=["add+norm", "norm"])
def test_norm_gemv_pipelined_same_bits(res):
    x, w = _inputs(1, N, K, False, seed=52)
    r, nw = _norm_inputs(1, K, 53, res)
    y1, s1 = ng.norm_gemv(x, r, nw, 1e-5, w, gk.GemvConfig(16, 32, 1, 4, 1))
    y2, s2 = ng.norm_gemv(x, r, nw, 1e-5, w, gk.GemvConfig(16, 32, 1, 4, 1, PIPE=2))
    assert torch.equal(y1, y2) and torch.equal(s1, s2)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,silu,cfg", [
    (4096, 4096, False, gk.GemvConfig(4, 1024, 1, 4, 1, PIPE=2)),
    (4096, 14336, True, gk.GemvConfig(4, 1024, 2, 4, 1, PIPE=2)),
    (4096, 14336, True, gk.GemvConfig(8, 1024, 1, 4, 1, PIPE=2)),
    (576, 1536, True, gk.GemvConfig(8, 512, 1, 4, 1, PIPE=2)),
    (960, 576, False, gk.GemvConfig(8, 512, 1, 4, 1, PIPE=2))],
    ids=["o", "down-split2", "down", "smol-down", "smol-qkv"])
def test_gpu_pipelined_row_loop_same_bits(n, k, silu, cfg):
    """At real shapes, with PDL and the preload where they apply: PIPE=2 equals PIPE=1 bit for bit."""
    from dataclasses import replace

    x, w = _inputs(1, n, k, silu, seed=n + k)
    two = gk.gemv(x, w, silu_mul=silu, config=cfg)
    _check(two, x, w, silu)
    assert torch.equal(two, gk.gemv(x, w, silu_mul=silu, config=replace(cfg, PIPE=1)))


@pytest.mark.gpu
@pytest.mark.parametrize("n,cfg", [(6144, gk.GemvConfig(4, 1024, 1, 4, 1, PIPE=2)),
                                   (28672, gk.GemvConfig(8, 1024, 1, 4, 1, PIPE=2)),
                                   (6144, gk.GemvConfig(8, 512, 1, 4, 1, PIPE=2))])
def test_gpu_norm_gemv_pipelined_same_bits(n, cfg):
    from dataclasses import replace

    x, w = _inputs(1, n, 4096, False, seed=n)
    r, nw = _norm_inputs(1, 4096, 54)
    y2, s2 = ng.norm_gemv(x, r, nw, 1e-5, w, cfg)
    y1, s1 = ng.norm_gemv(x, r, nw, 1e-5, w, replace(cfg, PIPE=1))
    assert torch.equal(y1, y2) and torch.equal(s1, s2)


@pytest.mark.parametrize("m", [1, 4])
def test_row_strided_x(m):
    """x as columns of a wider tensor (a view with row stride != K): same result as a copy."""
    x, w = _inputs(m, N, K, False, seed=20)
    wide = torch.randn(m, K + 50, device=DEV).to(BF16)
    wide[:, 7:7 + K] = x
    view = wide[:, 7:7 + K]
    assert view.stride(0) != K
    assert torch.equal(gk.gemv(view, w, config=SMALL), gk.gemv(x, w, config=SMALL))


def test_default_config_runs_and_table_is_valid():
    for (b, _, _, _), cfg in gk.CONFIGS.items():
        assert gk.bucket(b) == b and (b == 1 or cfg.BLOCK_N >= 16)
    for m in (1, 2):
        x, w = _inputs(m, N, K, False, seed=30)
        _check(gk.gemv(x, w), x, w, False)


def test_rejects_what_it_does_not_handle():
    x, w = _inputs(1, N, K, False, seed=0)
    with pytest.raises(ValueError, match="float32"):
        gk.gemv(x.float(), w.float())
    with pytest.raises(ValueError, match="M must be in"):
        gk.gemv(torch.zeros(17, K, dtype=BF16, device=DEV), w)
    with pytest.raises(ValueError, match="columns"):
        gk.gemv(x, w, silu_mul=True)
    with pytest.raises(ValueError, match="unit stride"):
        gk.gemv(torch.zeros(K, 2, dtype=BF16, device=DEV)[:, :1].t(), w)
    with pytest.raises(ValueError, match=r"PIPE is 0 \(resident\), 1 or 2"):
        gk.gemv(x, w, config=gk.GemvConfig(16, 32, 1, 4, 1, PIPE=3))
    with pytest.raises(ValueError, match="PIPE 0 .* one row without split-K"):
        gk.gemv(torch.zeros(2, K, dtype=BF16, device=DEV), w, config=gk.GemvConfig(16, K, 1, 4, 1, PIPE=0))
    with pytest.raises(ValueError, match="PIPE 0 .* one row without split-K"):
        gk.gemv(x, w, config=gk.GemvConfig(16, 32, 2, 4, 1, PIPE=0))
    with pytest.raises(ValueError, match="BLOCK_N >= 16"):
        gk.gemv(torch.zeros(2, K, dtype=BF16, device=DEV), w, config=gk.GemvConfig(8, 32))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", REAL)
@pytest.mark.parametrize("m", [1, 8, 16])
def test_gemv_real_shapes(shape, m):
    n, k, silu = shape
    x, w = _inputs(m, n, k, silu, seed=m)
    y = gk.gemv(x, w, silu_mul=silu)
    _check(y, x, w, silu)
    h = F.silu(x[:, :k]) * x[:, k:] if silu else x
    cublas = F.linear(h, w)  # bf16 in and out; its split-K may reduce partials in bf16: an ulp
    torch.testing.assert_close(y, cublas, rtol=1.6e-2, atol=1e-2 * cublas.abs().max().item())
    for split in (2, 4):  # explicit split-K at each M path
        cfg = gk.GemvConfig(32, 256, split, 4, 3)
        _check(gk.gemv(x, w, silu_mul=silu, config=cfg), x, w, silu)


@pytest.mark.gpu
@pytest.mark.parametrize("block_n,block_k,warps", [(1, 4096, 4), (2, 4096, 4), (4, 4096, 4), (4, 4096, 8)])
def test_gpu_resident_row_real_shape(block_n, block_k, warps):
    """The resident kernel (PIPE 0) at the 8B o_proj shape, eagerly with PDL and in graph
    replays, against the reference and the tiled kernel (equal up to fp32 summation order)."""
    x, w = _inputs(1, 4096, 4096, False, seed=70)
    cfg = gk.GemvConfig(block_n, block_k, 1, warps, 1, PIPE=0)
    eager = gk.gemv(x, w, config=cfg)
    _check(eager, x, w, False)
    tiled = gk.gemv(x, w, config=gk.GemvConfig(4, 1024, 1, 4, 1, PIPE=2))
    torch.testing.assert_close(eager, tiled, rtol=1.6e-2, atol=1e-2)
    gk.gemv(x, w, config=cfg)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gk.gemv(x, w, config=cfg)
    for seed in (71, 72):
        x.copy_(_inputs(1, 4096, 4096, False, seed=seed)[0])
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, gk.gemv(x, w, config=cfg))


@pytest.mark.gpu
def test_split_k_under_cuda_graph_replay():
    """Captured after a warm-up call, split-K replays correctly (counters re-armed every time)."""
    x, w = _inputs(8, 4096, 4096, False, seed=5)
    cfg = gk.GemvConfig(32, 256, 4, 4, 3)
    eager = gk.gemv(x, w, config=cfg)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gk.gemv(x, w, config=cfg)
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


def test_choose_keeps_cublas_where_it_measured_faster():
    assert gk.choose(1, 576, 1536, silu_mul=True) is not None  # measured win
    assert gk.choose(8, 576, 1536, silu_mul=True) is None  # measured loss: silu at M > 1
    assert gk.choose(1, 28672, 4096) is None  # the 8B gate_up: cuBLAS as fast
    assert gk.choose(1, 1000, 700) is not None  # small unmeasured shape at M == 1
    assert gk.choose(4, 1000, 700) is None  # unmeasured at M > 1
    assert gk.choose(17, 576, 576) is None
    # the LM head asks for table rows only: SmolLM2's (49152 x 576) is small enough for the
    # heuristic, but was never measured against cuBLAS
    assert gk.choose(1, 49152, 576) is not None and gk.choose(1, 49152, 576, heuristic=False) is None
    assert gk.choose(1, 576, 576, heuristic=False) == gk.CONFIGS[(1, 576, 576, False)]


@pytest.mark.gpu
def test_every_config_the_engine_chooses():
    """What the engine runs: each measured CONFIGS entry, and the heuristic config for unmeasured
    one-row shapes (an EAGLE-3 head's qkv 960 x 1152 and fc 576 x 1728 on SmolLM2)."""
    cases = [(b, n, k, s) for (b, n, k, s) in gk.CONFIGS] + [(1, 960, 1152, False), (1, 576, 1728, False)]
    for m_bucket, n, k, silu in cases:
        for m in sorted({m_bucket, max(1, m_bucket - 3)} if m_bucket > 1 else {1}):
            cfg = gk.choose(m, n, k, silu)
            assert cfg is not None, (m, n, k, silu)
            x, w = _inputs(m, n, k, silu, seed=n + m)
            _check(gk.gemv(x, w, silu_mul=silu, config=cfg), x, w, silu)


def _norm_reference(x, r, g, eps):
    """(rms_norm(x + r) rounded where the model rounds, x + r) in fp32 values."""
    s = _round(x.float() + r.float()) if r is not None else x.float()
    inv = torch.rsqrt((s * s).sum(-1, keepdim=True) / s.shape[-1] + eps)
    return _round(g.float() * _round(s * inv)), s


@pytest.mark.parametrize("res", [True, False], ids=["add+norm", "norm"])
def test_norm_gemv_matches_norm_then_linear(res):
    """norm_gemv: the residual add and RMSNorm done inside the GEMV that reads them, for one
    decode row, K not a multiple of the tile: the new residual bit for bit, the output as the
    norm followed by the GEMV computes it (rounded at the same places)."""
    m = 1
    x, w = _inputs(m, N, K, False, seed=40 + m)
    r, nw = _norm_inputs(m, K, 41, res)
    y, s = ng.norm_gemv(x, r, nw, 1e-5, w, SMALL)
    h, s_ref = _norm_reference(x, r, nw, 1e-5)
    assert torch.equal(s.float(), s_ref) and (res or s is x)
    ref = F.linear(h, w.float())
    torch.testing.assert_close(y.float(), ref, rtol=1.6e-2, atol=1e-2)
    assert (y.float() == _round(ref)).float().mean().item() >= 0.9


def test_norm_gemv_rejects_what_it_does_not_handle():
    x, w = _inputs(17, N, K, False, seed=42)
    nw = torch.ones(K, dtype=BF16, device=DEV)
    with pytest.raises(ValueError, match=r"x \[M <= 16, K\]"):
        ng.norm_gemv(x, None, nw, 1e-5, w, SMALL)
    with pytest.raises(ValueError, match="residual"):
        ng.norm_gemv(x[:2], x[:3], nw, 1e-5, w, SMALL)
    with pytest.raises(ValueError, match="split-K"):
        ng.norm_gemv(x[:1], None, nw, 1e-5, w, gk.GemvConfig(16, 32, 2, 4, 2))
    with pytest.raises(ValueError, match="dtype"):
        ng.norm_gemv(x[:1], None, nw.float(), 1e-5, w, SMALL)
    with pytest.raises(ValueError, match="PIPE is 1 or 2"):
        ng.norm_gemv(x[:1], None, nw, 1e-5, w, gk.GemvConfig(16, 32, 1, 4, 1, PIPE=0))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(6144, 4096), (28672, 4096), (960, 576), (3072, 576)],
                         ids=["8b-qkv", "8b-gate_up", "smol-qkv", "smol-gate_up"])
def test_norm_gemv_real_shapes_match_the_two_kernels(shape):
    """At the shapes the engine fuses (one decode row): equal to fused_kernels.rms_norm then
    gemv, within an ulp."""
    from hotspec.layers.fused_kernels import rms_norm

    m, (n, k) = 1, shape
    x, w = _inputs(m, n, k, False, seed=43)
    r = (torch.randn(m, k, device=DEV) * 2).to(BF16)
    nw = (1 + 0.1 * torch.randn(k, device=DEV)).to(BF16)
    cfg = gk.choose(m, n, k) or gk.NORM_TIES.get((n, k))  # 8B gate_up: a tie
    assert cfg is not None and cfg.SPLIT_K == 1
    y, s = ng.norm_gemv(x, r, nw, 1e-5, w, cfg)
    h, s2 = rms_norm(x, nw, 1e-5, r)
    assert torch.equal(s, s2)
    torch.testing.assert_close(y, gk.gemv(h, w, config=cfg), rtol=1.6e-2, atol=1e-2)


def test_gemv_config_follows_the_measured_table(monkeypatch):
    """The Triton GEMV takes a Linear only where its table (gemv_kernels.choose) measured it
    faster than cuBLAS: 8B's o_proj at 1 and 8 rows, its qkv at 1 row but not 8, nothing at 17."""
    from hotspec.layers import fused

    monkeypatch.setattr(fused, "_on_device", lambda x: True)
    monkeypatch.setattr(fused, "_available", lambda: True)
    o, qkv = torch.zeros(4096, 4096, dtype=BF16), torch.zeros(6144, 4096, dtype=BF16)
    x1, x8, x17 = (torch.zeros(m, 4096, dtype=BF16) for m in (1, 8, 17))
    assert fused.gemv_config(x1, o) == gk.choose(1, 4096, 4096) is not None
    assert fused.gemv_config(x8, o) == gk.choose(8, 4096, 4096) is not None
    assert fused.gemv_config(x1, qkv) is not None
    assert fused.gemv_config(x8, qkv) is None, "cuBLAS where it measured faster"
    assert fused.gemv_config(x17, o) is None


@pytest.mark.parametrize("pipe", [1, 2])
@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("m", [2, 5])
def test_per_row_gemv_rows_equal_each_row_alone(m, silu, pipe):
    """gemv(per_row=True): M rows side by side in one launch, each row the bits of its own
    one-row launch (the verify rows of a few tokens computed as decode computes one)."""
    x, w = _inputs(m, N, K, silu, seed=60 + m)
    cfg = gk.GemvConfig(16, 32, 1, 4, 1, PIPE=pipe)
    y = gk.gemv(x, w, silu_mul=silu, config=cfg, per_row=True)
    _check(y, x, w, silu)
    for i in range(m):
        assert torch.equal(y[i:i + 1], gk.gemv(x[i:i + 1], w, silu_mul=silu, config=cfg))


def test_per_row_gemv_rejects_split_k():
    x, w = _inputs(3, N, K, False, seed=64)
    with pytest.raises(ValueError, match="per_row"):
        gk.gemv(x, w, config=gk.GemvConfig(16, 32, 2, 4, 1), per_row=True)


@pytest.mark.parametrize("res", [True, False], ids=["add+norm", "norm"])
def test_norm_gemv_rows_equal_each_row_alone(res):
    """The norm-GEMV of M rows side by side: each row's output and stream the bits of its own
    one-row launch."""
    m = 3
    x, w = _inputs(m, N, K, False, seed=65)
    r, nw = _norm_inputs(m, K, 66, res)
    cfg = gk.GemvConfig(16, 32, 1, 4, 1, PIPE=2)
    y, s = ng.norm_gemv(x, r, nw, 1e-5, w, cfg)
    assert y.shape == (m, N) and s.shape == (m, K)
    for i in range(m):
        y1, s1 = ng.norm_gemv(x[i:i + 1], None if r is None else r[i:i + 1], nw, 1e-5, w, cfg)
        assert torch.equal(y[i:i + 1], y1) and torch.equal(s[i:i + 1], s1)


def test_row_gemv_routes_a_few_rows_through_one_row_programs(monkeypatch):
    """With fused.ROW_GEMV_MAX = R, a layer's projections of 2..R rows take the one-row configs
    (norm folded into qkv and gate_up, silu * up into down) and nothing else; R + 1 rows and a
    weight over ROW_GEMV_MAX_BYTES do not; with 0 (off) nothing does."""
    from torch import nn

    from hotspec.layers import fused
    from hotspec.layers.linear import linear, norm_linear, norm_mlp
    from hotspec.layers.norm import RMSNorm

    monkeypatch.setattr(fused, "_on_device", lambda x: True)
    monkeypatch.setattr(fused, "_available", lambda: True)
    monkeypatch.setattr(gk, "CONFIGS", {(1, 96, 64, False): gk.GemvConfig(16, 32, 1, 4, 1, PIPE=2),
                                        (1, 64, 64, False): gk.GemvConfig(16, 32, 1, 4, 1),
                                        (1, 64, 48, True): gk.GemvConfig(16, 32, 1, 4, 1)})
    torch.manual_seed(0)
    qkv, o = nn.Linear(64, 96, bias=False).to(BF16), nn.Linear(64, 64, bias=False).to(BF16)
    gate_up, down = nn.Linear(64, 96, bias=False).to(BF16), nn.Linear(48, 64, bias=False).to(BF16)
    norm = RMSNorm(64, 1e-5).to(BF16)
    x, res = torch.randn(3, 64).to(BF16), torch.randn(3, 64).to(BF16)
    calls: list[tuple[str, int, bool]] = []
    real_gemv, real_norm = fused.gemv, fused.norm_gemv
    monkeypatch.setattr(fused, "gemv", lambda x, w, c, silu_mul=False, per_row=False, bias=None:
                        calls.append(("gemv", x.shape[0], per_row))
                        or real_gemv(x, w, c, silu_mul, per_row, bias))
    monkeypatch.setattr(fused, "norm_gemv", lambda x, *a: calls.append(("norm_gemv", x.shape[0], True))
                        or real_norm(x, *a))
    with torch.no_grad():
        monkeypatch.setattr(fused, "ROW_GEMV_MAX", 0)
        assert fused.row_gemv_config(x, o.weight) is None
        monkeypatch.setattr(fused, "ROW_GEMV_MAX", 4)
        y, s = norm_linear(norm, qkv, x, res)
        h, h_ref = linear(o, y[:, :64]), o(y[:, :64])
        out, s2 = norm_mlp(norm, gate_up, down, x, res)
        assert calls == [("norm_gemv", 3, True), ("gemv", 3, True), ("norm_gemv", 3, True),
                         ("gemv", 3, True)]
        ref_y = qkv(norm(x + res))
        torch.testing.assert_close(y.float(), ref_y.float(), rtol=3e-2, atol=3e-2)
        torch.testing.assert_close(h.float(), h_ref.float(), rtol=3e-2, atol=3e-2)
        g, u = gate_up(norm(x + res)).float().chunk(2, dim=-1)
        ref_out = down((torch.nn.functional.silu(g) * u).to(BF16))
        torch.testing.assert_close(out.float(), ref_out.float(), rtol=5e-2, atol=5e-2)
        assert torch.equal(s, s2)
        torch.testing.assert_close(s.float(), (x.float() + res.float()), rtol=1e-2, atol=1e-2)
        x5 = torch.randn(5, 64).to(BF16)
        assert fused.row_gemv_config(x5, o.weight) is None
        assert fused.norm_gemv_config(x5, qkv.weight, norm.weight) is None
        monkeypatch.setattr(fused, "ROW_GEMV_MAX_BYTES", 64 * 64 * 2 - 1)
        assert fused.row_gemv_config(x, o.weight) is None
        assert fused.norm_gemv_config(x, qkv.weight, norm.weight) is None


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,silu", [(960, 576, False), (576, 576, False), (3072, 576, False),
                                      (576, 1536, True)], ids=["qkv", "o", "gate_up", "down"])
def test_gpu_per_row_gemv_rows_equal_decode_rows(n, k, silu):
    """SmolLM2's projections at their one-row configs with PDL and the preload: 4 rows side by side
    (gemv per_row; the norm-GEMV where there is no silu) equal each row's decode launch."""
    cfg = gk.choose(1, n, k, silu)
    assert cfg is not None and cfg.SPLIT_K == 1
    x, w = _inputs(4, n, k, silu, seed=n)
    y = gk.gemv(x, w, silu_mul=silu, config=cfg, per_row=True)
    _check(y, x, w, silu)
    for i in range(4):
        assert torch.equal(y[i:i + 1], gk.gemv(x[i:i + 1], w, silu_mul=silu, config=cfg))
    if not silu:
        r, nw = _norm_inputs(4, k, 67)
        y, s = ng.norm_gemv(x, r, nw, 1e-5, w, cfg)
        for i in range(4):
            y1, s1 = ng.norm_gemv(x[i:i + 1], r[i:i + 1], nw, 1e-5, w, cfg)
            assert torch.equal(y[i:i + 1], y1) and torch.equal(s[i:i + 1], s1)


@pytest.mark.parametrize("m,per_row", [(1, False), (3, False), (3, True)],
                         ids=["one-row", "dot", "per-row"])
def test_gemv_bias_is_added_before_the_rounding(m, per_row):
    """A bias (Qwen2's qkv) in the GEMV's epilogue (one row, the tl.dot rows, rows side by side):
    F.linear's result with the bias, rounded once; the norm-GEMV's the same on its normalised
    rows."""
    from hotspec.layers.fused_kernels import rms_norm

    x, w = _inputs(m, N, K, False, seed=70)
    b = (torch.randn(N, device=DEV) * 3).to(BF16)
    cfg = gk.GemvConfig(16, 32, 1, 4, 1, PIPE=2)
    y = gk.gemv(x, w, config=cfg if m == 1 or per_row else SMALL, per_row=per_row, bias=b)
    ref = F.linear(x.float(), w.float(), b.float())
    torch.testing.assert_close(y.float(), ref, rtol=1.6e-2, atol=1e-2)
    assert (y.float() == _round(ref)).float().mean().item() >= 0.95
    r, nw = _norm_inputs(m, K, 71)
    if m > 1 and not per_row:
        return
    yn, s = ng.norm_gemv(x, r, nw, 1e-5, w, cfg, bias=b)
    h, _ = rms_norm(x, nw, 1e-5, r)
    ref = F.linear(h.float(), w.float(), b.float())
    torch.testing.assert_close(yn.float(), ref, rtol=1.6e-2, atol=1e-2)
    with pytest.raises(ValueError, match="bias"):
        gk.gemv(x, w, config=cfg, bias=b[:-1])
    with pytest.raises(ValueError, match="bias"):
        ng.norm_gemv(x, r, nw, 1e-5, w, cfg, bias=b.float())


def test_a_biased_projection_of_one_row_takes_the_norm_gemv(monkeypatch):
    """Qwen2's qkv (a bias) at one decode row: the norm folds into its GEMV and the bias into the
    epilogue (one kernel, not the norm kernel and cuBLAS's addmm); equal to the module's path."""
    from torch import nn

    from hotspec.layers import fused
    from hotspec.layers.linear import linear, norm_linear
    from hotspec.layers.norm import RMSNorm

    monkeypatch.setattr(fused, "_on_device", lambda x: True)
    monkeypatch.setattr(fused, "_available", lambda: True)
    torch.manual_seed(1)
    qkv = nn.Linear(64, 96, bias=True).to(BF16)
    norm = RMSNorm(64, 1e-5).to(BF16)
    x, res = torch.randn(1, 64).to(BF16), torch.randn(1, 64).to(BF16)
    calls: list[str] = []
    real = fused.norm_gemv
    monkeypatch.setattr(fused, "norm_gemv", lambda *a: calls.append("norm_gemv") or real(*a))
    with torch.no_grad():
        y, _ = norm_linear(norm, qkv, x, res)
        assert calls == ["norm_gemv"]
        torch.testing.assert_close(y.float(), qkv(norm(x + res)).float(), rtol=3e-2, atol=3e-2)
        torch.testing.assert_close(linear(qkv, x).float(), qkv(x).float(), rtol=2e-2, atol=2e-2)
        x4 = torch.randn(4, 64).to(BF16)  # verify's rows: the few-row GEMM, bias in its epilogue
        assert fused.rows_config(x4, qkv.weight) is not None
        torch.testing.assert_close(linear(qkv, x4).float(), qkv(x4).float(), rtol=2e-2, atol=2e-2)
