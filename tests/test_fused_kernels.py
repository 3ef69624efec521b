"""The fused Triton kernels (layers/fused_kernels.py) against the torch code they replace.

On the CPU they run in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py) at small
shapes; the `gpu` tests repeat them at Llama-3.1-8B and SmolLM2 shapes on CUDA. The torch side is
the model's own CPU path (RMSNorm._norm, RotaryEmbedding, store_kv, silu * up), so agreement here
means the CUDA engine computes what the CPU engine (checked against transformers) computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from hotspec.layers import fused_kernels as fk  # noqa: E402
from hotspec.layers.attention.base import store_kv  # noqa: E402
from hotspec.layers.norm import RMSNorm  # noqa: E402
from hotspec.layers.rotary import RotaryEmbedding  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
DTYPES = (torch.float32, torch.bfloat16)
# (hidden, q heads, kv heads, head dim, intermediate): small for the interpreter; real on CUDA
SMALL = (96, 4, 2, 16, 80)
REAL = [(4096, 32, 8, 128, 14336), (576, 9, 3, 64, 1536)]


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    # float32: reduction order only; bf16: the rsqrt may round one ulp apart, which the rounded
    # normalised row and then the weight product can carry to two ulps (2^-6 relative)
    atol, rtol = (1e-5, 1e-5) if dtype == torch.float32 else (1e-2, 1.6e-2)
    torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=rtol)


def _rms(t: int, h: int, dtype: torch.dtype, residual: bool) -> None:
    norm = RMSNorm(h, 1e-5).to(DEV, dtype)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.1)
    x = torch.randn(t, h, device=DEV, dtype=dtype)
    r = torch.randn(t, h, device=DEV, dtype=dtype) if residual else None
    y, s = fk.rms_norm(x, norm.weight, norm.eps, r)
    if residual:
        ref_s = x + r
        if CUDA or dtype == torch.float32:
            assert torch.equal(s, ref_s), "the new residual is the rounded sum, exactly"
        else:  # the interpreter casts float32 to bf16 by truncation: one ulp
            _close(s, ref_s, dtype)
        _close(y, norm._norm(ref_s), dtype)
    else:
        assert s is None
        _close(y, norm._norm(x), dtype)
    assert y.dtype == dtype and y.shape == (t, h)


def _silu(t: int, inter: int, dtype: torch.dtype) -> None:
    gu = torch.randn(t, 2 * inter, device=DEV, dtype=dtype) * 3
    gate, up = gu.chunk(2, dim=-1)
    _close(fk.silu_mul(gu), F.silu(gate) * up, dtype)


def _rope(t: int, hq: int, hkv: int, d: int, dtype: torch.dtype) -> None:
    rope = RotaryEmbedding(d, 4096, 500000.0, {"rope_type": "llama3", "factor": 8.0,
                                               "original_max_position_embeddings": 1024}).to(DEV)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, device=DEV, dtype=dtype)  # a fused qkv output
    q, k, v = qkv.split((hq * d, hkv * d, hkv * d), -1)
    q, k, v = q.view(t, hq, d), k.view(t, hkv, d), v.view(t, hkv, d)
    pos = torch.randint(0, 4096, (t,), device=DEV)
    slots = 3 * t + 1  # last row: the trash slot
    loc = torch.randperm(slots - 1, device=DEV)[:t]
    loc[-1] = slots - 1  # a padding row
    kc, vc = (torch.zeros(slots, hkv, d, device=DEV, dtype=dtype) for _ in range(2))
    kc_ref, vc_ref = kc.clone(), vc.clone()
    q_out = fk.rope_store(q, k, v, pos, rope.cos, rope.sin, kc, vc, loc)
    q_ref, k_ref = rope(pos, q, k)
    store_kv(kc_ref, vc_ref, loc, k_ref, v)
    _close(q_out, q_ref, dtype)
    _close(kc, kc_ref, dtype)
    assert torch.equal(vc, vc_ref), "V is copied, not rotated"
    untouched = torch.ones(slots, dtype=torch.bool, device=DEV)
    untouched[loc] = False
    assert not kc[untouched].any(), "only the batch's slots are written"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_matches_torch(dtype, residual):
    torch.manual_seed(0)
    _rms(5, SMALL[0], dtype, residual)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_matches_torch(dtype):
    torch.manual_seed(1)
    _silu(3, SMALL[4], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_store_matches_rope_then_store(dtype):
    torch.manual_seed(2)
    _, hq, hkv, d, _ = SMALL
    _rope(6, hq, hkv, d, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", REAL)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 7, 64])
def test_fused_kernels_real_shapes(shape, dtype, t):
    h, hq, hkv, d, inter = shape
    torch.manual_seed(t)
    _rms(t, h, dtype, True)
    _rms(t, h, dtype, False)
    _silu(t, inter, dtype)
    _rope(t, hq, hkv, d, dtype)


def test_engine_on_fused_kernels_matches_torch_path(tmp_path, monkeypatch):
    """The whole CUDA layer path (fused qkv/gate_up GEMMs, add+RMSNorm, RoPE+KV store, SiLU*up)
    run end to end by the engine: greedy tokens and prefill logits equal the torch path's."""
    from engine_utils import prefill_logits, rel_l2, save_tiny_llama

    from hotspec.entrypoints.llm import LLM
    from hotspec.layers import fused
    from hotspec.sampling_params import SamplingParams

    path = save_tiny_llama(tmp_path / "tiny", vocab=96, hidden=64, layers=2, std=0.2)
    prompts = [[1, 5, 9, 33, 2], [7, 7, 3], list(range(10, 40))]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

    def run() -> tuple[list[list[int]], torch.Tensor]:
        llm = LLM(str(path), device="cpu", dtype="float32", skip_tokenizer_init=True)
        outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
        return [o.token_ids for o in outs], prefill_logits(llm.engine, prompts)

    ref_tokens, ref_logits = run()
    monkeypatch.setattr(fused, "_on_device", lambda x: True)  # CPU tensors through the interpreter
    tokens, logits = run()
    assert tokens == ref_tokens
    assert rel_l2(logits, ref_logits) < 1e-5


