"""Triton paged attention (TritonBackend) against the torch reference backend, every phase.

Without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set below before Triton
is imported) at small shapes; real-model shapes and CUDA-graph capture are `gpu` tests."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib  # noqa: E402

import pytest  # noqa: E402

triton = pytest.importorskip("triton")

from engine_utils import greedy_tokens, random_engine  # noqa: E402

from hotspec.core.forward_batch import ForwardBatch, ForwardMode  # noqa: E402
from hotspec.layers.attention import triton_backend, triton_kernels  # noqa: E402
from hotspec.layers.attention.torch_ref import TorchRefBackend  # noqa: E402

if not torch.cuda.is_available() and not isinstance(
        triton_kernels.paged_attn_fwd, triton.runtime.interpreter.InterpretedFunction):
    # another module imported the kernels before TRITON_INTERPRET was set: rebuild them interpreted
    os.environ["TRITON_INTERPRET"] = "1"
    triton_kernels = importlib.reload(triton_kernels)
    triton_backend = importlib.reload(triton_backend)

TritonBackend = triton_backend.TritonBackend
KernelTuning = triton_backend.KernelTuning
RopeFold = triton_backend.RopeFold  # (defined in attention/base.py)

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PAGE = 16
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def _tol(dtype: torch.dtype) -> float:
    if dtype == F32:
        return 1e-4 if DEV.type == "cpu" else 1e-3
    return 2e-2


# ------------------------------------------------------------------------------- case building


def tree_mask(n: int) -> torch.Tensor:
    """Random tree of n nodes (node 0 the root, parent[i] < i): mask[i, j] = j is i or its ancestor."""
    m = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        m[i, i] = True
        if i:
            par = int(torch.randint(0, i, ()).item())
            m[i] |= m[par]
    return m


def draft_mask(k: int, m: int) -> torch.Tensor:
    """Draft-like [k, m]: each row sees a random subset of the scratch region plus its own slot."""
    mask = torch.rand(k, m) < 0.3
    own = m - k + torch.arange(k)
    mask[torch.arange(k), own] = True
    return mask


def make_case(*, q_lens: list[int], kv_lens: list[int], width: int | None, hq: int, hkv: int,
              d: int, dtype: torch.dtype, masks: list[torch.Tensor] | None = None,
              seed: int = 0, device: torch.device = DEV):
    """Random caches / block tables / queries for one phase. Returns (fb, q, k_cache, v_cache)."""
    torch.manual_seed(seed)
    b = len(q_lens)
    assert len(kv_lens) == b and all(kv >= q for q, kv in zip(q_lens, kv_lens))
    max_kv = max(kv_lens)
    need = [triton.cdiv(kv, PAGE) for kv in kv_lens]
    num_blocks = sum(need) + 3
    perm = torch.randperm(num_blocks)
    cols = triton.cdiv(max_kv, PAGE) + 1
    # unused table entries hold block ids far out of range: the kernel must never touch them
    tables = torch.full((b, cols), 1 << 20, dtype=torch.int32)
    pos = 0
    for i, n in enumerate(need):
        tables[i, :n] = perm[pos:pos + n].to(torch.int32)
        pos += n
    slots = num_blocks * PAGE
    k_cache = torch.randn(slots + 1, hkv, d).to(dtype)
    v_cache = torch.randn(slots + 1, hkv, d).to(dtype)
    if width is None:
        t = sum(q_lens)
        cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.long)
        mode = ForwardMode.PREFILL
        max_q = max(q_lens)
    else:
        assert all(q <= width for q in q_lens)
        t = b * width
        cu = None
        max_q = width
        mode = ForwardMode.VERIFY if masks is not None else ForwardMode.DECODE
    custom = None
    if masks is not None:
        custom = torch.stack(masks).to(torch.bool)
    q = torch.randn(t, hq, d).to(dtype)
    zeros = torch.zeros(t, dtype=torch.long)

    def dv(x):
        return None if x is None else x.to(device)

    fb = ForwardBatch(mode=mode, input_ids=dv(zeros), positions=dv(zeros), out_cache_loc=dv(zeros),
                      q_lens=dv(torch.tensor(q_lens, dtype=torch.long)),
                      kv_lens=dv(torch.tensor(kv_lens, dtype=torch.long)),
                      block_tables=dv(tables), width=width, cu_seqlens_q=dv(cu), max_q=max_q,
                      max_kv=max_kv, custom_mask=dv(custom))
    return fb, q.to(device), k_cache.to(device), v_cache.to(device)


def reference(fb: ForwardBatch, q, k_cache, v_cache, scale: float) -> torch.Tensor:
    """TorchRefBackend on float32 copies of the same inputs (the most exact oracle for bf16)."""
    ref = TorchRefBackend(PAGE)
    ref.plan(fb)
    return ref.forward(fb, q.float(), k_cache.float(), v_cache.float(), scale)


def check(fb: ForwardBatch, q, k_cache, v_cache, backend: TritonBackend | None = None,
          tol: float | None = None) -> None:
    scale = q.shape[-1] ** -0.5
    want = reference(fb, q, k_cache, v_cache, scale)
    backend = backend or TritonBackend(PAGE)
    backend.plan(fb)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)  # poison
    got = backend.forward(fb, q, k_cache, v_cache, scale, out=out)
    assert got is out
    assert torch.isfinite(got).all(), "NaN/inf in output (some element not written?)"
    tol = tol or _tol(q.dtype)
    g, w = got.float(), want.float()
    rel = ((g - w).norm() / w.norm()).item()
    row_rel = ((g - w).norm(dim=-1) / w.norm(dim=-1).clamp_min(1e-6)).max().item()
    assert rel <= tol, f"relative L2 error {rel:.3g} > {tol}"
    assert row_rel <= 5 * tol, f"worst row relative error {row_rel:.3g} > {5 * tol}"


# ------------------------------------------------------------------------------------ CPU cases

# (group, head_dim, dtype): every group, head dim and dtype appears in each phase's set
COMBOS = [(1, 64, F32), (3, 128, BF16), (4, 64, BF16), (4, 128, F32)]
HKV = 2


def _ids(c):
    return f"g{c[0]}-d{c[1]}-{str(c[2]).split('.')[-1]}"


@pytest.mark.parametrize("combo", COMBOS, ids=_ids)
def test_prefill_ragged_extend(combo) -> None:
    group, d, dtype = combo
    q_lens = [1, 19, 40]
    prefix = [0, 5, 33]  # nonzero prefix: extend over cached tokens
    fb, q, kc, vc = make_case(q_lens=q_lens, kv_lens=[a + b for a, b in zip(q_lens, prefix)],
                              width=None, hq=group * HKV, hkv=HKV, d=d, dtype=dtype, seed=1)
    check(fb, q, kc, vc)


@pytest.mark.parametrize("combo", COMBOS, ids=_ids)
def test_decode(combo) -> None:
    group, d, dtype = combo
    fb, q, kc, vc = make_case(q_lens=[1, 1, 1], kv_lens=[1, 17, 150], width=1, hq=group * HKV,
                              hkv=HKV, d=d, dtype=dtype, seed=2)
    check(fb, q, kc, vc)


@pytest.mark.parametrize("combo", COMBOS, ids=_ids)
def test_uniform_causal_padding_rows(combo) -> None:
    """draft_extend-like: width 4, q_lens < width on some requests (padding rows see kv 0)."""
    group, d, dtype = combo
    q_lens = [1, 4, 2]
    prefix = [70, 30, 0]  # request 0: padding rows next to whole (unmasked) kv blocks
    fb, q, kc, vc = make_case(q_lens=q_lens, kv_lens=[a + b for a, b in zip(q_lens, prefix)],
                              width=4, hq=group * HKV, hkv=HKV, d=d, dtype=dtype, seed=3)
    check(fb, q, kc, vc)


@pytest.mark.parametrize("combo", COMBOS, ids=_ids)
def test_custom_mask_verify(combo) -> None:
    """verify: width N, M = N, random ancestor masks (diagonal included)."""
    group, d, dtype = combo
    n = 8
    prefix = [0, 21, 70]
    fb, q, kc, vc = make_case(q_lens=[n] * 3, kv_lens=[p + n for p in prefix], width=n,
                              hq=group * HKV, hkv=HKV, d=d, dtype=dtype, seed=4,
                              masks=[tree_mask(n) for _ in prefix])
    check(fb, q, kc, vc)


@pytest.mark.parametrize("combo", COMBOS, ids=_ids)
def test_custom_mask_draft(combo) -> None:
    """draft: width K, M > K (scratch of earlier draft steps)."""
    group, d, dtype = combo
    k, m = 4, 12
    prefix = [3, 40]
    fb, q, kc, vc = make_case(q_lens=[k, k], kv_lens=[p + m for p in prefix], width=k,
                              hq=group * HKV, hkv=HKV, d=d, dtype=dtype, seed=5,
                              masks=[draft_mask(k, m) for _ in prefix])
    check(fb, q, kc, vc)


def test_custom_mask_padding_rows_and_small_tiles() -> None:
    """Custom mask with q_lens < width, several query tiles per request (block_m=16, group 4)."""
    n = 8
    prefix = [50, 5]
    fb, q, kc, vc = make_case(q_lens=[3, n], kv_lens=[p + n for p in prefix], width=n, hq=8, hkv=2,
                              d=64, dtype=F32, seed=6, masks=[tree_mask(n) for _ in prefix])
    check(fb, q, kc, vc, backend=TritonBackend(PAGE, KernelTuning(block_m=16, block_n=16)))


@pytest.mark.parametrize("m", [12, 64])
def test_packed_mask_bits_keep_every_slot(m: int) -> None:
    """pack_mask_bits: bit j of row i's word is mask[i, j], the 64th slot (the sign bit) included."""
    torch.manual_seed(13)
    mask = torch.rand(2, 5, m) < 0.5
    mask[0, 0, m - 1] = True
    words = triton_backend.pack_mask_bits(mask)
    unpacked = (words.unsqueeze(-1) >> torch.arange(m)) & 1
    assert words.dtype == torch.int64 and torch.equal(unpacked.bool(), mask)
    with pytest.raises(ValueError, match="at most 64"):
        triton_backend.pack_mask_bits(torch.ones(1, 1, 65, dtype=torch.bool))


