"""Programmatic Dependent Launch (layers/pdl.py; the pdl switch of hotspec/envs.py): timing only.

On the GPU, a chain of kernels where each reads the one before (norm -> GEMV -> norm -> GEMV ...)
gives the same bits with PDL as without, eagerly and replayed from a CUDA graph many times (a
missing wait would read a half-written activation), and so does the engine's bf16 decoding. On the
CPU it is never on: the interpreter has no grid dependency control."""

from __future__ import annotations

import pytest
import torch

from hotspec import envs
from hotspec.layers import pdl


def _pdl_switch(monkeypatch, on: bool) -> None:
    monkeypatch.setattr(envs, "switches", lambda: envs.Switches(pdl=on))


def _eager_and_replayed(run) -> torch.Tensor:
    """run() eagerly, then captured in a CUDA graph and replayed 5 times: the replayed output must
    equal the eager one (after a warm-up call that allocates any split-K workspace)."""
    eager = run()
    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = run()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, eager)
    return eager


def test_never_on_without_a_hopper_gpu(monkeypatch):
    _pdl_switch(monkeypatch, True)
    assert not pdl.enabled(torch.device("cpu"))
    assert not pdl.chained(torch.device("cpu"), 8) and pdl.launch_kwargs(torch.device("cpu"), 8) == {}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl.enabled(torch.device("cuda", 0))
    assert not pdl.chained(torch.device("cuda", 0), 8)


def test_other_kernels_are_chained_only_in_steps_of_several_rows(monkeypatch):
    """The measured rule: chaining the norms, RoPE and attention pays at 8-12 rows and costs at
    one row, except before the resident GEMV."""
    dev = torch.device("cuda", 0)
    monkeypatch.setattr(pdl, "enabled", lambda device: True)
    assert [pdl.chained(dev, rows) for rows in (1, 2, 12)] == [False, True, True]
    assert pdl.launch_kwargs(dev, 12) == {"launch_pdl": True} and pdl.launch_kwargs(dev, 1) == {}
    # a kernel before the resident GEMV is chained at one row too
    assert pdl.chained(dev, 1, before_resident=True)
    assert pdl.launch_kwargs(dev, 1, before_resident=True) == {"launch_pdl": True}
    monkeypatch.setattr(pdl, "enabled", lambda device: False)
    assert not pdl.chained(dev, 12) and not pdl.chained(dev, 1, before_resident=True)


