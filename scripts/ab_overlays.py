"""Write A/B overlays for `bash scripts/gpu_job.sh overlays`: ab_variants/NAME/ holds copies of
the engine files a recipe changes, each with one exact text replacement applied.

    python scripts/ab_overlays.py ko_attn ko_comb pdl_attn     # named recipes
    python scripts/ab_overlays.py --list

The overlays stage runs the decode benchmark with each ab_variants/NAME over a copy of hotspec/,
so one device call compares several kernel variants against the default code. Knockouts (ko_*,
kb_*) compute wrong results on purpose: they only time what the step costs without a piece of
work (RESULTS "Session 15"). A recipe whose text is no longer in the source stops with its name,
so a stale recipe never runs the default code under a variant's name.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ATTN = "hotspec/layers/attention/"
KERNELS, BACKEND, MERGE = ATTN + "triton_kernels.py", ATTN + "triton_backend.py", ATTN + "merge_kernels.py"

_LAUNCHED = "    pdl.launch_dependents(PDL)  # the kernel after it (o_proj's GEMV) may launch now\n"
_ATTN_RETURN = (KERNELS, _LAUNCHED + "    pid0 = tl.program_id(0)",
                _LAUNCHED + "    if num_splits > -1:  # KNOCKOUT: attention does nothing\n"
                "        return\n    pid0 = tl.program_id(0)")
_COMB_WAIT = "    pdl.wait(PDL_WAIT)  # PDL-launched itself (pdl.chained): nothing is read before this\n"
_COMB_RETURN = (MERGE, _COMB_WAIT, _COMB_WAIT + "    if num_splits > -1:  # KNOCKOUT: the combine does "
                "nothing\n        return\n")
_PDL_ATTN = (BACKEND, "        use_pdl, pdl_wait = pdl.enabled(q.device), pdl.chained(q.device, t, "
             "before_resident)\n        launch = pdl.launch_kwargs(q.device, t, before_resident)",
             "        use_pdl = pdl.enabled(q.device)\n        pdl_wait = use_pdl  # VARIANT\n"
             "        launch = {\"launch_pdl\": True} if use_pdl else {}")
_WARPS = "        num_warps = self.num_warps or 4"
_ST2 = (BACKEND, "        return 1 if p.width == 1 and p.custom_mask is None else 2",
        "        return 2  # VARIANT: decode at two stages (the rule before session 17)")
_LLAMA = "hotspec/models/llama.py"
GK = "hotspec/layers/gemv_kernels.py"
NG = "hotspec/layers/norm_gemv_kernel.py"


def _between(rel: str, start: str, end: str) -> str:
    """The text of `rel` from `start` through the end of the line that begins with `end` (a
    recipe's old text too long to spell out); a marker missing gives a text no file holds, so
    the recipe stops as stale."""
    text = (ROOT / rel).read_text()
    i = text.find(start)
    j = text.find(end, i + 1)
    if i < 0 or j < 0:
        return "\0missing markers\0"
    return text[i:text.index("\n", j) + 1]


_NG_BODY = _between(NG, "    pdl.wait(PDL)\n    inv = row_rms(", "    tl.store(Y + offs_n")
_NG_DEFER = """    pdl.wait(PDL)
    offs_k = tl.arange(0, BLOCK_K)[None, :]  # VARIANT norm_defer
    n_ok = offs_n < N
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    sq = tl.zeros((1, BLOCK_K), dtype=tl.float32)
    k_start = 0
    if PRELOAD:
        k_ok = offs_k < K
        s = stream(X + offs_k, R + offs_k, k_ok, HAS_RES)
        if HAS_RES:
            tl.store(S + offs_k, s, mask=k_ok & (pid == 0))
        sf = s.to(tl.float32)
        sq += sf * sf
        g = tl.load(G + offs_k, mask=k_ok, other=0.0).to(tl.float32)
        acc += w0.to(tl.float32) * (g * sf)
        k_start = BLOCK_K
    for k in range(k_start, K, BLOCK_K):
        kk = k + offs_k
        k_ok = kk < K
        w = tl.load(W + offs_n[:, None] * stride_wn + kk, mask=n_ok[:, None] & k_ok, other=0.0,
                    eviction_policy="evict_first")
        s = stream(X + kk, R + kk, k_ok, HAS_RES)
        if HAS_RES:
            tl.store(S + kk, s, mask=k_ok & (pid == 0))
        sf = s.to(tl.float32)
        sq += sf * sf
        g = tl.load(G + kk, mask=k_ok, other=0.0).to(tl.float32)
        acc += w.to(tl.float32) * (g * sf)
    inv = tl.rsqrt(tl.sum(sq, axis=1) / K + eps)
    tl.store(Y + offs_n, (tl.sum(acc, axis=1) * inv).to(Y.dtype.element_ty), mask=n_ok)
"""
_FORWARD = "        o = backend.forward(fb, q, k_cache, v_cache, self.scale, rope=fold,\n"
_TAIL = "    stride_vnh: tl.constexpr = 0, stride_cs: tl.constexpr = 0,\n"
_KERNEL_TAIL = (KERNELS, _TAIL + "):", _TAIL + "    PF=None, PF_N=0, PF_AT: tl.constexpr = 0,\n):")
_PREFETCH = ("    tl.inline_asm_elementwise(\"prefetch.global.L2 [$1]; // $0\", \"=r,l\", [{ptr}],\n"
             "                              dtype=tl.int32, is_pure=False, pack=1)\n")
# o_proj's weight prefetched into L2 by the attention programs after their kv loop, each its share
# of the 128-byte lines (session 17: 4.00 against 3.95 ms; the attention 2.3 us longer, o_proj's
# time after the combine only 0.7 us shorter)
_PF_OPROJ_FN = (KERNELS, "\n\n@triton.jit\ndef paged_attn_fwd(",
                "\n\n@triton.jit\ndef _pf_lines(PF, n_lines):  # VARIANT\n"
                "    n0 = tl.num_programs(0)\n    n1 = tl.num_programs(1)\n"
                "    pid = tl.program_id(0) + n0 * (tl.program_id(1) + n1 * tl.program_id(2))\n"
                "    per = tl.cdiv(n_lines, n0 * n1 * tl.num_programs(2))\n"
                "    lo = pid * per\n    hi = tl.minimum(lo + per, n_lines)\n"
                "    for s in range(lo, hi, 256):\n"
                "        line = tl.minimum(s + tl.arange(0, 256), hi - 1).to(tl.int64)\n"
                "    " + _PREFETCH.format(ptr="PF + line * 64").replace("\n    ", "\n        ") +
                "\n\n@triton.jit\ndef paged_attn_fwd(")
_ATTN_WAIT = "    pdl.wait(PDL_WAIT)  # PDL-launched itself (pdl.chained): nothing is read before this\n"
_PREFETCH_KV = """

@triton.jit
def _prefetch_kv(K, V, BT, KVL, b, h, sp, num_splits, stride_bt, stride_kt, stride_kh, stride_vt,
                 stride_vh, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr):
    kv_len = tl.load(KVL + b).to(tl.int32)  # VARIANT attn_early: hints only, before the wait
    chunk = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    lo = sp * chunk
    hi = tl.minimum(lo + chunk, kv_len)
    lines: tl.constexpr = HEAD_DIM * 2 // 128
    n = tl.arange(0, BLOCK_N)
    c = tl.arange(0, lines) * 64
    for start in range(lo, hi, BLOCK_N):
        offs = tl.minimum(start + n, hi - 1)
        blk = tl.load(BT + b.to(tl.int64) * stride_bt + offs // PAGE).to(tl.int64)
        slot = blk * PAGE + offs % PAGE
        kp = K + slot[:, None] * stride_kt + h * stride_kh + c[None, :]
        vp = V + slot[:, None] * stride_vt + h * stride_vh + c[None, :]
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [kp], dtype=tl.int32,
                                  is_pure=False, pack=1)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [vp], dtype=tl.int32,
                                  is_pure=False, pack=1)"""
# the next layer's K/V lines of the program's kv range prefetched into L2 after the loop (session
# 17: 3.89 against 3.89 ms)
_KV_NEXT_FN = (KERNELS, "\n\n@triton.jit\ndef paged_attn_fwd(",
               "\n\n@triton.jit\ndef _pf_next(k_base, v_base, bt_row, lo, hi, nxt, stride_kt, stride_vt,"
               "\n             PAGE: tl.constexpr, BLOCK_N: tl.constexpr):  # VARIANT\n"
               "    n = tl.arange(0, BLOCK_N)\n    half = tl.arange(0, 2) * 64\n"
               "    for start in range(lo, hi, BLOCK_N):\n        offs = start + n\n"
               "        ok = offs < hi\n"
               "        blk = tl.load(bt_row + offs // PAGE, mask=ok, other=0).to(tl.int64)\n"
               "        slot = tl.where(ok, blk * PAGE + (offs % PAGE), 0)[:, None]\n"
               "    " + _PREFETCH.format(ptr="k_base + nxt + slot * stride_kt + half[None, :]")
               .replace("\n    ", "\n        ") +
               "    " + _PREFETCH.format(ptr="v_base + nxt + slot * stride_vt + half[None, :]")
               .replace("\n    ", "\n        ") +
               "\n\n@triton.jit\ndef paged_attn_fwd(")
# the first MB megabytes of gate_up's weight prefetched into L2 by the attention programs after
# their kv loop (HBM is idle during attention and the combine; gate_up, unlike o_proj, is bound
# by HBM), with L2::evict_last in the `el` variants so that o_proj's stream does not evict them
# (session 18: 16 MB 3.97, 16 MB el 3.97, 32 MB 3.98, 32 MB el 4.05 against 3.95 ms; L2 hits do
# not make gate_up faster)
_ATTEND = "            x = attn.attend(*attn.split_qkv(qkv), fb, rope, kv, backend)\n"


def _pf_gu(mb: int, evict_last: bool) -> list[tuple[str, str, str]]:
    fn = _PF_OPROJ_FN
    if evict_last:
        fn = (fn[0], fn[1], fn[2].replace("prefetch.global.L2 [$1]", "prefetch.global.L2::evict_last [$1]"))
    return [fn, _KERNEL_TAIL,
            (KERNELS, _AFTER_LOOP, "    if PF_AT == 2:\n        _pf_lines(PF, PF_N)\n" + _AFTER_LOOP),
            (BACKEND, _ROPE_KW, "            **_rope_kwargs(rope, k_cache), **({'PF': self._pf, "
             "'PF_N': self._pf.numel() // 64, 'PF_AT': 2} if p.width == 1 else {}),\n"),
            ("hotspec/models/llama.py", _ATTEND,
             f"            backend._pf = mlp.gate_up_proj.weight.view(-1)[:{mb} << 19]  # VARIANT\n"
             + _ATTEND)]


_AFTER_LOOP = "    l_safe = tl.where(l_i == 0.0, 1.0, l_i)\n"
_ROPE_KW = "            **_rope_kwargs(rope, k_cache),\n"

# gate_up's first MB megabytes prefetched into L2 by the split combine (which reads only L2, so
# the prefetch does not queue ahead of the attention's K/V misses), at its start or its end
# (session 18: 8 MB 3.97, at the end 3.94; 16 MB 3.99, at the end 3.96; against 3.95 ms)
_COMB_SIG = "    PDL_WAIT: tl.constexpr = False,\n):"
_COMB_STORE = ("    tl.store(OUT + t * stride_ot + hq * stride_oh + d, out.to(OUT.dtype.element_ty), "
               "mask=d_ok)\n")
_COMB_LAUNCH = "                num_warps=4, **({\"launch_pdl\": True} if comb_wait else {}),\n"


def _pf_gu_comb(mb: int, at_end: bool) -> list[tuple[str, str, str]]:
    fn = _PF_OPROJ_FN[2].replace("def paged_attn_fwd(", "def combine_splits(")
    call = "    if PF_ON:\n        _pf_lines(PF, PF_N)\n"
    place = ((MERGE, _COMB_STORE, _COMB_STORE + call) if at_end else
             (MERGE, _COMB_WAIT, _COMB_WAIT + call))
    return [(MERGE, "\n\n@triton.jit\ndef combine_splits(", fn),
            (MERGE, _COMB_SIG, "    PDL_WAIT: tl.constexpr = False, PF=None, PF_N=0,\n"
             "    PF_ON: tl.constexpr = False,\n):"),
            place,
            (BACKEND, _COMB_LAUNCH, _COMB_LAUNCH + "                **({'PF': self._pf, 'PF_N': "
             "self._pf.numel() // 64, 'PF_ON': True} if p.width == 1 else {}),  # VARIANT\n"),
            ("hotspec/models/llama.py", _ATTEND,
             f"            backend._pf = mlp.gate_up_proj.weight.view(-1)[:{mb} << 19]  # VARIANT\n"
             + _ATTEND)]


_KO_O_W = [(GK, "        acc = _row_pipelined(acc, w0, w_ptr, x_ptr, n_ok, offs_k,",
            "        # KNOCKOUT: o_proj (N == K) reads no weight\n"
            "        acc = _row_pipelined(acc, w0, w_ptr, x_ptr, n_ok & (N != K), offs_k,"),
           (GK, "    w0 = pdl.preload(W, offs_n, N, k_lo,",
            "    w0 = pdl.preload(W, offs_n, N * (N != K), k_lo,  # KNOCKOUT\n                     ")]


_O_ROW = "(1, 4096, 4096, False): GemvConfig(4, 4096, 1, 4, 1, PIPE=0),"
_O_PIPE2 = (GK, _O_ROW, "(1, 4096, 4096, False): GemvConfig(4, 1024, 1, 4, 1, PIPE=2),  # VARIANT")
_COMB_CHAIN = "            comb_wait = pdl.chained(q.device, t, before_resident)"
_COMB_ALWAYS = (BACKEND, _COMB_CHAIN, "            comb_wait = use_pdl  # VARIANT: chained at one row")
_ATTN_CHAIN = _PDL_ATTN[1]  # the attention's two launch lines as the engine has them


def _resident(block_n: int, warps: int, chain: str = "both") -> list[tuple[str, str, str]]:
    """o_proj's resident GEMV (PIPE 0) at another [block_n, 4096] slice per program and warp
    count; chain "both" (the default: the attention and its split combine PDL-chained before
    it), "comb": the combine only, "": neither."""
    out = [(GK, _O_ROW, f"(1, 4096, 4096, False): GemvConfig({block_n}, 4096, 1, {warps}, 1, PIPE=0),"
                        "  # VARIANT")] if (block_n, warps) != (4, 4) else []
    if chain in ("comb", ""):
        out.append((BACKEND, _ATTN_CHAIN, "        use_pdl, pdl_wait = pdl.enabled(q.device), "
                    "pdl.chained(q.device, t)  # VARIANT\n        launch = pdl.launch_kwargs(q.device, t)"))
    if chain == "":
        out.append((BACKEND, _COMB_CHAIN, "            comb_wait = pdl.chained(q.device, t)  # VARIANT"))
    return out


_RES_WAIT = "    pdl.wait(PDL)\n    x = _x_tile(X + offs_k, K, k_ok, SILU)\n"


def _res_pf(block_n: int, warps: int, num: int, den: int) -> list[tuple[str, str, str]]:
    """`_resident(block_n, warps, "both")` plus, before the wait, an L2 prefetch by program pid
    (pid < n - n * num / den) of program pid + n * num / den's slice: the programs that are not
    resident while the attention runs find their weights in L2 (one prefetch per 128-byte line)."""
    pf = (f"    shift = tl.num_programs(0) * {num} // {den}  # VARIANT: a later program's slice into L2\n"
          "    if pid + shift < tl.num_programs(0):\n"
          "        pf_rows = tl.minimum(offs_n + shift * BLOCK_N, N - 1)\n"
          "        pf_cols = tl.minimum(tl.arange(0, K_PAD // 64) * 64, K - 1)\n"
          "        tl.inline_asm_elementwise(\"prefetch.global.L2 [$1]; // $0\", \"=r,l\",\n"
          "                                  [W + pf_rows[:, None] * stride_wn + pf_cols[None, :]],\n"
          "                                  dtype=tl.int32, is_pure=False, pack=1)\n")
    return _resident(block_n, warps, "both") + [(GK, _RES_WAIT, pf + _RES_WAIT)]


# name -> [(file, old text, new text), ...]
RECIPES: dict[str, list[tuple[str, str, str]]] = {
    "ko_attn": [_ATTN_RETURN],
    "ko_comb": [_COMB_RETURN],
    "ko_both": [_ATTN_RETURN, _COMB_RETURN],
    "ko_comb_launch": [(BACKEND, "        if splits > 1:\n            comb_wait",
                        "        if splits > 1 and splits < 0:  # KNOCKOUT: no combine launch\n"
                        "            comb_wait")],
    "kb_noloop": [(KERNELS, '    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)',
                   '    hi = lo  # KNOCKOUT: no kv tiles\n'
                   '    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)')],
    "kb_nofold": [(KERNELS, "        if (lo <= new) & (new < hi):",
                   "        if (lo <= new) & (new < hi) & (num_splits < 0):  # KNOCKOUT"),
                  (KERNELS, "        tl.debug_barrier()  # the stores above",
                   "        pass  # KNOCKOUT tl.debug_barrier()  # the stores above")],
    "kb_noqrope": [(KERNELS, "    if ROPE:  # q arrives unrotated",
                    "    if False:  # KNOCKOUT q arrives unrotated")],
    "kb_deadexit": [(KERNELS, "    if ROPE:  # decode: the program whose kv range holds",
                     "    if hi <= lo:  # KNOCKOUT: dead splits exit\n        return\n"
                     "    if ROPE:  # decode: the program whose kv range holds")],
    # K/V tiles read with L2 evict_last (the weights stream with evict_first), so that the
    # context's K/V may stay in L2 from one step to the next (session 17: 3.95 against 3.95-3.96
    # ms). Decode runs at one stage: pipelined cp.async loads (LDGSTS) would drop the hint, plain
    # loads keep it (LDG.E.EL.128)
    "kv_evict_last": [
        (KERNELS, "                         mask=n_ok[None, :] & d_ok[:, None], other=0.0)  # [D, N]",
         "                         mask=n_ok[None, :] & d_ok[:, None], other=0.0,\n"
         "                         eviction_policy=\"evict_last\")  # VARIANT [D, N]"),
        (KERNELS, "                kt = tl.load(k_base + slot[None, :] * stride_kt + d[:, None])",
         "                kt = tl.load(k_base + slot[None, :] * stride_kt + d[:, None],\n"
         "                             eviction_policy=\"evict_last\")  # VARIANT"),
        (KERNELS, "                       mask=n_ok[:, None] & d_ok[None, :], other=0.0)\n",
         "                       mask=n_ok[:, None] & d_ok[None, :], other=0.0,\n"
         "                       eviction_policy=\"evict_last\")  # VARIANT\n"),
        (KERNELS, "        return tl.load(v_base + slot[:, None] * stride_vt + d[None, :])\n",
         "        return tl.load(v_base + slot[:, None] * stride_vt + d[None, :],\n"
         "                       eviction_policy=\"evict_last\")  # VARIANT\n")],
    "pdl_attn": [_PDL_ATTN],
    # decode attention PDL-launched at one row (as pdl_attn), each program pulling its cached K/V
    # rows into L2 before its wait, while the qkv GEMV finishes (session 11's HOTSPEC_ATTN_EARLY,
    # code at 4986c25, then measured only beside the in-kernel split merge: 4.28 against 4.30 ms);
    # session 20 call 8: 3.92 (3.91) twice against default 3.93 / 3.92 and pdl_attn 3.93 twice, a tie
    "attn_early": [_PDL_ATTN,
                   (KERNELS, "\n\n@triton.jit\ndef paged_attn_fwd(",
                    _PREFETCH_KV + "\n\n@triton.jit\ndef paged_attn_fwd("),
                   (KERNELS, _ATTN_WAIT,
                    "    if PDL_WAIT:  # VARIANT\n        if ROPE:\n"
                    "            _prefetch_kv(K, V, BT, KVL, b, h, sp, num_splits, stride_bt, stride_kt, "
                    "stride_kh,\n                         stride_vt, stride_vh, BLOCK_N, HEAD_DIM, PAGE)\n"
                    + _ATTN_WAIT)],
    "pdl_both": [_PDL_ATTN, _COMB_ALWAYS],
    # o_proj's GEMV before session 21: 4 x 1024 tiles at PIPE 2 (its kernels before it are then
    # not chained at one row). Session 21 call 1-2, 8B batch 1 (fast machine): 3.86-3.87 (3.85)
    # against the resident kernel's 3.82 (3.81), in three alternated runs
    "o_pipe2": [_O_PIPE2],
    # knockout: o_proj (the one-row GEMV with N == K, 4096 x 4096 at 8B) on the tiled kernel
    # reading no weight (every weight load masked off, y = 0): what o_proj's weight stream costs
    # after the attention window. Session 21 call 1: 3.71 (3.70) against 3.86 (3.85) with PIPE 2
    # o_proj; `_pdl` also chains the attention and combine at one row: 3.72 (3.71)
    "ko_o_w": [_O_PIPE2] + _KO_O_W,
    "ko_o_w_pdl": [_O_PIPE2] + _KO_O_W + [_PDL_ATTN, _COMB_ALWAYS],
    # the resident o_proj (the default since session 21: 4 x 4096 at 4 warps, the attention and
    # the combine chained) in other shapes and chains. Session 21 calls 1-3, 8B batch 1, ms
    # (replay), on machines where o_pipe2 ran 3.86-3.87 (3.85-3.86): the default 3.82-3.83
    # (3.81-3.82) in four runs; the combine alone chained 3.83-3.84 (3.82) in three; at 8 warps
    # 3.82-3.83 (3.81-3.82); 2 rows at 4 warps 3.83 (3.82); 2 rows at 2 warps 3.84 (3.83); 8 rows
    # at 8 warps 3.83 (3.82); the slice in shared memory (a Gluon kernel, cp.async in 4 x 512
    # chunks; removed, `git show 85742ef:hotspec/layers/gemv_smem_kernel.py`) 4.21 (4.21).
    # Call 5 (a slower machine, default 3.88 (3.87) twice): the shapes that fit more of o_proj
    # beside the attention (sm_90 registers with the launch's divisibility hints: 4 x 4096 at 4
    # warps 94, so 5 programs an SM, ~64 % of the weight; 8 x 4096 at 4 warps 168, ~76 %; 1 x
    # 4096 at 1 warp 88, ~72 %; 2 x 4096 at 1 warp 182, ~69 %) all lose: 3.90-3.91 (3.89),
    # 3.91-3.92 (3.90), 3.91-3.92 (3.90). More traffic in the window slows the attention more
    # than it saves after it, as the L2 prefetches below do
    "res_comb": _resident(4, 4, "comb"),
    "res_nochain": _resident(4, 4, ""),
    "res4w8": _resident(4, 8),
    "res2w2": _resident(2, 2),
    "res8w8": _resident(8, 8),
    "res2w1": _resident(2, 1),
    "res8w4": _resident(8, 4),
    "res1w1": _resident(1, 1),
    # resident o_proj plus an L2 prefetch of the slices of the programs that become resident only
    # after the attention window (shift n/2: the second half; n/4: the last three quarters).
    # Session 21 call 2: 4 x 4096 at 8 warps 3.89 (3.88) / 3.88 (3.87) and 2 x 4096 at 4 warps
    # 3.88 (3.87), against 3.82-3.83 without: slower; the attention 1-2 us longer (its K/V misses
    # queue behind the prefetches, as in session 18)
    "res4w8_pf2": _res_pf(4, 8, 1, 2),
    "res4w8_pf4": _res_pf(4, 8, 1, 4),
    "st2": [_ST2],
    # the split count as a compile-time constant too (one specialization per split count the
    # graphs use: the split index and the chunk are then divisions by a constant; 1288 against
    # 1344 SASS instructions). Session 20: 8B batch 1 3.86 (3.85) against 3.86 (3.85) ms in both
    # alternated runs, a tie; not applied (eager decode, whose split count follows the growing
    # kv bound, would compile a kernel per count)
    "const_splits": [
        (KERNELS, "    scale_log2, width, m_custom, num_splits,\n",
         "    scale_log2, width, m_custom, num_splits: tl.constexpr,  # VARIANT\n"),
        (MERGE, "    num_splits,\n    HEAD_DIM", "    num_splits: tl.constexpr,  # VARIANT\n    HEAD_DIM"),
    ],
    # the norm-GEMV (qkv, gate_up) issues its second weight tile's loads right after the PDL
    # wait, before the row's norm (its L2 loads and cross-warp sum). Session 20: 4.00 against
    # 3.86 ms (qkv 78 -> 90 registers, gate_up 72 -> 96: qkv's 768 programs no longer fit one
    # wave). Session 17's HOTSPEC_GEMV_EARLY was the same idea (session 18: 4.08 against 3.95)
    "norm_early": [
        (NG, "    pdl.wait(PDL)\n    inv = row_rms(",
         "    pdl.wait(PDL)\n    k1 = BLOCK_K + tl.arange(0, BLOCK_K)  # VARIANT: tile 1 before the norm\n"
         "    w1 = tl.load(W + offs_n[:, None] * stride_wn + k1[None, :], mask=(offs_n < N)[:, None] & "
         "(k1 < K)[None, :],\n                 other=0.0, eviction_policy=\"evict_first\")\n"
         "    inv = row_rms("),
        (NG, "        k_start = BLOCK_K\n",
         "        acc += w1.to(tl.float32) * normed_tile(X, R, G, k1, k1 < K, inv, HAS_RES)[None, :]\n"
         "        k_start = 2 * BLOCK_K  # VARIANT\n"),
    ],
    # the one-row GEMV at PIPE=1 (the 8B down projection) issues its second weight tile's loads
    # before its first input tile's (session 20: 3.86 (3.85) against 3.86 (3.85) ms, a tie)
    "gemv_early": [
        (GK, "    elif PRELOAD:  # the first tile, loaded before the wait (whole): the loop's first step\n",
         "    elif PRELOAD and BLOCK_M == 1:  # VARIANT: tile 1's loads before tile 0's input\n"
         "        k1 = k_lo + BLOCK_K + offs_k\n"
         "        w1 = _w_tile(w_ptr + BLOCK_K, n_ok, k1 < k_hi, False)\n"
         "        acc = _mac(acc, w0, _x_tile(x_ptr, K, m_ok[:, None], SILU), BLOCK_M, F32_DOT)\n"
         "        acc = _mac(acc, w1, _x_tile(x_ptr + BLOCK_K, K, m_ok[:, None] & (k1 < k_hi)[None, :], "
         "SILU),\n"
         "                   BLOCK_M, F32_DOT)\n"
         "        k_start = k_lo + 2 * BLOCK_K\n"
         "        w_ptr += 2 * BLOCK_K\n"
         "        x_ptr += 2 * BLOCK_K\n"
         "    elif PRELOAD:  # the first tile, loaded before the wait (whole): the loop's first step\n"),
    ],
    # the one-row GEMVs' accumulator folded per tile: each thread sums its 8 adjacent products of
    # a row (tl.reshape + tl.sum), so acc is [BLOCK_N, BLOCK_K / 8] instead of [BLOCK_N, BLOCK_K]
    # fp32 (sm_90 registers: o 110 -> 74, down 125 -> 70, qkv 78 -> 70, gate_up 72 -> 68; fewer
    # BAR.SYNC in down, 15 -> 7). Session 20: 4.16 (4.15) against 3.87 (3.85) ms, far slower;
    # different bits, so two bf16 token-equality tests of tests/test_pdl.py failed with it
    "acc8": [
        (GK, "@triton.jit\ndef _mac(", "@triton.jit\ndef _fold8(p):  # VARIANT\n"
         "    return tl.sum(tl.reshape(p, (p.shape[0], p.shape[1] // 8, 8)), axis=2)\n\n\n"
         "@triton.jit\ndef _mac("),
        (GK, "        return acc + w.to(tl.float32) * x.to(tl.float32)\n",
         "        return acc + _fold8(w.to(tl.float32) * x.to(tl.float32))\n"),
        (GK, "        acc += w_cur.to(tl.float32) * x.to(tl.float32)\n",
         "        acc += _fold8(w_cur.to(tl.float32) * x.to(tl.float32))\n"),
        (GK, "    return acc + w_cur.to(tl.float32) * x.to(tl.float32)\n",
         "    return acc + _fold8(w_cur.to(tl.float32) * x.to(tl.float32))\n"),
        (GK, "        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)\n",
         "        acc = tl.zeros((BLOCK_N, BLOCK_K // 8), dtype=tl.float32)\n"),
        (NG, "from hotspec.layers.gemv_kernels import GemvConfig\n",
         "from hotspec.layers.gemv_kernels import GemvConfig, _fold8\n"),
        (NG, "    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)\n",
         "    acc = tl.zeros((BLOCK_N, BLOCK_K // 8), dtype=tl.float32)\n"),
        (NG, "            acc += w_cur.to(tl.float32) * normed_tile(X, R, G, kc, kc < K, inv, HAS_RES)\n",
         "            acc += _fold8(w_cur.to(tl.float32) * normed_tile(X, R, G, kc, kc < K, inv, "
         "HAS_RES))\n"),
        (NG, "        acc += w_cur.to(tl.float32) * normed_tile(X, R, G, kc, kc < K, inv, HAS_RES)\n",
         "        acc += _fold8(w_cur.to(tl.float32) * normed_tile(X, R, G, kc, kc < K, inv, HAS_RES))\n"),
        (NG, "        acc += w0.to(tl.float32) * normed_tile(X, R, G, offs_k, offs_k < K, inv, "
         "HAS_RES)[None, :]\n",
         "        acc += _fold8(w0.to(tl.float32) * normed_tile(X, R, G, offs_k, offs_k < K, inv, "
         "HAS_RES)[None, :])\n"),
        (NG, "        acc += w.to(tl.float32) * normed_tile(X, R, G, kk, k_ok, inv, HAS_RES)[None, :]\n",
         "        acc += _fold8(w.to(tl.float32) * normed_tile(X, R, G, kk, k_ok, inv, HAS_RES)[None, :])\n"),
    ],
    # the norm-GEMV without the whole-row norm first: one pass over K sums the stream's squares
    # alongside the products w * (g * s), and the reciprocal RMS scales the dot at the end (no
    # rounding of the normalised input: other bits than the unfused path). Session 20: 4.01
    # against 3.92 ms, slower (the row's read no longer warms L1 for the tiles' input loads)
    "norm_defer": [(NG, _NG_BODY, _NG_DEFER)],
    # the attention and combine kernels' strides as runtime arguments again (before session 19
    # they were; as compile-time constants, fewer parameter loads and 10 % fewer SASS
    # instructions: 8B batch 1 3.92 (3.91) against 3.93 (3.92) ms in two alternated runs)
    "runtime_strides": [
        (KERNELS, "    stride_qt: tl.constexpr, stride_qh: tl.constexpr, stride_kt: tl.constexpr, "
         "stride_kh: tl.constexpr,\n    stride_vt: tl.constexpr, stride_vh: tl.constexpr, "
         "stride_ot: tl.constexpr, stride_oh: tl.constexpr,\n",
         "    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot,\n"
         "    stride_oh,  # VARIANT\n"),
        (KERNELS, "    stride_ps, stride_pt: tl.constexpr, stride_ph: tl.constexpr, stride_ls, "
         "stride_lt: tl.constexpr,\n    scale_log2",
         "    stride_ps, stride_pt, stride_ph, stride_ls, stride_lt,\n    scale_log2"),
        (KERNELS, "    stride_knt: tl.constexpr = 0, stride_knh: tl.constexpr = 0, "
         "stride_vnt: tl.constexpr = 0,\n" + _TAIL,
         "    stride_knt=0, stride_knh=0, stride_vnt=0, stride_vnh=0, stride_cs=0,\n"),
        (MERGE, "    stride_ps, stride_pt: tl.constexpr, stride_ph: tl.constexpr, stride_ls, "
         "stride_lt: tl.constexpr,\n    stride_ot: tl.constexpr, stride_oh: tl.constexpr,\n",
         "    stride_ps, stride_pt, stride_ph, stride_ls, stride_lt, stride_ot, stride_oh,  # VARIANT\n"),
    ],
    "pf_oproj": [_PF_OPROJ_FN, _KERNEL_TAIL,
                 (KERNELS, _AFTER_LOOP, "    if PF_AT == 2:\n        _pf_lines(PF, PF_N)\n" + _AFTER_LOOP),
                 (BACKEND, _ROPE_KW, "            **_rope_kwargs(rope, k_cache), **({'PF': self._pf, "
                  "'PF_N': self._pf.numel() // 64, 'PF_AT': 2} if p.width == 1 else {}),\n"),
                 (_LLAMA, _FORWARD, "        backend._pf = self.o_proj.weight  # VARIANT\n" + _FORWARD)],
    # the attention signals that the next kernels may launch after its kv loops instead of at
    # its start, so the resident o_proj's weight loads (launched through the chained combine)
    # start only once the attention's K/V loads are done: less of the window for o_proj, but no
    # HBM queue ahead of the K/V misses (session 21 found the window traffic-bound: calls 2, 5).
    # Prepared in session 21, not yet measured
    "attn_signal_late": [
        (KERNELS, _LAUNCHED + "    pid0 = tl.program_id(0)", "    pid0 = tl.program_id(0)  # VARIANT"),
        (KERNELS, "    l_safe = tl.where(l_i == 0.0, 1.0, l_i)\n",
         "    pdl.launch_dependents(PDL)  # VARIANT: after the kv loops\n"
         "    l_safe = tl.where(l_i == 0.0, 1.0, l_i)\n"),
    ],
    "kv_next": [_KV_NEXT_FN, _KERNEL_TAIL,
                (KERNELS, _AFTER_LOOP, "    if PF_AT == 2:\n        _pf_next(k_base, v_base, bt_row, lo, hi, "
                 "PF_N, stride_kt, stride_vt, PAGE, BLOCK_N)\n" + _AFTER_LOOP),
                (BACKEND, _ROPE_KW, "            **_rope_kwargs(rope, k_cache), **({'PF_N': self._nxt, "
                 "'PF_AT': 2} if p.width == 1 and self._nxt else {}),\n"),
                (_LLAMA, _FORWARD, "        backend._nxt = k_cache.numel() if self.layer_id + 1 < "
                 "kv.k.shape[0] else 0  # VARIANT\n" + _FORWARD)],
    **{f"w{w}": [(BACKEND, _WARPS, f"        num_warps = self.num_warps or ({w} if p.width == 1 else 4)")]
       for w in (1, 2, 8)},
    # the down projection's input without silu(gate) * up (gate only): what computing the
    # product once, in gate_up's epilogue, could save at most (session 18: 3.89, replay 3.87,
    # against 3.89 / 3.88 ms)
    "kb_nosilu": [("hotspec/layers/gemv_kernels.py", "    if SILU:\n        u = tl.load(x_ptr + K",
                   "    if False:  # KNOCKOUT: no silu * up\n        u = tl.load(x_ptr + K")],
    # o_proj with whole rows per program (2 x 4096, the whole weight slice preloaded before the
    # PDL wait; 127 registers, 4 programs per SM; session 18: 3.93 against 3.89 ms)
    "o_rows": [(GK, _O_ROW, "(1, 4096, 4096, False): GemvConfig(2, 4096, 1, 4, 1),  # VARIANT")],
    # the V tile's loads after the scores and softmax again at batch 1 (the order before
    # session 18; TritonBackend._v_early)
    "v_late": [(BACKEND, "        return self._stages(p) == 1 and block_n <= 32",
                "        return False  # VARIANT: V's loads after the scores")],
    # GEMV tiles of 4 (or 8) rows x 1024 columns, whose main loop needs no shared-memory layout
    # change of the input tile (the o row's shape since session 16; the sm_90 SASS of qkv's 8 x
    # 512 and gate_up's 16 x 256 loops has 2 BAR.SYNC per tile, down's 16 x 512 (+silu) 8).
    # Session 18, 8B batch 1 against 3.94 ms: qkv 3.97, gate_up 3.95 (8 rows: 4.16), down 4 x
    # 1024 4.03 (no split) / 4.09 (split 2), 8 x 1024 split 2 3.97: the barriers are not the cost
    "t_qkv4": [(GK, "(1, 6144, 4096, False): GemvConfig(8, 512, 1, 4, 2),",
                "(1, 6144, 4096, False): GemvConfig(4, 1024, 1, 4, 1),  # VARIANT")],
    "t_gu4": [(GK, "(28672, 4096): GemvConfig(16, 256, 1, 4, 4),",
               "(28672, 4096): GemvConfig(4, 1024, 1, 4, 1),  # VARIANT")],
    "t_gu8": [(GK, "(28672, 4096): GemvConfig(16, 256, 1, 4, 4),",
               "(28672, 4096): GemvConfig(8, 1024, 1, 4, 1),  # VARIANT")],
    **{f"t_down{bn}s{sk}": [(GK, "(1, 4096, 14336, True): GemvConfig(16, 512, 2, 4, 2),",
                            f"(1, 4096, 14336, True): GemvConfig({bn}, 1024, {sk}, 4, 1),  # VARIANT")]
       for bn, sk in ((4, 1), (4, 2), (8, 2))},
    # the vanilla decode step's head in torch ops again (seven small kernels: the carry pick, the
    # slot lookup, q_lens, kv_lens) instead of runtime/decode_inputs' one kernel
    "head_torch": [("hotspec/engine/vanilla_worker.py",
                    "from hotspec.runtime.decode_inputs import decode_inputs\n",
                    "from hotspec.runtime.decode_inputs import decode_inputs_torch as decode_inputs"
                    "  # VARIANT\n")],
    # the carry written by a copy kernel after the argmax again (the order before session 18)
    "carry_copy": [("hotspec/engine/vanilla_worker.py",
                    "        return {\"next\": argmax(self._logits(x, float32=False), also=carry)}\n",
                    "        return self._next(argmax(self._logits(x, float32=False)))  # VARIANT\n")],
    # the fused EAGLE step's carry pick and put in torch again (runtime/carry_kernels.py's
    # kernels off)
    "carry_torch": [("hotspec/engine/launches.py", "    if keys and fused.enabled(values[keys[0]]):\n",
                     "    if False:  # VARIANT: the torch put\n"),
                    ("hotspec/engine/launches.py",
                     "    if fused.enabled(src) and src.dtype == torch.int64 and src.dim() == 1 "
                     "and src.stride(0) == 1:\n",
                     "    if False:  # VARIANT: the torch pick\n")],
    **{f"pf_guc{mb}{'e' if end else ''}": _pf_gu_comb(mb, end) for mb in (8, 16) for end in (False, True)},
    **{f"pf_gu{mb}{'el' if el else ''}": _pf_gu(mb, el) for mb in (16, 32) for el in (False, True)},
}


def write(name: str, out: Path) -> list[str]:
    """Apply recipe `name` to the current sources into out/name/; returns the files written."""
    files: dict[str, str] = {}
    for rel, old, new in RECIPES[name]:
        text = files.get(rel) or (ROOT / rel).read_text()
        if text.count(old) != 1:
            raise SystemExit(f"recipe {name}: its text is not in {rel} exactly once; update the recipe")
        files[rel] = text.replace(old, new)
    dest = out / name
    shutil.rmtree(dest, ignore_errors=True)
    for rel, text in files.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(text)
    return sorted(files)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="recipes to write (see --list)")
    ap.add_argument("--list", action="store_true", help="print the recipes and exit")
    ap.add_argument("--out", type=Path, default=ROOT / "ab_variants", help="where to write them")
    args = ap.parse_args(argv)
    if args.list or not args.names:
        print("\n".join(sorted(RECIPES)))
        return 0
    unknown = [n for n in args.names if n not in RECIPES]
    if unknown:
        raise SystemExit(f"unknown recipe(s) {unknown}; known: {', '.join(sorted(RECIPES))}")
    for name in args.names:
        print(name, " ".join(write(name, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
