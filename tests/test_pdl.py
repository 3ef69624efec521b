"""Programmatic Dependent Launch (HOTSPEC_PDL=1, layers/pdl.py): a switch that changes timing only.

On the GPU, a chain of kernels where each reads the one before (norm -> GEMV -> norm -> GEMV ...)
gives the same bits with PDL as without, eagerly and replayed from a CUDA graph many times (a
missing wait would read a half-written activation), and so does the engine's bf16 decoding. On the
CPU it is never on: the interpreter has no grid dependency control."""

from __future__ import annotations

import pytest
import torch

from hotspec.layers import pdl


def test_never_on_without_a_hopper_gpu(monkeypatch):
    monkeypatch.setattr(pdl, "_switch", lambda: True)
    assert not pdl.enabled(torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl.enabled(torch.device("cuda", 0))


def _chain(x, ws, nw):
    from hotspec.layers.fused_kernels import rms_norm
    from hotspec.layers.gemv_kernels import choose, gemv

    h = x
    for w in ws:
        h, _ = rms_norm(h, nw, 1e-5)
        h = gemv(h, w, config=choose(1, *w.shape))
    return h


@pytest.mark.gpu
def test_pdl_chain_equals_plain_eagerly_and_in_a_cuda_graph(monkeypatch):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    ws = [(torch.randn(4096, 4096, generator=g, device=dev) * 0.02).to(torch.bfloat16) for _ in range(6)]
    nw = torch.ones(4096, device=dev, dtype=torch.bfloat16)
    x = torch.randn(1, 4096, generator=g, device=dev).to(torch.bfloat16)
    ref = _chain(x, ws, nw)
    monkeypatch.setattr(pdl, "_switch", lambda: True)
    assert pdl.enabled(dev), "the H200 is compute capability 9.0"
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
def test_engine_bf16_tokens_equal_with_and_without_pdl(monkeypatch):
    from hotspec import LLM, SamplingParams

    prompts = ["The capital of France is", "def quicksort(arr):", "List three colours:"]
    params = SamplingParams(temperature=0, max_tokens=24)

    def run():
        llm = LLM(dtype="bfloat16", device="cuda", kv_cache_memory_gb=0.5, max_num_seqs=1,
                  cuda_graph_max_bs=1)
        return [o.token_ids for o in llm.generate(prompts, params)]

    ref = run()
    monkeypatch.setattr(pdl, "_switch", lambda: True)
    assert run() == ref
