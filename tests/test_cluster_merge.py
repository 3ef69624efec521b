"""The cluster merge (HOTSPEC_ATTN_CLUSTER): decode attention whose kv splits run as one
thread-block cluster and merge their partials after the cluster's barrier (layers/cluster.py,
layers/attention/triton_kernels.py CLUSTER), instead of in a second kernel.

On the CPU: the launch rule, `cluster.launch`'s checks and its launch, and the kernel compiled for
sm_90 (the barrier between the partials' stores and the merge's loads, in the PTX). On the GPU
(`gpu`): the bits of the combine kernel's path at real heads, in eager launches and graph
replays, and the engine's greedy tokens."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from test_triton_attention import (  # noqa: E402
    BF16,
    F32,
    LLAMA8B,
    PAGE,
    SMOL,
    TritonBackend,
    _gpu_fold_case,
    _random_weight_engine,
    make_case,
    tree_mask,
    triton_backend,
)

from hotspec.layers import cluster  # noqa: E402


def test_cluster_switch(monkeypatch) -> None:
    monkeypatch.delenv("HOTSPEC_ATTN_CLUSTER", raising=False)
    assert not triton_backend._cluster_switch()
    monkeypatch.setenv("HOTSPEC_ATTN_CLUSTER", "1")
    assert triton_backend._cluster_switch()
    monkeypatch.setenv("HOTSPEC_ATTN_CLUSTER", "on")
    with pytest.raises(ValueError, match=r"HOTSPEC_ATTN_CLUSTER='on': use 0 \(the default\) or 1"):
        triton_backend._cluster_switch()


def test_cluster_rule(monkeypatch) -> None:
    """Decode batches (one row, no custom mask, one query block) with splits on Hopper: 16 CTAs
    from 16 splits up, else at most 8 (the portable limit); nothing elsewhere."""
    dec = make_case(q_lens=[1], kv_lens=[40], width=1, hq=4, hkv=2, d=16, dtype=F32, seed=1)[0]
    ver = make_case(q_lens=[2], kv_lens=[40], width=2, hq=4, hkv=2, d=16, dtype=F32, seed=2,
                    masks=[tree_mask(2)])[0]
    be = TritonBackend(PAGE)
    be.plan(dec)
    be.plan(ver)
    be.cluster = True
    monkeypatch.setattr(be, "_interp", False)
    cap = [(9, 0)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: cap[0])
    gpu, p = torch.device("cuda", 0), dec.attn_meta
    assert [be._cluster(p, s, 1, gpu) for s in (1, 2, 5, 8, 12, 15, 16, 33, 64)] == \
        [0, 2, 5, 8, 8, 8, 16, 16, 16]
    assert be._cluster(p, 33, 2, gpu) == 0  # several query blocks
    assert be._cluster(ver.attn_meta, 33, 1, gpu) == 0  # verify: a custom mask, two rows
    assert be._cluster(p, 33, 1, torch.device("cpu")) == 0
    cap[0] = (8, 0)
    assert be._cluster(p, 33, 1, gpu) == 0  # no clusters before Hopper
    cap[0] = (9, 0)
    be.cluster = False
    assert be._cluster(p, 33, 1, gpu) == 0


class _FakeKernel:
    """A jit function's stand-in: `warmup` returns its compiled kernel, `fn[grid](...)` records."""

    def __init__(self, meta: object, scratch: int = 0) -> None:
        self.kernel = SimpleNamespace(packed_metadata=meta,
                                      metadata=SimpleNamespace(global_scratch_size=scratch))
        self.warmed: list[tuple] = []
        self.launched: list[tuple] = []

    def warmup(self, *args, grid, **kwargs):
        self.warmed.append((grid, args, kwargs))
        return self.kernel

    def __getitem__(self, grid):
        return lambda *a, **k: self.launched.append((grid, a, k, self.kernel.packed_metadata))