@pytest.mark.parametrize("phase", ["verify", "draft", "padding-rows"])
def test_custom_mask_as_bits_matches_the_reference(phase: str) -> None:
    """The packed-word mask path (the default for masks of <= 64 slots) gives the reference's
    attention."""
    if phase == "verify":
        n, prefix = 8, [0, 21, 70]
        case = make_case(q_lens=[n] * 3, kv_lens=[p + n for p in prefix], width=n, hq=6, hkv=2, d=64,
                         dtype=BF16, seed=4, masks=[tree_mask(n) for _ in prefix])
        backend = TritonBackend(PAGE, KernelTuning(mask_bits=True))
    elif phase == "draft":
        k, m, prefix = 4, 12, [3, 40]
        case = make_case(q_lens=[k, k], kv_lens=[p + m for p in prefix], width=k, hq=8, hkv=2, d=64,
                         dtype=F32, seed=5, masks=[draft_mask(k, m) for _ in prefix])
        backend = TritonBackend(PAGE, KernelTuning(mask_bits=True, num_splits=3, block_n=16))
    else:
        n, prefix = 8, [50, 5]
        case = make_case(q_lens=[3, n], kv_lens=[p + n for p in prefix], width=n, hq=8, hkv=2, d=64,
                         dtype=F32, seed=6, masks=[tree_mask(n) for _ in prefix])
        backend = TritonBackend(PAGE, KernelTuning(mask_bits=True, block_m=16, block_n=16))
    fb, q, kc, vc = case
    check(fb, q, kc, vc, backend=backend)
    assert fb.attn_meta.mask_bits and fb.attn_meta.custom_mask.dtype == torch.int64


def test_prefill_many_query_tiles() -> None:
    """Ragged prefill spanning several query tiles and kv blocks (small tiles)."""
    q_lens = [33, 2, 20]
    prefix = [0, 47, 16]
    fb, q, kc, vc = make_case(q_lens=q_lens, kv_lens=[a + b for a, b in zip(q_lens, prefix)],
                              width=None, hq=3, hkv=1, d=64, dtype=BF16, seed=7)
    check(fb, q, kc, vc, backend=TritonBackend(PAGE, KernelTuning(block_m=16, block_n=16)))