def test_fused_kernels_never_cut_gradients(monkeypatch):
    """The kernels have no backward: while autograd records through a trainable weight or input
    (train-draft's head on CUDA), the torch code runs, so gradients reach every parameter."""
    from hotspec.layers import fused

    monkeypatch.setattr(fused, "_on_device", lambda x: True)  # CPU tensors count as CUDA here
    norm = RMSNorm(SMALL[0], 1e-5)
    x = torch.randn(3, SMALL[0], requires_grad=True)
    assert not fused.enabled(x, norm.weight)
    norm(x).sum().backward()
    assert x.grad is not None and norm.weight.grad is not None
    y, _ = norm.add_forward(torch.randn(3, SMALL[0]), x)
    assert y.grad_fn is not None
    with torch.no_grad():
        assert fused.enabled(x, norm.weight), "inference takes the kernels"
    frozen = RMSNorm(SMALL[0], 1e-5).requires_grad_(False)
    assert fused.enabled(torch.randn(2, SMALL[0]), frozen.weight), "nothing to differentiate"


def test_rope_store_reads_strided_slot_and_position_views() -> None:
    """A strided view of slots or positions (e.g. a row of a transposed [steps, B*K] table) gives
    the same result as a contiguous copy: the draft loop hands such views to the kernel."""
    from hotspec.layers import fused_kernels as fk

    g = torch.Generator().manual_seed(0)
    t, hq, hkv, d = 3, 2, 1, 8
    q, k, v = (torch.randn(t, h, d, generator=g) for h in (hq, hkv, hkv))
    cos, sin = torch.randn(64, d // 2, generator=g), torch.randn(64, d // 2, generator=g)
    table = torch.arange(4 * t).view(t, 4).t()  # rows of the transpose: stride 4
    pos, loc = table[2], table[1]
    assert loc.stride(0) == 4
    outs = []
    for p, slot in ((pos, loc), (pos.clone(), loc.clone())):
        kc, vc = torch.zeros(40, hkv, d), torch.zeros(40, hkv, d)
        outs.append((fk.rope_store(q, k, v, p, cos, sin, kc, vc, slot), kc, vc))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def _topk(t: int, vocab: int, k: int, dtype: torch.dtype) -> None:
    from hotspec.layers.topk_logp import topk_logp_torch

    g = torch.Generator(device=DEV).manual_seed(vocab)
    logits = (torch.randn(t, vocab, device=DEV, generator=g) * 4).to(dtype)
    logits[0, 3] = logits[0, 9] = logits[0].max() + 1  # a tie for first place
    values, idx = fk.topk_logp(logits, k, -1e-6)
    ref_v, ref_i = topk_logp_torch(logits, k, -1e-6)
    torch.testing.assert_close(values, ref_v, atol=2e-5, rtol=1e-5)
    assert idx[0, :2].tolist() == [3, 9][:k], "ties go to the smaller index"
    picked = torch.gather(logits.float(), 1, idx)
    assert torch.equal(picked, torch.gather(logits.float(), 1, ref_i)), "the same top-k values"
    assert (values <= -1e-6).all() and values.dtype == torch.float32 and idx.dtype == torch.long


@pytest.mark.parametrize("vocab,k", [(100, 1), (777, 8), (5000, 10)])  # 5000: two 4096 chunks
def test_topk_logp_matches_torch(vocab, k):
    _topk(5, vocab, k, torch.float32)


@pytest.mark.parametrize("vocab", [100, 5000])
def test_topk_logp_nan_rows_pick_indices_in_range(vocab):
    """A row of NaN logits (e.g. a padded row's hidden state overflowed) still gives k distinct
    indices in range, whose values are NaN as torch's; a row with some NaNs picks among the
    others: an index out of range would make the next draft step's embedding lookup a
    device-side assert."""
    k = 4
    logits = torch.randn(3, vocab, device=DEV)
    logits[0] = float("nan")
    logits[1, ::2] = float("nan")
    values, idx = fk.topk_logp(logits, k, -1e-6)
    assert ((idx >= 0) & (idx < vocab)).all()
    assert idx[0].tolist() == [0, 1, 2, 3] and values[0].isnan().all()
    assert (idx[1] % 2 == 1).all(), "NaNs rank below every number"
    want = torch.topk(logits[2], k).indices
    assert torch.equal(idx[2], want)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [8192, 49152, 128256])