def test_cluster_launch_sets_the_cluster_size_then_launches() -> None:
    fn = _FakeKernel((4, 1, 20480))
    cluster.launch(fn, (32, 3, 8), 16, "a", 7, X=1)
    assert fn.warmed == [((32, 3, 8), ("a", 7), {"X": 1})]
    # Triton's launcher multiplies x by the metadata's num_ctas: 2 clusters of 16 along x
    assert fn.launched == [((2, 3, 8), ("a", 7), {"X": 1}, (4, 16, 20480))]
    cluster.launch(fn, (16, 1, 1), 16)  # already set: launched again, unchanged
    assert fn.launched[-1][3] == (4, 16, 20480)


@pytest.mark.parametrize("ctas,grid", [(1, (16, 1, 1)), (9, (18, 1, 1)), (32, (32, 1, 1)),
                                       (16, (24, 1, 1))])
def test_cluster_launch_rejects_sizes_it_cannot_launch(ctas, grid) -> None:
    fn = _FakeKernel((4, 1, 0))
    with pytest.raises(ValueError, match="use 2 to 8 or 16 CTAs that divide it"):
        cluster.launch(fn, grid, ctas)
    assert not fn.warmed and not fn.launched


@pytest.mark.parametrize("meta,scratch", [((4, 2, 0), 0), ((4, 1, 0, 5), 0), (None, 0),
                                          ((4, 1, 0), 64)])
def test_cluster_launch_refuses_metadata_it_does_not_know(meta, scratch) -> None:
    """Never a launch without clusters: a Triton whose kernels do not carry (num_warps,
    num_ctas, shared), or that needs global scratch sized per CTA, is an error naming the
    switch that turns the path off."""
    fn = _FakeKernel(meta, scratch)
    with pytest.raises(RuntimeError, match="HOTSPEC_ATTN_CLUSTER=0"):
        cluster.launch(fn, (16, 1, 1), 16)
    assert not fn.launched


_COMPILE = textwrap.dedent("""
    import re, json
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from hotspec.layers.attention.triton_kernels import paged_attn_fwd as fn
    ptrs = dict(Q="*bf16", K="*bf16", V="*bf16", OUT="*bf16", BT="*i32", KVL="*i64", QL="*i64",
                CUQ="*i64", CM="*i64", OPART="*fp32", LSE="*fp32", KN="*bf16", VN="*bf16",
                POS="*i64", LOC="*i64", COS="*fp32", SIN="*fp32")
    const = dict(GROUP=4, GROUP_PAD=4, BLOCK_Q=1, BLOCK_M=16, BLOCK_N=32, BLOCK_D=128,
                 HEAD_DIM=128, PAGE=16, RAGGED=False, CUSTOM=False, SPLIT=True, F32_DOT=False,
                 MASK_BITS=False, PDL=True, PDL_WAIT=False, ROPE=True, V_EARLY=True, CLUSTER=16,
                 MERGE_S=16)
    sig = {n: "constexpr" if n in const else ptrs.get(n, "fp32" if n == "scale_log2" else "i32")
           for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n in ptrs}
    k = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4, "num_stages": 1})
    print(json.dumps({"ptx": k.asm["ptx"], "num_ctas": k.metadata.num_ctas}))
""")


def test_cluster_kernel_compiles_for_sm90_with_the_barrier_between_stores_and_merge() -> None:
    """The 8B decode kernel with CLUSTER=16, compiled for sm_90 on the CPU (Triton's own ptxas):
    compiled for one CTA (the cluster comes from the launch), and in its PTX every store of the
    partials comes before the cluster barrier's arrive (release), the wait (acquire) follows it,
    and the merge's loads (past L1) come after."""
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["num_ctas"] == 1
    lines = [ln.strip() for ln in out["ptx"].splitlines()]
    arrive = [i for i, ln in enumerate(lines) if ln.startswith("barrier.cluster.arrive.release")]
    wait = [i for i, ln in enumerate(lines) if ln.startswith("barrier.cluster.wait.acquire")]
    stores = [i for i, ln in enumerate(lines) if "st.global.b32" in ln]  # fp32 partials and lse
    merged = [i for i, ln in enumerate(lines) if "ld.global.cg" in ln]
    assert len(arrive) == 1 and len(wait) == 1 and arrive[0] < wait[0]
    assert stores and max(stores) < arrive[0]
    assert merged and min(merged) > wait[0]