@pytest.mark.parametrize("splits", [2, 5])
def test_split_kv_decode(splits: int) -> None:
    """Flash-decoding path (forced split count), including splits with no kv at all."""
    fb, q, kc, vc = make_case(q_lens=[1, 1, 1], kv_lens=[1, 40, 170], width=1, hq=8, hkv=2, d=64,
                              dtype=F32, seed=8)
    check(fb, q, kc, vc, backend=TritonBackend(PAGE, KernelTuning(num_splits=splits, block_n=16)))


def test_split_kv_verify_min_chunk_dead_splits() -> None:
    """Splits of at least min_chunk kv indices: at a short live length the last splits see no
    keys (their partials are skipped by the combine); the result is the reference's."""
    n = 4
    fb, q, kc, vc = make_case(q_lens=[n, n, n], kv_lens=[n, 20 + n, 150 + n], width=n, hq=6,
                              hkv=2, d=64, dtype=BF16, seed=19,
                              masks=[tree_mask(n), tree_mask(n), tree_mask(n)])
    check(fb, q, kc, vc, backend=TritonBackend(PAGE, KernelTuning(num_splits=8, block_n=16, min_chunk=32)))


def test_split_kv_verify_and_padding() -> None:
    n = 4
    fb, q, kc, vc = make_case(q_lens=[n, n], kv_lens=[n, 90 + n], width=n, hq=6, hkv=2, d=64,
                              dtype=BF16, seed=9, masks=[tree_mask(n), tree_mask(n)])
    check(fb, q, kc, vc, backend=TritonBackend(PAGE, KernelTuning(num_splits=3, block_n=16)))
    fb, q, kc, vc = make_case(q_lens=[1, 3], kv_lens=[1, 60], width=4, hq=4, hkv=4, d=64,
                              dtype=F32, seed=10)
    check(fb, q, kc, vc, backend=TritonBackend(PAGE, KernelTuning(num_splits=4, block_n=16)))