def _chain(x, ws, nw):
    from hotspec.layers.fused_kernels import rms_norm
    from hotspec.layers.gemv_kernels import choose, gemv

    h = x
    for w in ws:
        h, _ = rms_norm(h, nw, 1e-5)
        h = gemv(h, w, config=choose(h.shape[0], *w.shape))
    return h


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8])
def test_pdl_chain_equals_plain_eagerly_and_in_a_cuda_graph(monkeypatch, rows):
    """At 8 rows the norms are PDL-launched too (each waits first thing; `pdl.chained`)."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    ws = [(torch.randn(4096, 4096, generator=g, device=dev) * 0.02).to(torch.bfloat16) for _ in range(6)]
    nw = torch.ones(4096, device=dev, dtype=torch.bfloat16)
    x = torch.randn(rows, 4096, generator=g, device=dev).to(torch.bfloat16)
    _pdl_switch(monkeypatch, False)
    ref = _chain(x, ws, nw)
    _pdl_switch(monkeypatch, True)
    assert pdl.enabled(dev), "the H200 is compute capability 9.0"
    assert pdl.chained(dev, rows) == (rows > 1)
    assert torch.equal(_chain(x, ws, nw), ref)
    _chain(x, ws, nw)  # warm-up before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _chain(x, ws, nw)
    for _ in range(50):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("algo", [None, "EAGLE3"], ids=["vanilla", "eagle3"])
def test_engine_bf16_tokens_equal_with_and_without_pdl(monkeypatch, algo):
    """PDL off and on (the GEMVs, and every Triton kernel of a step of several rows: verify, the
    tree draft): the same bf16 greedy tokens, vanilla and with the shipped EAGLE-3 head (draft,
    verify, draft_extend)."""
    from hotspec import LLM, SamplingParams

    prompts = ["The capital of France is", "def quicksort(arr):", "List three colours:"]
    params = SamplingParams(temperature=0, max_tokens=24)

    def run(on: bool) -> list[list[int]]:
        _pdl_switch(monkeypatch, on)
        llm = LLM(dtype="bfloat16", device="cuda", kv_cache_memory_gb=0.5, max_num_seqs=3,
                  cuda_graph_max_bs=4, **({"speculative_algorithm": algo} if algo else {}))
        return [o.token_ids for o in llm.generate(prompts, params)]

    assert run(True) == run(False)


def test_gemvs_prefetch_only_weights_that_fit_in_l2(monkeypatch):
    """prefetch_cols: the whole panel for a weight within a third of L2, nothing for a larger one
    (a prefetch that L2 cannot hold is a second read)."""
    from types import SimpleNamespace

    monkeypatch.setattr(pdl, "l2_bytes", lambda index: 50 << 20)  # the H200's L2

    def weight(n: int, k: int) -> SimpleNamespace:
        return SimpleNamespace(device=torch.device("cuda", 0), numel=lambda: n * k, element_size=lambda: 2)

    assert pdl.prefetch_cols(weight(3072, 576)) == -1  # SmolLM2 gate_up, 3.5 MB
    assert pdl.prefetch_cols(weight(4096, 4096)) == 0  # 8B o_proj, 33.5 MB
    assert pdl.prefetch_cols(weight(6144, 4096)) == 0  # 8B qkv, 50.3 MB
    assert pdl.prefetch_cols(torch.zeros(4, 4)) == 0  # not a CUDA weight: PDL is off anyway


def test_start_up_log_says_which_kernel_paths_run(monkeypatch):
    """fused.describe, logged at start-up beside the CUDA-graph table: a switch left off, or no
    PDL on an older GPU, shows there rather than only as a slower step."""
    from hotspec.layers import fused

    assert fused.describe(torch.device("cpu")) == "torch layer code (not CUDA)"
    dev = torch.device("cuda", 0)
    monkeypatch.setattr(fused, "_available", lambda: True)
    monkeypatch.setattr(pdl, "enabled", lambda device: True)
    line = fused.describe(dev)
    assert "Triton GEMV" in line and "the norm (and a bias) folded in at one row" in line
    assert "in steps of more than one row" in line and "first weight tile before its wait" in line
    from hotspec.layers import deterministic

    with deterministic.mode(True):  # (the builder logs inside the engine's mode)
        line = fused.describe(dev)
        assert line.startswith("deterministic") and "Triton GEMV" not in line
    monkeypatch.setattr(envs, "switches", lambda: envs.Switches(gemv=False))
    assert "cuBLAS only (the gemv switch off)" in fused.describe(dev)
    monkeypatch.setattr(pdl, "enabled", lambda device: False)
    assert "no PDL" in fused.describe(dev)
    monkeypatch.setattr(fused, "_available", lambda: False)
    assert fused.describe(dev).startswith("torch layer code")


def test_preload_rule():
    """A GEMV program preloads its first tile only with PDL, on eligible launches (one row) whose
    shortest K slice holds a whole tile."""
    assert pdl.preloads(True, True, 4096, 512), "on by default"
    assert not pdl.preloads(False, True, 4096, 512), "no PDL: no wait to load before"
    assert not pdl.preloads(True, False, 4096, 512), "not an eligible launch"
    assert pdl.preloads(True, True, 576, 512), "a ragged rest is the loop's"
    assert not pdl.preloads(True, True, 511, 512), "not one whole tile"


@pytest.mark.parametrize("kind", ["plain", "silu", "split2", "norm", "ragged", "ragged-split2",
                                  "ragged-norm"])
def test_a_preloaded_tile_gives_the_same_bits(monkeypatch, kind):
    """A GEMV / norm-GEMV program that loads its first tile before the PDL wait uses it as the
    loop's first step: the same bits as without (run here without PDL, which the interpreter
    lacks; the kernel path is the same)."""
    pytest.importorskip("triton")
    from hotspec.layers import gemv_kernels as gk
    from hotspec.layers import norm_gemv_kernel as ng

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator(device=dev).manual_seed(7)
    # 2.5 column blocks; K whole 32-column tiles, or not (the split's last slice: 40 columns)
    n, k = 40, {"split2": 128, "ragged": 72, "ragged-split2": 136, "ragged-norm": 72}.get(kind, 64)
    w = (torch.randn(n, k, generator=g, device=dev) * 0.05).to(torch.bfloat16)
    x = (torch.randn(1, 2 * k if "silu" in kind else k, generator=g, device=dev) * 2).to(torch.bfloat16)
    cfg = gk.GemvConfig(16, 32, 2 if kind.endswith("split2") else 1, 4, 2)

    def run(on: bool) -> torch.Tensor:
        monkeypatch.setattr(pdl, "preloads", lambda use_pdl, ok, slice_k, bk: on and ok and slice_k >= bk)
        if kind.endswith("norm"):
            r = torch.randn(1, k, generator=g.manual_seed(8), device=dev).to(x.dtype)
            return ng.norm_gemv(x, r, torch.ones(k, dtype=x.dtype, device=dev) * 1.1, 1e-5, w, cfg)[0]
        return gk.gemv(x, w, silu_mul="silu" in kind, config=cfg)

    assert torch.equal(run(True), run(False))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["qkv", "o", "gate_up", "down", "smol-qkv", "smol-o", "smol-gate_up",
                                   "smol-down"])
def test_preload_at_real_shapes_gives_the_same_bits(monkeypatch, shape):
    """On the H200, PDL-launched with the engine's configs (qkv and gate_up as norm-GEMVs, down
    with silu, split-K at the 8B shape; SmolLM2's K = 576 is one whole tile and a ragged rest):
    the same bits with and without the preload, eagerly and replayed from a CUDA graph."""
    from hotspec.layers import gemv_kernels as gk
    from hotspec.layers import norm_gemv_kernel as ng

    n, k = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
            "smol-qkv": (960, 576), "smol-o": (576, 576), "smol-gate_up": (3072, 576),
            "smol-down": (576, 1536)}[shape]
    kind = shape.removeprefix("smol-")
    dev = torch.device("cuda")
    assert pdl.enabled(dev)
    g = torch.Generator(device=dev).manual_seed(9)
    w = (torch.randn(n, k, generator=g, device=dev) * 0.02).to(torch.bfloat16)
    x = torch.randn(1, 2 * k if kind == "down" else k, generator=g, device=dev).to(torch.bfloat16)
    r = torch.randn(1, k, generator=g, device=dev).to(torch.bfloat16)
    nw = torch.ones(k, dtype=torch.bfloat16, device=dev)
    cfg = gk.choose(1, n, k, kind == "down") or gk.NORM_TIES[(n, k)]

    def run() -> torch.Tensor:
        if kind in ("qkv", "gate_up"):
            return ng.norm_gemv(x, r, nw, 1e-5, w, cfg)[0]
        return gk.gemv(x, w, silu_mul=kind == "down", config=cfg)

    rule = pdl.preloads
    outs = []
    for on in (False, True):
        monkeypatch.setattr(pdl, "preloads", lambda *a, on=on: on and rule(*a))
        outs.append(_eager_and_replayed(run))
    assert torch.equal(outs[1], outs[0])


def test_only_the_8b_o_proj_at_one_row_runs_resident(monkeypatch):
    """fused.gemv_resident (which chains the split combine before o_proj) follows the GEMV table:
    the 8B o_proj shape at one row is the resident kernel; more rows, other shapes, fp32, a bias
    or the gemv switch off are not."""
    from torch import nn

    from hotspec.layers import fused

    monkeypatch.setattr(fused, "enabled", lambda x, *params: True)
    bf16 = torch.zeros(1, dtype=torch.bfloat16)
    o8b, smol = nn.Linear(4096, 4096, bias=False).to(torch.bfloat16), nn.Linear(576, 576, bias=False)
    assert fused.gemv_resident(bf16, 1, o8b)
    assert not fused.gemv_resident(bf16, 8, o8b)
    assert not fused.gemv_resident(bf16, 1, smol.to(torch.bfloat16))
    assert not fused.gemv_resident(torch.zeros(1), 1, o8b.float())
    assert not fused.gemv_resident(bf16, 1, nn.Linear(4096, 4096).to(torch.bfloat16))
    monkeypatch.setattr(envs, "switches", lambda: envs.Switches(gemv=False))
    assert not fused.gemv_resident(bf16, 1, o8b)


@pytest.mark.gpu
@pytest.mark.parametrize("algo", [None, "EAGLE3"], ids=["vanilla", "eagle3"])
def test_gpu_resident_o_proj_engine_tokens_equal_without_pdl(monkeypatch, tmp_path, algo):
    """The resident o_proj in the graphed engine: Llama-3.1-8B's attention shape (4096 hidden, 32
    query / 8 kv heads; 4 layers, a small MLP and vocabulary, random bf16 weights), one request,
    so decode replays the batch-1 graph, where o_proj is the resident GEMV and the split combine
    before it is PDL-chained (with EAGLE-3, a random head of that shape too, whose draft_extend
    and verify run many rows). With PDL off the same kernels run without early launches or waits
    (the same sums), so equal greedy tokens mean no program read the attention's output before
    its wait."""
    from dataclasses import replace

    from engine_utils import greedy_tokens, random_engine

    from hotspec.benchmark.random_models import LLAMA_3_1_8B
    from hotspec.layers import gemv_kernels
    from hotspec.sampling_params import SamplingParams

    cfg = gemv_kernels.choose(1, 4096, 4096)
    assert cfg is not None and cfg.PIPE == 0, "the 8B o_proj row is the resident kernel"
    shape = replace(LLAMA_3_1_8B, vocab_size=32000, intermediate_size=2048, bos_token_id=0,
                    eos_token_ids=(1,))
    gen = torch.Generator().manual_seed(21)
    prompt = [torch.randint(2, 32000, (300,), generator=gen).tolist()]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)

    def run(on: bool) -> list[int]:
        _pdl_switch(monkeypatch, on)
        engine = random_engine(tmp_path / str(on), layers=4, seed=22, shape=shape, algo=algo)
        toks = greedy_tokens(engine, prompt, params)[0]
        engine.graphs.close()
        return toks

    want = run(False)
    assert len(want) == 40 and len(set(want)) > 10, "tokens that depend on the cache"
    assert run(True) == want
