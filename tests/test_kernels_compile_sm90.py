"""The Triton kernels of the speculative step compile to sm_90 machine code (the H200) on a
machine without a GPU: Triton's ahead-of-time compile with the ptxas its wheel carries. The
interpreter (the other CPU tests) checks what they compute; this checks that the compiler takes
them (types of both branches of an `if`, stores of the right width, shared memory within the
H200's 227 KB), so such an error fails here and not at the first GPU start-up."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

SMEM = 227 * 1024


def test_kernels_compile_for_the_h200():
    """Run this file's checks in a process of its own: the other CPU tests set TRITON_INTERPRET,
    under which @triton.jit makes interpreted functions, which do not compile."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    assert res.stdout.count("compiled") == len(CHECKS), res.stdout


def _compile(fn, types: dict[str, str], consts: dict[str, object],
             options: dict[str, object] | None = None):
    """Compile `fn` for sm_90: `types` the runtime arguments' Triton types, `consts` every
    constexpr the launch passes (the rest keep their defaults), `options` the launch's compile
    options (the deterministic mode's enable_fp_fusion=False)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(fn.arg_names)
    const_names = {n for n, p in zip(names, fn.params) if p.is_constexpr}
    sig = {n: types.get(n, "constexpr") if n not in const_names else "constexpr" for n in names}
    assert all(n in types for n in names if n not in const_names), "a runtime argument lacks a type"
    src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    assert kernel.asm.get("cubin"), f"{fn.__name__}: no sm_90 code"
    assert kernel.metadata.shared <= SMEM
    return kernel


def phase_inputs_kernels():
    from hotspec.speculative import phase_inputs_kernel as pik

    i64 = "*i64"
    _compile(pik._draft_inputs_kernel, dict(BT="*i32", SEQ=i64, LOCS=i64, POS=i64, MASK="*i1", QL=i64,
                                            KVL=i64, B="i32", n_blocks="i32", stride_bt="i32"),
             dict(K=8, M=40, M_PAD=64, K_PAD=8, PAGE=16))
    _compile(pik._verify_inputs_kernel, dict(BT="*i32", SEQ=i64, DEPTH=i64, SLOTS=i64, POS=i64,
                                             LOC=i64, QL=i64, KVL=i64, n_blocks="i32",
                                             stride_bt="i32", stride_db="i32"),
             dict(N=12, R=12, R_PAD=16, PAGE=16))
    for has_slots in (True, False):
        _compile(pik._extend_inputs_kernel,
                 dict(BT="*i32", SEQ=i64, ACC=i64, BONUS=i64, A=i64, SLOTS=i64, IDS=i64, LOC=i64,
                      POS=i64, LAST=i64, KVL=i64, trash="i32", n_blocks="i32", stride_bt="i32",
                      stride_ab="i32", stride_sb="i32"),
                 dict(W=7, W_PAD=16, HAS_SLOTS=has_slots, PAGE=16))


def eagle3_input_kernel():
    from hotspec.layers import norm_pair_kernel as npk

    bf = "*bf16"
    _compile(npk._embed_norm_pair_kernel,
             dict(IDS="*i64", EMB=bf, FEAT=bf, W0=bf, W1=bf, OUT=bf, h="i32", eps0="fp32", eps1="fp32",
                  stride_e="i32", stride_f="i32", stride_o="i32"), dict(BLOCK=4096))


def rows_kernel():
    """At the engine's configs of the 8B and SmolLM2 shapes, with and without glu; the
    deterministic mode's (split-K for the 8B's o and down, a bias, 16- and 32-row tiles)."""
    from hotspec.layers import rows_kernel as rk

    bf = "*bf16"
    types = dict(X=bf, W=bf, Y=bf, B=bf, WS="*fp32", CNT="*i32", M="i32", N="i32", K="i32",
                 K_SPLIT="i32", stride_xm="i32", stride_wn="i32", stride_ym="i32")
    for n, k, glu in [(6144, 4096, False), (14336, 4096, True), (960, 576, False), (1536, 576, True)]:
        cfg = rk.choose(n, k, glu)
        _compile(rk._rows_kernel, types, dict(
            GLU=glu, BLOCK_M=rk.MAX_ROWS, BLOCK_N=cfg.BLOCK_N,
            BLOCK_K=cfg.BLOCK_K, EVEN_K=k % cfg.BLOCK_K == 0, F32_DOT=False, HAS_BIAS=False,
            SPLIT_K=1, PDL=True, PF_COLS=-1), dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    # the deterministic mode's heights: the same MMA instruction at each (a row's bits alike)
    for n, k, glu, bias in [(4096, 14336, False, False), (4096, 4096, False, True),
                            (14336, 4096, True, False), (960, 576, False, False)]:
        cfg = rk.deterministic_config(n, k, glu)
        for block_m in rk.TILE_HEIGHTS:
            ptx = _compile(rk._rows_kernel, types, dict(
                GLU=glu, BLOCK_M=block_m, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, EVEN_K=False,
                F32_DOT=False, HAS_BIAS=bias, SPLIT_K=cfg.SPLIT_K, PDL=True, PF_COLS=-1),
                dict(num_warps=cfg.num_warps,
                     num_stages=rk.tile_stages(cfg, block_m, glu))).asm["ptx"]
            assert "mma.sync.aligned.m16n8k16" in ptx and "wgmma" not in ptx, (n, k, block_m)


def attention_with_the_rope_fold():
    """Decode's and verify's RoPE fold; verify's rows (custom mask) and draft_extend's (causal)
    without it; the deterministic mode's decode (the fold) and verify (TREE_SEQ), one query row a program,
    split into fixed chunks, its prefill (the chunks merged in the program), and its combine,
    without FMA contraction."""
    for rope, custom in [(True, False), (True, True), (False, True), (False, False)]:
        _attention(rope, custom)
    for rope, custom in [(True, False), (False, True)]:
        _attention(rope, custom, deterministic=True)
    _attention(False, False, deterministic=True, ragged=True)
    from hotspec.layers.attention import merge_kernels as mk

    _compile(mk.combine_splits_seq, dict(OPART="*fp32", LSE="*fp32", OUT="*bf16", stride_ps="i32",
                                         stride_ls="i32", num_splits="i32"),
             dict(stride_pt=576, stride_ph=64, stride_lt=9, stride_ot=576, stride_oh=64,
                  HEAD_DIM=64, BLOCK_S=128, BLOCK_D=64, GROUP_S=8, PDL=True, PDL_WAIT=True),
             {"enable_fp_fusion": False, "num_warps": 1})


def _attention(rope: bool, custom: bool, deterministic: bool = False, ragged: bool = False
               ) -> None:
    from hotspec.layers.attention import triton_kernels as ak

    fn = ak.paged_attn_fwd
    ptr = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "OUT": "*bf16", "BT": "*i32", "KVL": "*i64",
           "QL": "*i64", "CUQ": "*i64", "CM": "*i64", "OPART": "*fp32", "LSE": "*fp32", "KN": "*bf16",
           "VN": "*bf16", "POS": "*i64", "LOC": "*i64", "COS": "*fp32", "SIN": "*fp32"}
    const_names = {n for n, p in zip(fn.arg_names, fn.params) if p.is_constexpr}
    types = {n: ptr.get(n, "fp32" if n == "scale_log2" else "i32")
             for n in fn.arg_names if n not in const_names}
    tiles = dict(GROUP_PAD=4, BLOCK_Q=16, BLOCK_M=64, BLOCK_N=32, SPLIT=True, MIN_CHUNK=32,
                 DET_CHUNK=0)
    if deterministic:  # (triton_backend's deterministic tuning)
        tiles = dict(GROUP_PAD=16, BLOCK_Q=1, BLOCK_M=16, BLOCK_N=64, SPLIT=True, TREE_SEQ=custom,
                     MIN_CHUNK=0, DET_CHUNK=128)
    if ragged:
        tiles.update(GROUP_PAD=4, BLOCK_Q=4, SPLIT=False)
    kernel = _compile(fn, types, dict(  # SmolLM2's heads: 9 query heads over 3 kv heads of 64
        stride_qt=1152, stride_qh=64, stride_kt=192, stride_kh=64, stride_vt=192, stride_vh=64,
        stride_ot=576, stride_oh=64, stride_pt=576, stride_ph=64, stride_lt=9, GROUP=3,
        BLOCK_D=64, HEAD_DIM=64, PAGE=16, RAGGED=ragged, CUSTOM=custom, F32_DOT=False,
        MASK_BITS=custom, PDL=True, PDL_WAIT=True, ROPE=rope, stride_knt=192, stride_knh=64,
        stride_vnt=192, stride_vnh=64, stride_cs=32, **tiles),
        {"enable_fp_fusion": False} if deterministic else None)
    if deterministic:  # every phase's rows through the same MMA instruction (a row's bits alike)
        ptx = kernel.asm["ptx"]
        assert "mma.sync.aligned.m16n8k16" in ptx and "wgmma" not in ptx, (rope, custom, ragged)


def soft_ce_kernels():
    """The trainer's fused soft cross-entropy, on bf16 logits at the shipped block sizes."""
    from hotspec.training import ce_kernels as ck

    _compile(ck._rows_kernel, dict(ZD="*bf16", ZT="*bf16", LOSS="*fp32", LSE_D="*fp32",
                                   LSE_T="*fp32", HIT="*i1", n="i32", stride_d="i32",
                                   stride_t="i32"), dict(BLOCK=ck.ROW_BLOCK))
    _compile(ck._grad_kernel, dict(ZD="*bf16", ZT="*bf16", LSE_D="*fp32", LSE_T="*fp32",
                                   SCALE="*fp32", n_rows="i32", n_cols="i32", stride_d="i32",
                                   stride_t="i32"), dict(TILE_R=ck.TILE_R, TILE_C=ck.TILE_C))