def _rope_case(group: int, dtype: torch.dtype, seed: int, kv_lens: list[int], d: int = 64,
               device: torch.device = DEV):
    """A decode batch with the step's raw k, v, the positions and cache slots of its new tokens
    (kv_len - 1), and float32 cos / sin tables, for the RoPE fold."""
    fb, q, kc, vc = make_case(q_lens=[1] * len(kv_lens), kv_lens=kv_lens, width=1, hq=group * HKV,
                              hkv=HKV, d=d, dtype=dtype, seed=seed, device=device)
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(len(kv_lens), HKV, d, generator=g).to(dtype).to(device)
    v = torch.randn(len(kv_lens), HKV, d, generator=g).to(dtype).to(device)
    ang = torch.rand(max(kv_lens) + 3, d // 2, generator=g) * 6.3
    cos, sin = ang.cos().to(device), ang.sin().to(device)
    pos = torch.tensor([n - 1 for n in kv_lens], device=device)
    bt = fb.block_tables.long()
    loc = bt[torch.arange(len(kv_lens), device=device), pos // PAGE] * PAGE + pos % PAGE
    fb.positions, fb.out_cache_loc = pos, loc
    return fb, q, kc, vc, RopeFold(k, v, pos, loc, cos, sin)


@pytest.mark.parametrize("case", ["g4-bf16", "g3-f32", "g1-bf16"])
@pytest.mark.parametrize("splits", [1, 2, 5, "deterministic"])
def test_rope_folded_into_decode_attention(case: str, splits: int | str) -> None:
    """The RoPE fold: the attention kernel rotating q and storing the step's K and V itself
    gives the bits of fused_kernels.rope_store followed by attention: the output, and the caches
    (the new token's slot included, every other slot untouched); the deterministic mode's tiles
    too (its decode folds, its other phases take rope_store)."""
    from hotspec.layers import fused_kernels as fk

    g, dt = case.split("-")
    group, dtype = int(g[1:]), {"bf16": BF16, "f32": F32}[dt]
    fb, q, kc, vc, rope = _rope_case(group, dtype, seed=41, kv_lens=[1, 17, 32, 150])
    scale = q.shape[-1] ** -0.5
    kc2, vc2 = kc.clone(), vc.clone()
    q_rot = fk.rope_store(q, rope.k, rope.v, rope.positions, rope.cos, rope.sin, kc, vc, rope.loc)
    if splits == "deterministic":
        base = TritonBackend(PAGE, KernelTuning(deterministic=True))
        base.fold_rope = False
        folded = TritonBackend(PAGE, KernelTuning(deterministic=True))
    else:
        base = TritonBackend(PAGE, KernelTuning(num_splits=splits, block_n=16, fold_rope=False))
        folded = TritonBackend(PAGE, KernelTuning(num_splits=splits, block_n=16, fold_rope=True))
    base.plan(fb)
    want = base.forward(fb, q_rot, kc, vc, scale)
    assert folded.folds_rope(fb, q, rope.k) and not base.folds_rope(fb, q, rope.k)
    folded.plan(fb)
    got = folded.forward(fb, q, kc2, vc2, scale, rope=rope)
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)
    assert torch.equal(got, want)


def _rope_verify_case(group: int, dtype: torch.dtype, seed: int, kv_lens: list[int], n: int,
                      q_lens: list[int] | None = None, d: int = 64, hkv: int = HKV,
                      device: torch.device = DEV):
    """A verify batch of n-node trees (rows i >= q_len are padding) with the step's raw k, v,
    each node's position (the root's kv index plus its depth) and cache slot (kv index
    kv_len - n + i), and float32 cos / sin tables, for the RoPE fold."""
    b = len(kv_lens)
    g = torch.Generator().manual_seed(seed)
    masks = [tree_mask(n) for _ in range(b)]
    fb, q, kc, vc = make_case(q_lens=q_lens or [n] * b, kv_lens=kv_lens, width=n,
                              hq=group * hkv, hkv=hkv, d=d, dtype=dtype, seed=seed, masks=masks,
                              device=device)
    k = torch.randn(b * n, hkv, d, generator=g).to(dtype).to(device)
    v = torch.randn(b * n, hkv, d, generator=g).to(dtype).to(device)
    ang = torch.rand(max(kv_lens) + 3, d // 2, generator=g) * 6.3
    idx = torch.tensor([[kv - n + i for i in range(n)] for kv in kv_lens])
    depth = torch.stack([m.sum(1) - 1 for m in masks])
    pos = (torch.tensor(kv_lens)[:, None] - n + depth).flatten().to(device)
    loc = (fb.block_tables.long().cpu().gather(1, idx // PAGE) * PAGE + idx % PAGE).flatten()
    fb.positions, fb.out_cache_loc = pos, loc.to(device)
    return fb, q, kc, vc, RopeFold(k, v, pos, loc.to(device), ang.cos().to(device),
                                   ang.sin().to(device))


@pytest.mark.parametrize("case", ["g4-bf16", "g3-f32", "g1-bf16"])
@pytest.mark.parametrize("splits", [1, 2, 5])
def test_rope_folded_into_verify_attention(case: str, splits: int) -> None:
    """The RoPE fold at verify (one query tile): the kernel rotating the nodes' q and storing
    their K and V itself gives rope_store's bits, then attention's: output and caches (the
    tree's slots included, every other slot untouched), tree slots split across programs, a
    request with padding rows."""
    from hotspec.layers import fused_kernels as fk

    g, dt = case.split("-")
    group, dtype = int(g[1:]), {"bf16": BF16, "f32": F32}[dt]
    fb, q, kc, vc, rope = _rope_verify_case(group, dtype, seed=46, kv_lens=[4, 21, 70], n=4,
                                            q_lens=[4, 2, 4])
    scale = q.shape[-1] ** -0.5
    kc2, vc2 = kc.clone(), vc.clone()
    q_rot = fk.rope_store(q, rope.k, rope.v, rope.positions, rope.cos, rope.sin, kc, vc, rope.loc)
    base = TritonBackend(PAGE, KernelTuning(num_splits=splits, block_n=16, fold_rope=False))
    folded = TritonBackend(PAGE, KernelTuning(num_splits=splits, block_n=16, fold_rope=True))
    base.plan(fb)
    want = base.forward(fb, q_rot, kc, vc, scale)
    assert folded.folds_rope(fb, q, rope.k) and not base.folds_rope(fb, q, rope.k)
    folded.plan(fb)
    got = folded.forward(fb, q, kc2, vc2, scale, rope=rope)
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)
    assert torch.equal(got, want)


def test_rope_fold_refuses_what_it_does_not_handle() -> None:
    """Decode batches and verify batches of one query tile only (not a draft step's mask, not a
    verify whose query heads fill two tiles, not the deterministic mode's verify), and only with
    fold_rope on."""
    fb, q, kc, vc, rope = _rope_case(2, BF16, seed=42, kv_lens=[5, 9])
    off = TritonBackend(PAGE, KernelTuning(fold_rope=False))
    off.plan(fb)
    with pytest.raises(ValueError, match="decode batches"):
        off.forward(fb, q, kc, vc, 1.0, rope=rope)
    on = TritonBackend(PAGE, KernelTuning(fold_rope=True))
    fbv, qv, kcv, vcv, ropev = _rope_verify_case(7, BF16, seed=43, kv_lens=[30], n=12)
    assert not on.folds_rope(fbv, qv, ropev.k), "12 nodes of 7 heads (8 padded): two tiles"
    on.plan(fbv)
    with pytest.raises(ValueError, match="one query tile"):
        on.forward(fbv, qv, kcv, vcv, 1.0, rope=ropev)
    fbv, qv, _, _, ropev = _rope_verify_case(7, BF16, seed=43, kv_lens=[30], n=8)
    assert on.folds_rope(fbv, qv, ropev.k), "8 nodes of 7 heads: one 64-row tile"
    assert not TritonBackend(PAGE, KernelTuning(deterministic=True)).folds_rope(fbv, qv, ropev.k)
    fbv.mode = ForwardMode.DRAFT
    assert not on.folds_rope(fbv, qv, ropev.k)


def test_plan_keeps_device_tensors_and_rejects_ragged_custom() -> None:
    fb, q, kc, vc = make_case(q_lens=[2, 3], kv_lens=[5, 9], width=None, hq=2, hkv=1, d=64,
                              dtype=F32, seed=12)
    be = TritonBackend(PAGE)
    be.plan(fb)
    assert fb.attn_meta.kv_lens is fb.kv_lens and fb.attn_meta.q_lens is fb.q_lens
    fb.custom_mask = torch.ones(2, 3, 3, dtype=torch.bool)
    with pytest.raises(ValueError):
        be.plan(fb)


# ------------------------------------------------------------------------------------ GPU cases

LLAMA8B = dict(hq=32, hkv=8, d=128)
SMOL = dict(hq=9, hkv=3, d=64)


def _rand_lens(n: int, lo: int, hi: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, (n,), generator=g).tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [LLAMA8B, SMOL], ids=["llama8b", "smollm2"])
@pytest.mark.parametrize("dtype", [BF16, F16, F32], ids=["bf16", "fp16", "fp32"])
def test_gpu_prefill(shape, dtype) -> None:
    q_lens = [1, 700, 1000, 77, 256]
    prefix = [4000, 0, 3000, 129, 17]
    fb, q, kc, vc = make_case(q_lens=q_lens, kv_lens=[a + b for a, b in zip(q_lens, prefix)],
                              width=None, dtype=dtype, seed=100, **shape)
    check(fb, q, kc, vc)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [LLAMA8B, SMOL], ids=["llama8b", "smollm2"])
@pytest.mark.parametrize("batch", [1, 8, 64])
@pytest.mark.parametrize("splits", [None, 1], ids=["auto-split", "no-split"])
def test_gpu_decode(shape, batch, splits) -> None:
    kv = [4096] if batch == 1 else _rand_lens(batch, 1, 4096, seed=batch)
    fb, q, kc, vc = make_case(q_lens=[1] * batch, kv_lens=kv, width=1, dtype=BF16, seed=101,
                              **shape)
    check(fb, q, kc, vc, backend=TritonBackend(PAGE, KernelTuning(num_splits=splits)))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [LLAMA8B, SMOL], ids=["llama8b", "smollm2"])
