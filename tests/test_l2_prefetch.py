"""The o_proj L2 prefetch on a side stream (layers/l2_prefetch.py; HOTSPEC_L2_PREFETCH=1, off).

A prefetch changes no value: on the GPU, a GEMV after a forked prefetch gives the same bits eagerly
and replayed from a CUDA graph (where the fork is a parallel branch), and the engine's bf16 tokens
are the same with it. On the CPU it never runs (no streams, no inline PTX in the interpreter); what
the CPU checks is when it applies and where the model forks and joins it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hotspec.layers import l2_prefetch


def _weight(cuda=True, elem=2, contiguous=True):
    return SimpleNamespace(is_cuda=cuda, element_size=lambda: elem, is_contiguous=lambda: contiguous)


def test_applies_to_contiguous_2_byte_cuda_weights_of_few_row_steps(monkeypatch):
    monkeypatch.setattr(l2_prefetch, "switched_on", lambda: True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert l2_prefetch.enabled(_weight(), 1) and l2_prefetch.enabled(_weight(), 16)
    assert not l2_prefetch.enabled(_weight(), 17), "a prefill's projection is compute-bound"
    assert not l2_prefetch.enabled(_weight(cuda=False), 1)
    assert not l2_prefetch.enabled(_weight(elem=4), 1)
    assert not l2_prefetch.enabled(_weight(contiguous=False), 1)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not l2_prefetch.enabled(_weight(), 1), "the interpreter runs no inline PTX"
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(l2_prefetch, "switched_on", lambda: False)
    assert not l2_prefetch.enabled(_weight(), 1), "off by default"
    assert l2_prefetch.fork([torch.zeros(4, 4, dtype=torch.bfloat16)], 1) is None
    l2_prefetch.join(None)


@pytest.mark.parametrize("value", ["abc", "-0.1", "1.5"])
def test_a_bad_budget_is_an_error_that_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("HOTSPEC_L2_PREFETCH_FRACTION", value)
    l2_prefetch.budget_fraction.cache_clear()
    with pytest.raises(ValueError, match=r"HOTSPEC_L2_PREFETCH_FRACTION=.*\[0, 1\]"):
        l2_prefetch.budget_fraction()
    monkeypatch.delenv("HOTSPEC_L2_PREFETCH_FRACTION")
    l2_prefetch.budget_fraction.cache_clear()
    assert l2_prefetch.budget_fraction() == 0.7


def test_plan_fills_the_budget_in_order():
    """o_proj whole, then the start of gate_up up to the budget (8B shapes, 0.7 of a 50 MB L2),
    and nothing past the first weight that does not fit."""
    o = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
    gate_up = torch.empty(28672, 4096, dtype=torch.bfloat16, device="meta")
    down = torch.empty(4096, 14336, dtype=torch.bfloat16, device="meta")
    budget = int(0.7 * (50 << 20))
    todo = l2_prefetch.plan([o, gate_up, down], budget)
    assert [w for w, _ in todo] == [o, gate_up]
    assert todo[0][1] * 128 == 4096 * 4096 * 2, "o_proj whole"
    assert todo[1][1] == (budget - 4096 * 4096 * 2) // 128, "gate_up up to the budget"
    assert l2_prefetch.plan([o], 100) == [], "less than a line: nothing"


def test_attention_forks_the_o_proj_prefetch_before_rope_and_joins_before_o_proj(monkeypatch):
    """The order that makes it pay: the fork (o_proj's weight, then the MLP's) comes before
    RoPE/KV store and attention (the latency-bound window), the join right before the o_proj
    projection reads the weight."""
    from hotspec.models import llama
    from hotspec.models.config import ModelConfig

    cfg = ModelConfig(architecture="llama", vocab_size=32, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    attn = llama.Attention(cfg, 0)
    events: list[tuple] = []
    token = object()
    monkeypatch.setattr(l2_prefetch, "fork", lambda ws, rows: events.append(("fork", ws, rows)) or token)
    monkeypatch.setattr(l2_prefetch, "join", lambda b: events.append(("join", b)))
    real_linear = llama.linear
    monkeypatch.setattr(llama, "linear", lambda lin, x: events.append(("linear", lin)) or real_linear(lin, x))

    class Rope:
        def __call__(self, positions, q, k):
            events.append(("rope",))
            return q, k

    class Backend:
        def forward(self, fb, q, k_cache, v_cache, scale):
            events.append(("attention",))
            return torch.zeros_like(q)

    t = 3
    q, k, v = torch.randn(t, 4, 8), torch.randn(t, 2, 8), torch.randn(t, 2, 8)
    kv = SimpleNamespace(k=[torch.zeros(16, 2, 8)], v=[torch.zeros(16, 2, 8)])
    fb = SimpleNamespace(positions=torch.arange(t), out_cache_loc=torch.arange(t))
    gate_up = torch.zeros(128, 32)
    out = attn.attend(q, k, v, fb, Rope(), kv, Backend(), then=(gate_up,))
    assert out.shape == (t, 32)
    names = [e[0] for e in events]
    assert names == ["fork", "rope", "attention", "join", "linear"]
    weights = events[0][1]
    assert weights[0] is attn.o_proj.weight and weights[1] is gate_up and events[0][2] == t
    assert events[3][1] is token and events[4][1] is attn.o_proj


@pytest.mark.gpu
def test_gemv_after_a_forked_prefetch_equals_plain_eagerly_and_in_a_cuda_graph(monkeypatch):
    from hotspec.layers.gemv_kernels import choose, gemv

    monkeypatch.setattr(l2_prefetch, "switched_on", lambda: True)
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    w = (torch.randn(4096, 4096, generator=g, device=dev) * 0.02).to(torch.bfloat16)  # 8B o_proj
    x = torch.randn(1, 4096, generator=g, device=dev).to(torch.bfloat16)
    before = w.clone()
    ref = gemv(x, w, config=choose(1, 4096, 4096))

    def step():
        branch = l2_prefetch.fork([w], 1)
        assert branch is not None
        h = x * 1  # work on the main stream meanwhile
        l2_prefetch.join(branch)
        return gemv(h, w, config=choose(1, 4096, 4096))

    assert torch.equal(step(), ref)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(20):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ref)
    assert torch.equal(w, before)


@pytest.mark.gpu
@pytest.mark.parametrize("algo", [None, "EAGLE3"], ids=["vanilla", "eagle3"])
def test_engine_bf16_tokens_equal_with_the_prefetch(monkeypatch, algo):
    """With CUDA graphs (strict capture: a branch that failed to capture stops start-up), vanilla
    and the shipped EAGLE-3 head give the same bf16 greedy tokens with the prefetch as without."""
    from hotspec import LLM, SamplingParams

    prompts = ["The capital of France is", "def quicksort(arr):", "List three colours:"]
    params = SamplingParams(temperature=0, max_tokens=24)

    def run(on: bool) -> list[list[int]]:
        monkeypatch.setattr(l2_prefetch, "switched_on", lambda: on)
        llm = LLM(dtype="bfloat16", device="cuda", kv_cache_memory_gb=0.5, max_num_seqs=3,
                  cuda_graph_max_bs=4, **({"speculative_algorithm": algo} if algo else {}))
        return [o.token_ids for o in llm.generate(prompts, params)]

    assert run(True) == run(False)


def test_engine_layers_prefetch_o_proj_then_gate_up(tmp_path, monkeypatch):
    """Through the engine (fused projections), every layer's fork names its o_proj weight, then
    its MLP's gate_up weight, with the step's row count; the tokens do not change."""
    from engine_utils import save_tiny_llama

    from hotspec import LLM, SamplingParams

    path = save_tiny_llama(tmp_path / "tiny", vocab=96, hidden=64, layers=2, std=0.2)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    kw = dict(device="cpu", dtype="float32", skip_tokenizer_init=True, max_num_seqs=2)
    ref = [o.token_ids for o in LLM(str(path), **kw).generate(prompt_token_ids=[[1, 5, 9], [4, 2]],
                                                               sampling_params=params)]
    calls: list[tuple] = []
    monkeypatch.setattr(l2_prefetch, "fork", lambda ws, rows: calls.append((ws, rows)))
    llm = LLM(str(path), **kw)
    out = [o.token_ids for o in llm.generate(prompt_token_ids=[[1, 5, 9], [4, 2]], sampling_params=params)]
    assert out == ref
    layers = llm.engine.target.model.layers
    pairs = {(id(layer.self_attn.o_proj.weight), id(layer.mlp.gate_up_proj.weight)) for layer in layers}
    assert {(id(ws[0]), id(ws[1])) for ws, _ in calls} == pairs
    assert {rows for _, rows in calls} == {5, 2}, "the prefill's 3 + 2 rows, then decode steps of 2"


def test_bench_script_says_it_needs_a_gpu():
    """benchmarks/l2_prefetch_bench.py measures the mechanism on the GPU; on the CPU it stops with
    a clear message (the prefetch is inline PTX, which the interpreter does not run)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "l2_prefetch_bench.py")],
                         capture_output=True, text=True, timeout=120, cwd=root,
                         env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert out.returncode == 2 and "needs a CUDA GPU" in out.stderr