def row_gemvs():
    """The one-row GEMV and norm-GEMV at SmolLM2's configs, PDL and the preload on, with rows
    side by side (ROWS a runtime argument: gemv(per_row=True), the norm-GEMV of a few rows)."""
    from hotspec.layers import gemv_kernels as gk
    from hotspec.layers import norm_gemv_kernel as ng

    bf = "*bf16"
    for silu, pipe in ((False, 2), (True, 1)):
        _compile(gk._gemv_kernel, dict(X=bf, W=bf, Y=bf, WS="*fp32", CNT="*i32", M="i32", N="i32",
                                       K="i32", K_SPLIT="i32", stride_xm="i32", stride_wn="i32",
                                       stride_ym="i32", ROWS="i32", B=bf),
                 dict(HAS_BIAS=not silu, SILU=silu, BLOCK_M=1, BLOCK_N=8, BLOCK_K=512, SPLIT_K=1,
                      EVEN_K=False, F32_DOT=False, PDL=True, PF_COLS=-1, PRELOAD=True, PIPE=pipe))
    for res in (True, False):
        _compile(ng._norm_gemv_kernel, dict(X=bf, R=bf, G=bf, W=bf, Y=bf, S=bf, N="i32", K="i32",
                                            eps="fp32", stride_wn="i32", stride_xm="i32",
                                            stride_rm="i32", stride_sm="i32", stride_ym="i32",
                                            ROWS="i32", B=bf),
                 dict(HAS_BIAS=res, HAS_RES=res, BLOCK_N=8, BLOCK_K=512, BLOCK_ROW=1024, PDL=True, PF_COLS=-1,
                      PRELOAD=True, PIPE=2))


CHECKS = [phase_inputs_kernels, eagle3_input_kernel, rows_kernel, row_gemvs,
          attention_with_the_rope_fold, soft_ce_kernels]

if __name__ == "__main__":
    for check in CHECKS:
        check()
        print(check.__name__, "compiled", flush=True)