@pytest.mark.parametrize("batch,n", [(1, 60), (16, 8), (64, 16)])
@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("bits", [False, True], ids=["byte-mask", "bit-mask"])
def test_gpu_verify(shape, batch, n, dtype, bits) -> None:
    prefix = _rand_lens(batch, 0, 4000, seed=n)
    fb, q, kc, vc = make_case(q_lens=[n] * batch, kv_lens=[p + n for p in prefix], width=n,
                              dtype=dtype, seed=102, masks=[tree_mask(n) for _ in prefix], **shape)
    check(fb, q, kc, vc, backend=TritonBackend(PAGE, KernelTuning(mask_bits=bits)))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [LLAMA8B, SMOL], ids=["llama8b", "smollm2"])
@pytest.mark.parametrize("batch", [1, 32])
def test_gpu_draft_and_draft_extend(shape, batch) -> None:
    k, m = 8, 8 * 5
    prefix = _rand_lens(batch, 1, 4000, seed=batch + 7)
    fb, q, kc, vc = make_case(q_lens=[k] * batch, kv_lens=[p + m for p in prefix], width=k,
                              dtype=BF16, seed=103, masks=[draft_mask(k, m) for _ in prefix], **shape)
    check(fb, q, kc, vc)
    w = 7
    a = _rand_lens(batch, 1, w, seed=batch + 8)
    fb, q, kc, vc = make_case(q_lens=a, kv_lens=[p + x for p, x in zip(prefix, a)], width=w,
                              dtype=BF16, seed=104, **shape)
    check(fb, q, kc, vc)


def _graph_case(kind: str, shape: dict, seed: int):
    b = 4
    if kind == "decode":
        return make_case(q_lens=[1] * b, kv_lens=_rand_lens(b, 1, 3000, seed), width=1,
                         dtype=BF16, seed=seed, **shape)
    if kind == "verify":
        n = 8
        prefix = _rand_lens(b, 0, 3000, seed)
        return make_case(q_lens=[n] * b, kv_lens=[p + n for p in prefix], width=n, dtype=BF16,
                         seed=seed, masks=[tree_mask(n) for _ in prefix], **shape)
    w = 5
    a = _rand_lens(b, 1, w, seed)
    prefix = _rand_lens(b, 0, 3000, seed + 1)
    return make_case(q_lens=a, kv_lens=[p + x for p, x in zip(prefix, a)], width=w, dtype=BF16,
                     seed=seed, **shape)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["decode", "verify", "draft_extend"])
@pytest.mark.parametrize("splits", [None, 1], ids=["auto-split", "no-split"])
def test_gpu_cuda_graph_replay(kind, splits) -> None:
    """Capture plan + forward once; change lengths / tables / masks in place; replay == reference."""
    shape = LLAMA8B
    fb, q, kc, vc = _graph_case(kind, shape, seed=200)
    # static caches big enough for any later case: reuse the first case's pool size bound
    max_kv_bound = 4096
    fb.max_kv = max_kv_bound
    cols = triton.cdiv(max_kv_bound, PAGE) + 1
    n_slots = 3 * 4 * cols * PAGE
    kc_s = torch.zeros(n_slots + 1, shape["hkv"], shape["d"], dtype=BF16, device=DEV)
    vc_s = torch.zeros_like(kc_s)
    bt_s = torch.zeros(fb.batch_size, cols, dtype=torch.int32, device=DEV)
    static = ForwardBatch(mode=fb.mode, input_ids=fb.input_ids.clone(), positions=fb.positions.clone(),
                          out_cache_loc=fb.out_cache_loc.clone(), q_lens=fb.q_lens.clone(),
                          kv_lens=fb.kv_lens.clone(), block_tables=bt_s, width=fb.width,
                          max_q=fb.max_q, max_kv=max_kv_bound,
                          custom_mask=None if fb.custom_mask is None else fb.custom_mask.clone())
    q_s = torch.zeros_like(q)
    be = TritonBackend(PAGE, KernelTuning(num_splits=splits))
    scale = shape["d"] ** -0.5

    def load(case) -> None:
        f, qq, k, v = case
        static.q_lens.copy_(f.q_lens)
        static.kv_lens.copy_(f.kv_lens)
        bt_s.fill_(1 << 20)
        bt_s[:, :f.block_tables.shape[1]].copy_(f.block_tables)
        if static.custom_mask is not None:
            static.custom_mask.copy_(f.custom_mask)
        q_s.copy_(qq)
        kc_s[:k.shape[0] - 1].copy_(k[:-1])
        vc_s[:v.shape[0] - 1].copy_(v[:-1])

    def run() -> torch.Tensor:
        be.plan(static)
        return be.forward(static, q_s, kc_s, vc_s, scale)

    load((fb, q, kc, vc))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for seed in (201, 202, 203):
        case = _graph_case(kind, shape, seed)
        assert case[2].shape[0] - 1 <= n_slots
        load(case)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        f, qq, k, v = case
        f.max_kv = max(int(x) for x in f.kv_lens.tolist())
        want = reference(f, qq, k, v, scale)
        assert torch.isfinite(out).all()
        rel = ((out.float() - want).norm() / want.norm()).item()
        assert rel <= 2e-2, f"{kind} replay seed {seed}: rel L2 {rel:.3g}"


def _launch_rule_case(monkeypatch):
    """A default backend that sees 132 SMs, a CUDA device to ask it about, and a decode and a
    verify batch (only their plans are used: nothing is launched)."""
    backend = TritonBackend(PAGE)
    monkeypatch.setattr(backend, "_sms", lambda dev: 132)
    decode = make_case(q_lens=[1], kv_lens=[9], width=1, hq=4, hkv=HKV, d=16, dtype=F32)[0]
    verify = make_case(q_lens=[2], kv_lens=[9], width=2, hq=4, hkv=HKV, d=16, dtype=F32,
                       masks=[tree_mask(2)])[0]
    return backend, torch.device("cuda", 0), decode, verify