@pytest.mark.parametrize("t", [1, 64, 512])
def test_topk_logp_real_shapes(vocab, t):
    for dtype in DTYPES:
        _topk(t, vocab, 8, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_into_half_of_a_wider_buffer(dtype):
    """RMSNorm.norm_into through the kernel: the norm lands in a strided half, the rest untouched
    (an EAGLE-3 head writes [norm(embed) | norm(feature)] this way instead of concatenating)."""
    t, h = 5, SMALL[0]
    norm = RMSNorm(h, 1e-5).to(DEV, dtype)
    x = torch.randn(t, h, device=DEV, dtype=dtype)
    buf = torch.full((t, 2 * h), 7.0, device=DEV, dtype=dtype)
    fk.rms_norm(x, norm.weight, norm.eps, out=buf[:, h:])
    _close(buf[:, h:], norm._norm(x), dtype)
    assert (buf[:, :h] == 7.0).all()


def test_norm_gemv_engine_decode_equals_separate_kernels(tmp_path, monkeypatch):
    """layers/linear.norm_linear: at one decode row each add+RMSNorm runs inside the GEMV after
    it. In bf16 through the interpreter, the engine's greedy tokens equal those of the separate
    norm and GEMV kernels (norm_gemv_config forced to None), and the fused kernel really ran."""
    from engine_utils import interpreter_ab, save_tiny_llama

    path = save_tiny_llama(tmp_path / "tiny", vocab=96, hidden=64, layers=2, std=0.2)
    (ref, off_rows), (tokens, on_rows) = interpreter_ab(monkeypatch, path, "norm_gemv",
                                                        "norm_gemv_config", (lambda *a: None, None))
    assert not off_rows
    assert tokens == ref
    assert len(on_rows) >= 2 * 2 * 5, "two norms per layer per decode step"


def test_a_qwen2_decode_folds_the_norm_into_its_biased_qkv(tmp_path, monkeypatch):
    """Qwen2's qkv has a bias: at one decode row its norm folds into the GEMV and the bias into its
    epilogue as for bias-free projections (two norm-GEMVs a layer, not one). In bf16 through the
    interpreter, the greedy tokens equal the separate norm, cuBLAS-path and GEMV kernels'."""
    from engine_utils import interpreter_ab
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for prm in model.parameters():
            prm.normal_(0, 0.2)
    model.save_pretrained(tmp_path / "qwen")
    (ref, off_rows), (tokens, on_rows) = interpreter_ab(
        monkeypatch, tmp_path / "qwen", "norm_gemv", "norm_gemv_config", (lambda *a: None, None))
    assert not off_rows
    assert tokens == ref
    assert len(on_rows) >= 2 * 2 * 2 * 5, "two norm-GEMVs per layer per decode step"


def test_row_gemv_engine_equals_the_few_row_gemm(tmp_path, monkeypatch):
    """fused.ROW_GEMV_MAX: a few rows (a 3/1/4 chain's verify of 4 rows, a 5-token prompt's
    prefill) run the one-row norm-GEMV programs side by side instead of the norm kernel and the
    few-row GEMM. In bf16 through the interpreter, the speculative engine's greedy tokens are the
    same either way, and the rows really ran so."""
    from engine_utils import interpreter_ab, tiny_target_and_head

    target, head = tiny_target_and_head(tmp_path, layers=4)
    (ref, off_rows), (tokens, on_rows) = interpreter_ab(
        monkeypatch, target, "norm_gemv", "ROW_GEMV_MAX", (0, 16),
        speculative_algorithm="EAGLE3", speculative_draft_model_path=str(head),
        speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    assert tokens == ref
    assert {4, 5} <= set(on_rows) and not any(r > 1 for r in off_rows)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_eagle3_inputs_in_one_kernel_equal_the_lookup_and_two_norms(dtype, monkeypatch):
    """The EAGLE-3 head's input [input_layernorm(embed(tokens)) | hidden_norm(feature)] from
    layers/norm_pair_kernel.py equals the lookup and the two fused rms_norm kernels bit for bit
    (both in the interpreter on the CPU), and the torch path within rounding."""
    from torch import nn

    from hotspec.layers import fused
    from hotspec.models.config import ModelConfig
    from hotspec.models.eagle3 import Eagle3MidLayer

    cfg = ModelConfig(architecture="llama", vocab_size=50, hidden_size=48, intermediate_size=96,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=12)
    torch.manual_seed(0)
    mid = Eagle3MidLayer(cfg).to(dtype).requires_grad_(False)
    with torch.no_grad():
        mid.input_layernorm.weight.normal_(1, 0.1)
        mid.hidden_norm.weight.normal_(1, 0.1)
    embed = nn.Embedding(50, 48).to(dtype).requires_grad_(False)
    tokens, feature = torch.tensor([3, 0, 49, 7]), (torch.randn(4, 48) * 3).to(dtype)
    torch_path = mid.inputs(tokens, embed, feature)
    monkeypatch.setattr(fused, "_on_device", lambda x: True)
    want = torch.empty_like(torch_path)
    mid.input_layernorm.norm_into(embed(tokens), want[:, :48])
    mid.hidden_norm.norm_into(feature, want[:, 48:])
    calls = []
    real = fused.embed_norm_pair
    monkeypatch.setattr(fused, "embed_norm_pair", lambda *a: calls.append(1) or real(*a))
    got = mid.inputs(tokens, embed, feature)
    assert calls == [1] and torch.equal(got, want)
    torch.testing.assert_close(got.float(), torch_path.float(), rtol=2e-2, atol=2e-2)


def test_eagle3_inputs_read_strided_token_views(monkeypatch):
    """A chain shape of the adaptive engine feeds the first column of the [B, K] draft state as
    its tokens (a view of stride K): the kernel reads each row's own token, as from a copy."""
    from hotspec.layers import fused

    g = torch.Generator().manual_seed(0)
    h, t, k = 16, 4, 8
    embed = torch.randn(50, h, generator=g)
    feature = torch.randn(t, h, generator=g)
    w0, w1 = torch.rand(h, generator=g) + 0.5, torch.rand(h, generator=g) + 0.5
    state = torch.randint(0, 50, (t, k), generator=g)
    ids = state[:, :1].reshape(-1)
    assert ids.stride(0) == k
    monkeypatch.setattr(fused, "_on_device", lambda x: True)
    got = fused.embed_norm_pair(ids, embed, w0, 1e-6, feature, w1, 1e-6)
    want = fused.embed_norm_pair(ids.clone(), embed, w0, 1e-6, feature, w1, 1e-6)
    assert torch.equal(got, want)
    ref = torch.nn.functional.rms_norm(embed[state[:, 0]], (h,), eps=1e-6) * w0
    torch.testing.assert_close(got[:, :h], ref, rtol=1e-5, atol=1e-5)