# ------------------------------------------------------------------------------------ GPU cases


def _cluster_pair(splits: int | None):
    """(combine-kernel backend, cluster backend): the same split count, the fold on."""
    base = TritonBackend(PAGE, num_splits=splits, fold_rope=True)
    clus = TritonBackend(PAGE, num_splits=splits, fold_rope=True)
    clus.cluster = True
    return base, clus


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [LLAMA8B, SMOL], ids=["llama8b", "smollm2"])
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("splits", [16, 5])
def test_gpu_cluster_merge_same_bits(shape, batch, dtype, splits, monkeypatch) -> None:
    """At the real heads (context 512 at batch 1, random lengths up to 4096 else, short ones
    leaving most splits empty included): the cluster merge's output and caches equal the combine
    kernel's bit for bit, ten launches in a row (a missing barrier would show as an occasional
    difference), and the cluster path did run."""
    fb, q, kc, vc, rope = _gpu_fold_case(shape, batch, dtype, seed=211)
    if batch == 3:
        fb.kv_lens[0] = 3  # most of its splits see nothing
    scale = shape["d"] ** -0.5
    base, clus = _cluster_pair(splits)
    base.plan(fb)
    kc0, vc0 = kc.clone(), vc.clone()
    want = base.forward(fb, q, kc, vc, scale, rope=rope)
    launches = []
    real = cluster.launch
    monkeypatch.setattr(cluster, "launch", lambda fn, grid, ctas, *a, **k:
                        launches.append(ctas) or real(fn, grid, ctas, *a, **k))
    clus.plan(fb)
    bad = []
    for i in range(10):
        kc2, vc2 = kc0.clone(), vc0.clone()
        got = clus.forward(fb, q, kc2, vc2, scale, rope=rope)
        torch.cuda.synchronize()
        rows = (got != want).flatten(1).any(1).nonzero().flatten().tolist()
        if rows or not torch.equal(kc2, kc) or not torch.equal(vc2, vc):
            bad.append(f"launch {i}: rows {rows[:4]}, max |diff| "
                       f"{(got.float() - want.float()).abs().max().item():.3g}")
    assert launches == [splits] * 10
    assert not bad, "; ".join(bad)


@pytest.mark.gpu
def test_gpu_cluster_merge_in_a_graph() -> None:
    """Captured once, replayed 20 times with the lengths changed between replays (each at most its
    request's own, whose blocks the table holds): each replay equals the combine kernel's output
    for those lengths, bit for bit."""
    fb, q, kc, vc, _ = _gpu_fold_case(LLAMA8B, 3, BF16, seed=212)
    scale = LLAMA8B["d"] ** -0.5
    base, clus = _cluster_pair(None)
    base.plan(fb)
    clus.plan(fb)
    out = torch.empty_like(q)
    clus.forward(fb, q, kc, vc, scale, out=out)  # warm up: compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        clus.forward(fb, q, kc, vc, scale, out=out)
    gen = torch.Generator().manual_seed(5)
    most = fb.kv_lens.cpu()
    for i in range(20):
        new = (torch.rand(3, generator=gen) * most).long() + 1
        fb.kv_lens.copy_(new.to(fb.kv_lens))
        graph.replay()
        want = base.forward(fb, q, kc, vc, scale)
        torch.cuda.synchronize()
        assert torch.equal(out, want), f"replay {i}, kv lengths {new.tolist()}"


@pytest.mark.gpu
def test_gpu_cluster_merge_engine_tokens_random_weights(monkeypatch) -> None:
    """HOTSPEC_ATTN_CLUSTER in the graphed engine (SmolLM2-shaped random weights, near uniform
    logits): the same greedy tokens as the combine kernel's."""
    from engine_utils import greedy_tokens

    from hotspec.sampling_params import SamplingParams

    gen = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, 49152, (n,), generator=gen).tolist() for n in (5, 70, 300)]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)

    def run(on: bool) -> list[list[int]]:
        monkeypatch.setattr(triton_backend, "_CLUSTER", on)
        return greedy_tokens(_random_weight_engine(True, monkeypatch), prompts, params)

    want = run(False)
    assert run(True) == want