def test_split_counts_one_wave_for_multi_row_phases(monkeypatch) -> None:
    """kv splits at a server's static bound (8192) with 8 programs before splitting, on 132 SMs:
    decode aims at two waves (32 splits, the bound's limit); verify, draft and draft_extend (more
    than one query row per request) at one wave (132 // 8 = 16)."""
    backend, cuda, decode, verify = _launch_rule_case(monkeypatch)
    counts = {}
    for name, fb in (("decode", decode), ("verify", verify)):
        fb.max_kv = 8192
        backend.plan(fb)
        counts[name] = backend._splits(fb.attn_meta, 8, 16, 64, cuda)
    assert counts == {"decode": 32, "verify": 16}
    # one wave already: no split; a short static bound limits the count, the more the taller
    # the query tile (a split covers at least one kv tile per 16 tile rows)
    assert backend._splits(verify.attn_meta, 132, 16, 64, cuda) == 1
    verify.max_kv = 576
    backend.plan(verify)
    assert backend._splits(verify.attn_meta, 8, 16, 64, cuda) == 9
    assert backend._splits(verify.attn_meta, 8, 64, 64, cuda) == 2


def test_tile_rows_32_for_decode_of_few_programs(monkeypatch) -> None:
    """kv rows per tile on 132 SMs: 16-bit decode with at most 8 programs before splitting (the
    8B heads at batch 1) takes 32, more takes 64, as do the other phases; fp32 always 32; an
    explicit block_n always wins."""
    backend, cuda, decode, verify = _launch_rule_case(monkeypatch)
    for fb in (decode, verify):
        backend.plan(fb)
    assert backend._block_n(decode.attn_meta, False, 8, cuda) == 32
    assert backend._block_n(decode.attn_meta, False, 9, cuda) == 64
    assert backend._block_n(verify.attn_meta, False, 8, cuda) == 64
    assert backend._block_n(decode.attn_meta, True, 64, cuda) == 32
    assert backend._block_n(decode.attn_meta, False, 8, torch.device("cpu")) == 64
    assert TritonBackend(PAGE, KernelTuning(block_n=16))._block_n(decode.attn_meta, False, 8, cuda) == 16


def test_decode_runs_its_kv_loop_at_one_stage() -> None:
    """Decode (one row per request, no custom mask) pipelines its kv loop at one stage, the
    other phases at two; a stage count given to the constructor wins."""
    dec = make_case(q_lens=[1], kv_lens=[9], width=1, hq=4, hkv=2, d=64, dtype=BF16, seed=70)[0]
    ver = make_case(q_lens=[4], kv_lens=[9], width=4, hq=4, hkv=2, d=64, dtype=BF16, seed=71,
                    masks=[tree_mask(4)])[0]
    be = TritonBackend(PAGE)
    stages = []
    for fb in (dec, ver):
        be.plan(fb)
        stages.append(be._stages(fb.attn_meta))
    assert stages == [1, 2]
    fixed = TritonBackend(PAGE, KernelTuning(num_stages=3))
    fixed.plan(dec)
    assert fixed._stages(dec.attn_meta) == 3


def test_v_early_rule(monkeypatch) -> None:
    """The V tile's loads go out with the K tile's at one stage and tiles of at most 32 rows
    (the batch-1 decode tile); 64-row tiles and pipelined (two-stage) phases keep the old order."""
    dec = make_case(q_lens=[1], kv_lens=[9], width=1, hq=4, hkv=2, d=64, dtype=BF16, seed=72)[0]
    ver = make_case(q_lens=[4], kv_lens=[9], width=4, hq=4, hkv=2, d=64, dtype=BF16, seed=73,
                    masks=[tree_mask(4)])[0]
    be = TritonBackend(PAGE)
    for fb in (dec, ver):
        be.plan(fb)
    assert be._v_early(dec.attn_meta, 32) and be._v_early(dec.attn_meta, 16)
    assert not be._v_early(dec.attn_meta, 64)
    assert not be._v_early(ver.attn_meta, 32)


