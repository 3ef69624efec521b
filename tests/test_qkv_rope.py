"""One decode row's input norm, qkv projection, RoPE and KV store in one kernel
(layers/qkv_rope_kernel.py, HOTSPEC_QKV_ROPE=1): bit for bit what the norm-GEMV followed by
rope_store computes and stores, in Triton's interpreter at small shapes (heads not multiples of
the program's pairs, K not a multiple of the tile) and, marked `gpu`, at the Llama-3.1-8B and
SmolLM2 shapes; and an engine running it decodes the same tokens as one that does not."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from hotspec.layers import gemv_kernels as gk  # noqa: E402
from hotspec.layers import norm_gemv_kernel as ng  # noqa: E402
from hotspec.layers import qkv_rope_kernel as qr  # noqa: E402
from hotspec.layers.fused_kernels import rope_store  # noqa: E402
from hotspec.layers.rotary import RotaryEmbedding  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BF16 = torch.bfloat16


def _case(hq: int, hkv: int, d: int, k: int, cfg: gk.GemvConfig, res: bool, seed: int) -> None:
    g = torch.Generator(device=DEV).manual_seed(seed)
    n = (hq + 2 * hkv) * d
    w = (torch.randn(n, k, generator=g, device=DEV) * 0.05).to(BF16)
    x = (torch.randn(1, k, generator=g, device=DEV) * 2).to(BF16)
    r = (torch.randn(1, k, generator=g, device=DEV) * 2).to(BF16) if res else None
    nw = (1 + 0.1 * torch.randn(k, generator=g, device=DEV)).to(BF16)
    rope = RotaryEmbedding(d, 64, 10000.0, None).to(DEV)
    pos = torch.tensor([37], device=DEV)
    loc = torch.tensor([5], device=DEV)
    caches = [torch.zeros(8, hkv, d, dtype=BF16, device=DEV) for _ in range(4)]  # k, v: ref, fused
    qkv, s_ref = ng.norm_gemv(x, r, nw, 1e-5, w, cfg)
    q, kk, v = qkv.view(1, hq + 2 * hkv, d).split((hq, hkv, hkv), dim=1)
    q_ref = rope_store(q, kk, v, pos, rope.cos, rope.sin, caches[0], caches[1], loc)
    q_out, s = qr.qkv_rope(x, r, nw, 1e-5, w, cfg, hq, hkv, pos, loc, rope.cos, rope.sin,
                           caches[2], caches[3])
    assert torch.equal(s, s_ref)
    assert torch.equal(q_out, q_ref)
    assert torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])
    assert caches[2][5].abs().sum() > 0 and not caches[2][:5].any()  # the row at loc, nothing else


@pytest.mark.parametrize("res", [True, False], ids=["add+norm", "norm"])
@pytest.mark.parametrize("hq,hkv,d,k", [(4, 2, 16, 72), (3, 1, 32, 40)])
def test_qkv_rope_equals_norm_gemv_then_rope_store(hq, hkv, d, k, res):
    _case(hq, hkv, d, k, gk.GemvConfig(8, 32, 1, 4, 2), res, seed=hq + k)


def test_qkv_rope_rejects_what_it_does_not_handle():
    w = torch.zeros(8 * 16, 32, dtype=BF16, device=DEV)
    x = torch.zeros(2, 32, dtype=BF16, device=DEV)
    c = torch.zeros(4, 2, 16, dtype=BF16, device=DEV)
    args = (torch.ones(32, dtype=BF16, device=DEV), 1e-5, w)
    tail = (4, 2, torch.zeros(1, dtype=torch.long, device=DEV), torch.zeros(1, dtype=torch.long, device=DEV),
            torch.zeros(8, 8, device=DEV), torch.zeros(8, 8, device=DEV), c, c)
    with pytest.raises(ValueError, match="one row"):
        qr.qkv_rope(x, None, *args, gk.GemvConfig(8, 32, 1, 4, 2), *tail)
    with pytest.raises(ValueError, match="divides"):
        qr.qkv_rope(x[:1], None, *args, gk.GemvConfig(32, 32, 1, 4, 2), *tail)  # 16 pairs > D/2 = 8


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,d,k", [(32, 8, 128, 4096), (9, 3, 64, 576)], ids=["8b", "smollm2"])
def test_qkv_rope_real_shapes(hq, hkv, d, k):
    n = (hq + 2 * hkv) * d
    _case(hq, hkv, d, k, gk.choose(1, n, k), True, seed=7)


def test_engine_decodes_the_same_tokens_with_it(tmp_path, monkeypatch):
    """bf16 through the interpreter: the engine's greedy tokens with HOTSPEC_QKV_ROPE equal those
    without, and the fused kernel really ran (every layer, every decode step)."""
    from engine_utils import interpreter_ab, save_tiny_llama

    path = save_tiny_llama(tmp_path / "tiny", vocab=96, hidden=64, layers=2, std=0.2)
    (ref, off_rows), (tokens, on_rows) = interpreter_ab(monkeypatch, path, "qkv_rope", "_qkv_rope_allowed",
                                                        (False, True))
    assert not off_rows
    assert tokens == ref
    assert len(on_rows) >= 2 * 2 * 5, "every layer of every decode step"


@pytest.mark.gpu
@pytest.mark.parametrize("algo", [None, "EAGLE3"], ids=["vanilla", "eagle3"])
def test_engine_bf16_tokens_equal_with_and_without_it_on_the_gpu(monkeypatch, algo):
    """The default model in bf16, CUDA graphs: the same greedy tokens with HOTSPEC_QKV_ROPE as
    without, vanilla and with the shipped EAGLE-3 head."""
    from hotspec import LLM, SamplingParams
    from hotspec.layers import fused

    prompts = ["The capital of France is", "def quicksort(arr):", "List three colours:"]
    params = SamplingParams(temperature=0, max_tokens=24)

    def run(on: bool) -> list[list[int]]:
        monkeypatch.setattr(fused, "_qkv_rope_allowed", lambda: on)
        llm = LLM(dtype="bfloat16", device="cuda", kv_cache_memory_gb=0.5, max_num_seqs=1,
                  cuda_graph_max_bs=1, **({"speculative_algorithm": algo} if algo else {}))
        return [o.token_ids for o in llm.generate(prompts, params)]

    assert run(True) == run(False)