def _v_early_same_bits(dtype: torch.dtype, d: int, hq: int, hkv: int, kv: int, splits: int | None,
                       monkeypatch) -> None:
    """Decode (split or not) and a tree verify with V's loads early against the old order, at
    32-row tiles: the same values in the same order, so the same bits."""
    cases = [make_case(q_lens=[1, 1], kv_lens=[kv, kv // 2 + 1], width=1, hq=hq, hkv=hkv, d=d,
                       dtype=dtype, seed=74),
             make_case(q_lens=[4, 3], kv_lens=[kv, kv // 2 + 4], width=4, hq=hq, hkv=hkv, d=d,
                       dtype=dtype, seed=75, masks=[tree_mask(4), tree_mask(4)])]
    for fb, q, kc, vc in cases:
        outs = []
        for early in (False, True):
            be = TritonBackend(PAGE, KernelTuning(block_n=32, num_splits=splits, num_stages=1))
            monkeypatch.setattr(be, "_v_early", lambda p, bn, e=early: e)
            be.plan(fb)
            outs.append(be.forward(fb, q, kc, vc, d ** -0.5))
        assert torch.equal(outs[0], outs[1])
        check(fb, q, kc, vc, TritonBackend(PAGE, KernelTuning(block_n=32, num_splits=splits)))


@pytest.mark.parametrize("splits", [None, 3])
def test_v_early_same_bits(splits, monkeypatch) -> None:
    _v_early_same_bits(torch.float32, 64, 4, 2, 75, splits, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [None, 16])
def test_gpu_v_early_same_bits(splits, monkeypatch) -> None:
    """At the 8B heads in bf16 on the tensor cores."""
    _v_early_same_bits(BF16, 128, 32, 8, 600, splits, monkeypatch)


def test_rope_fold_applies_to_decode_and_verify_batches() -> None:
    """The fold is on by default, for decode-like batches (one row per request, no custom mask)
    and verify batches of one query tile."""
    backend = TritonBackend(PAGE)
    decode = make_case(q_lens=[1, 1], kv_lens=[3, 9], width=1, hq=4, hkv=HKV, d=16, dtype=F32)[0]
    verify = make_case(q_lens=[2, 2], kv_lens=[3, 9], width=2, hq=4, hkv=HKV, d=16, dtype=F32,
                       masks=[tree_mask(2), tree_mask(2)])[0]
    q, k = torch.zeros(4, 4, 16), torch.zeros(4, HKV, 16)
    assert backend.folds_rope(decode, q, k) and backend.folds_rope(verify, q, k)
    assert not TritonBackend(PAGE, KernelTuning(fold_rope=False)).folds_rope(decode, q, k)


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("phase", ["decode", "verify"])
def test_attention_layer_takes_the_rope_fold(monkeypatch, splits: int, phase: str) -> None:
    """models/llama.Attention.attend: with a backend that folds RoPE (the default), a decode
    batch and a verify batch skip fused_kernels.rope_store and give the layer's output and
    caches bit for bit. (The fused path runs for CUDA tensors only; here it is forced, in the
    interpreter.)"""
    from types import SimpleNamespace

    from hotspec.layers import fused
    from hotspec.layers.rotary import RotaryEmbedding
    from hotspec.models.config import ModelConfig
    from hotspec.models.llama import Attention

    cfg = ModelConfig(architecture="llama", vocab_size=64, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=HKV, head_dim=32,
                      rope_theta=10000.0, max_position_embeddings=256)
    torch.manual_seed(44)
    attn = Attention(cfg, layer_id=0)
    rope = RotaryEmbedding(32, 256, 10000.0)
    if phase == "decode":
        fb, _, kc, vc, _ = _rope_case(4, F32, seed=45, kv_lens=[3, 40], d=32)
    else:
        fb, _, kc, vc, _ = _rope_verify_case(4, F32, seed=45, kv_lens=[5, 40], n=4, d=32)
    x = torch.randn(fb.positions.shape[0], 64)
    monkeypatch.setattr(fused, "enabled", lambda *a: True)
    calls = []
    real_rope_store = fused.rope_store
    monkeypatch.setattr(fused, "rope_store", lambda *a: calls.append(1) or real_rope_store(*a))

    def run(fold: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        kv = SimpleNamespace(k=[kc.clone()], v=[vc.clone()])
        backend = TritonBackend(PAGE, KernelTuning(num_splits=splits, block_n=16, fold_rope=fold))
        backend.plan(fb)
        with torch.no_grad():
            out = attn(x, fb, rope, kv, backend)
        return out, kv.k[0], kv.v[0]

    want = run(False)
    assert calls == [1]
    got = run(True)
    assert calls == [1], "the fold skips rope_store"
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def _gpu_fold_case(shape: dict, batch: int, dtype: torch.dtype, seed: int):
    """A decode batch at real heads for the fold's GPU tests: one row per request (context 512
    at batch 1, else random lengths up to 4096), the engine's static bound 8192, the new tokens'
    K/V, RoPE tables, positions and cache slots. -> (fb, q, k_cache, v_cache, RopeFold)."""
    kv = [512] if batch == 1 else _rand_lens(batch, 1, 4096, seed=batch)
    hkv, d = shape["hkv"], shape["d"]
    fb, q, kc, vc = make_case(q_lens=[1] * batch, kv_lens=kv, width=1, hq=shape["hq"], hkv=hkv,
                              d=d, dtype=dtype, seed=seed)
    fb.max_kv = 8192
    k = torch.randn(batch, hkv, d, device=DEV).to(dtype)
    v = torch.randn(batch, hkv, d, device=DEV).to(dtype)
    ang = torch.rand(4096, d // 2, device=DEV) * 6.3
    pos = torch.tensor([n - 1 for n in kv], device=DEV)
    loc = fb.block_tables.long()[torch.arange(batch, device=DEV), pos // PAGE] * PAGE + pos % PAGE
    fb.positions, fb.out_cache_loc = pos, loc
    return fb, q, kc, vc, RopeFold(k, v, pos, loc, ang.cos(), ang.sin())


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [LLAMA8B, SMOL], ids=["llama8b", "smollm2"])
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "fp32"])
def test_gpu_rope_fold(shape, batch, dtype) -> None:
    """The RoPE fold at the real heads, automatic splits over the engine's static bound:
    rope_store + attention's caches and output, bit for bit, ten launches in a row (a race
    between the new token's store and its load would show as an occasional difference). fp32
    too: EAGLE's verify (rope_store) and vanilla decode (the fold) must agree there exactly."""
    from hotspec.layers import fused_kernels as fk

    fb, q, kc, vc, rope = _gpu_fold_case(shape, batch, dtype, seed=103)
    k, v, pos, loc, cos, sin = rope.k, rope.v, rope.positions, rope.loc, rope.cos, rope.sin
    scale = shape["d"] ** -0.5
    kc0, vc0 = kc.clone(), vc.clone()
    base = TritonBackend(PAGE, KernelTuning(fold_rope=False))
    base.plan(fb)
    q_rot = fk.rope_store(q, k, v, pos, cos, sin, kc, vc, loc)
    want = base.forward(fb, q_rot, kc, vc, scale)
    folded = TritonBackend(PAGE)
    folded.plan(fb)
    bad = []
    for i in range(10):
        kc3, vc3 = kc0.clone(), vc0.clone()
        got = folded.forward(fb, q, kc3, vc3, scale, rope=rope)
        torch.cuda.synchronize()
        k_rows = (kc3 != kc).flatten(1).any(1).nonzero().flatten().tolist()
        v_rows = (vc3 != vc).flatten(1).any(1).nonzero().flatten().tolist()
        o_rows = (got != want).flatten(1).any(1).nonzero().flatten().tolist()
        if k_rows or v_rows or o_rows:
            bad.append(f"launch {i}: K slots {k_rows[:4]} V slots {v_rows[:4]} out rows {o_rows[:4]} "
                       f"(new slots {loc.tolist()[:4]}), max |out diff| "
                       f"{(got.float() - want.float()).abs().max().item():.3g}")
    assert not bad, "; ".join(bad)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [LLAMA8B, SMOL], ids=["llama8b", "smollm2"])
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("n", [4, 16])
def test_gpu_rope_fold_verify(shape, batch, n) -> None:
    """The RoPE fold at verify, real heads, bf16, automatic splits over the engine's static
    bound: rope_store + attention's caches and output bit for bit, ten launches in a row."""
    from hotspec.layers import fused_kernels as fk

    kv = [512] if batch == 1 else _rand_lens(batch, n, 4096, seed=batch)
    fb, q, kc, vc, rope = _rope_verify_case(shape["hq"] // shape["hkv"], BF16, 104, kv, n,
                                            d=shape["d"], hkv=shape["hkv"])
    fb.max_kv = 8192
    base = TritonBackend(PAGE, KernelTuning(fold_rope=False))
    base.plan(fb)
    kc0, vc0 = kc.clone(), vc.clone()
    q_rot = fk.rope_store(q, rope.k, rope.v, rope.positions, rope.cos, rope.sin, kc, vc, rope.loc)
    want = base.forward(fb, q_rot, kc, vc, shape["d"] ** -0.5)
    folded = TritonBackend(PAGE)
    assert folded.folds_rope(fb, q, rope.k)
    folded.plan(fb)
    for i in range(10):
        kc3, vc3 = kc0.clone(), vc0.clone()
        got = folded.forward(fb, q, kc3, vc3, shape["d"] ** -0.5, rope=rope)
        assert torch.equal(kc3, kc) and torch.equal(vc3, vc), f"launch {i}: caches"
        assert torch.equal(got, want), f"launch {i}: output"


def _fold_rope(monkeypatch, fold: bool) -> None:
    """Engines built from here on fold RoPE into decode and verify attention (the default) or
    not (they then take rope_store, as every other phase)."""
    if not fold:
        monkeypatch.setattr(TritonBackend, "folds_rope", lambda self, fb, q, k: False)


def _random_weight_engine(fold: bool, monkeypatch, layers: int = 6):
    """engine_utils.random_engine (SmolLM2's shape, random bf16 weights, graphed decode at batch
    1, 2 and 4) with the RoPE fold on or off."""
    _fold_rope(monkeypatch, fold)
    return random_engine(layers=layers)


@pytest.mark.gpu
def test_gpu_rope_fold_engine_tokens_random_weights(monkeypatch) -> None:
    """The RoPE fold in the engine without a model file: SmolLM2-shaped random weights (near
    uniform logits, so any bit of difference soon changes a greedy token), three requests in a
    graphed batch of four (one padded row): the same tokens with the fold as without."""
    from hotspec.sampling_params import SamplingParams

    gen = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 49152, (n,), generator=gen).tolist() for n in (5, 70, 300)]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)

    def run(fold: bool) -> list[list[int]]:
        engine = _random_weight_engine(fold, monkeypatch)
        toks = greedy_tokens(engine, prompts, params)
        monkeypatch.undo()
        assert engine.graphs.batch_sizes == [1, 2, 4], "three requests replay the graph of four"
        return toks

    want = run(False)
    assert all(len(t) == 48 for t in want)
    assert run(True) == want


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ["EAGLE", "EAGLE3"])
def test_gpu_eagle_equals_vanilla_random_weights_fp32(tmp_path, algo) -> None:
    """Lossless without a model file: graphed EAGLE with a random head (its drafts mostly
    rejected, so every accept length occurs) gives the graphed vanilla engine's float32 greedy
    tokens, SmolLM2-shaped random weights, three requests in a batch of four."""
    from hotspec.sampling_params import SamplingParams

    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 49152, (n,), generator=gen).tolist() for n in (6, 50, 260)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)

    def run(spec: str | None) -> list[list[int]]:
        engine = random_engine(tmp_path, layers=4, dtype=F32, seed=12, algo=spec)
        toks = greedy_tokens(engine, prompts, params)
        engine.graphs.close()
        return toks

    want = run(None)
    assert all(len(t) == 40 for t in want)
    assert run(algo) == want


@pytest.mark.gpu
def test_gpu_triton_argmax_engine_tokens_random_weights(monkeypatch) -> None:
    """The Triton argmax (PDL-launched, over the bf16 logits) in the graphed engine,
    SmolLM2-shaped random weights (near-uniform logits, so a wrong pick soon shows): the same
    greedy tokens as torch.argmax in its place, three requests in a batch of 4."""
    from hotspec.layers import argmax_kernel
    from hotspec.sampling_params import SamplingParams

    def torch_rows(rows, use_pdl=False, out2=None):
        out = rows.argmax(-1)
        if out2 is not None:
            out2[: out.numel()].copy_(out)
        return out

    gen = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, 49152, (n,), generator=gen).tolist() for n in (9, 40, 200)]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)

    def run(triton_argmax: bool) -> list[list[int]]:
        if not triton_argmax:
            monkeypatch.setattr(argmax_kernel, "argmax_rows", torch_rows)
        toks = greedy_tokens(_random_weight_engine(True, monkeypatch), prompts, params)
        monkeypatch.undo()
        return toks

    want = run(False)
    assert all(len(t) == 48 for t in want)
    assert run(True) == want


@pytest.mark.gpu
@pytest.mark.parametrize("algo", [None, "EAGLE3"], ids=["vanilla", "eagle3"])
def test_gpu_engine_tokens_equal_with_and_without_the_rope_fold(monkeypatch, algo) -> None:
    """The RoPE fold on the default model: the engine's bf16 greedy tokens under strict CUDA
    graphs are those without the fold, vanilla and with the shipped EAGLE-3 head (its draft steps
    of one row take the fold too). The speculative engine runs one pinned shape: the adaptive
    default picks its shapes from timings, and two bf16 runs of different shapes may part at a
    near-tie of the target's logits."""
    from hotspec import LLM, SamplingParams

    prompts = ["The capital of France is", "def quicksort(arr):", "List three colours:"]
    params = SamplingParams(temperature=0, max_tokens=24)

    def run(fold: bool) -> list[list[int]]:
        _fold_rope(monkeypatch, fold)
        llm = LLM(dtype="bfloat16", device="cuda", kv_cache_memory_gb=0.5, max_num_seqs=3,
                  cuda_graph_max_bs=4, **({"speculative_algorithm": algo, "speculative_num_steps": 3,
                                           "speculative_eagle_topk": 1,
                                           "speculative_num_draft_tokens": 4} if algo else {}))
        toks = [o.token_ids for o in llm.generate(prompts, params)]
        monkeypatch.undo()
        return toks

    assert run(True) == run(False)
