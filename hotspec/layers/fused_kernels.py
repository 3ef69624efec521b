"""Triton kernels that fuse a decoder layer's small elementwise steps (the CUDA fast path).

A decode step of a Llama layer in plain torch is about 60 kernels: RMSNorm alone is seven
(cast, square, mean, add, rsqrt, multiply, cast, weight), RoPE about ten per tensor, the KV store
two. Inside a CUDA graph each still costs a few microseconds. These kernels bring a layer down to
~10 launches:

  rms_norm          [T, H]: y = w * (x * rsqrt(mean(x^2) + eps)), optionally after
                    s = x + residual (returned as the new residual)
  silu_mul          [T, 2I] -> [T, I]: silu(gate) * up of a fused gate_up projection
  rope_store        q, k, v of a fused qkv projection: rotate q (to a new tensor) and k, write k
                    and v to their KV-cache slots, in one launch
  topk_logp         [T, V] logits -> the top-k of their log-softmax, clamped (the draft loop's
                    pick of each frontier node's children; layers/topk_logp.py)

Each is written to round exactly where the torch reference (layers/norm.py, layers/rotary.py,
models/llama.py MLP) rounds, so the two agree to the last bit up to reduction order: the residual
sum is rounded to the model dtype before the norm reads it, the normalised row is rounded before
the weight multiplies it, silu(gate) is rounded before the product. RoPE is computed in float32
from the float32 cos/sin table and rounded once.

Only the CUDA path calls these; the CPU path (and CI) uses the torch code, and the tests run these
kernels against it under TRITON_INTERPRET=1 (tests/test_fused_kernels.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotspec.layers import pdl, triton_interpret  # noqa: F401  (triton_interpret: the interpreter fix)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@triton.jit
def _rms_norm_kernel(X, R, W, Y, R_OUT, n, eps, stride_x, stride_r, stride_y, stride_ro,
                     HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
                     PDL_WAIT: tl.constexpr = False):
    pdl.launch_dependents(PDL)  # the GEMV after it may start pulling its weights (layers/pdl.py)
    pdl.wait(PDL_WAIT)  # PDL-launched itself (pdl.chained): nothing is read before this
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(R_OUT + row * stride_ro + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, axis=0) / n + eps)
    normed = (xf * inv).to(X.dtype.element_ty).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, (w * normed).to(Y.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None, out: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(norm(x [+ residual]), x + residual or None). x, residual: [T, H], unit stride along H;
    `out` ([T, H], unit stride along H, e.g. half of a wider buffer) receives the norm if given."""
    t, n = x.shape
    y = out if out is not None else torch.empty(
        (t, n), dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    r_out = torch.empty_like(x) if residual is not None else None
    if t:
        r = residual if residual is not None else x
        ro = r_out if r_out is not None else y
        _rms_norm_kernel[(t,)](x, r, weight, y, ro, n, eps, x.stride(0), r.stride(0), y.stride(0),
                               ro.stride(0), HAS_RES=residual is not None, BLOCK=_pow2(n),
                               PDL=pdl.enabled(x.device), PDL_WAIT=pdl.chained(x.device, t),
                               num_warps=4 if n <= 4096 else 8, **pdl.launch_kwargs(x.device, t))
    return y, r_out


@triton.jit
def _silu_mul_kernel(GU, Y, inter, stride_gu, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    g = tl.load(GU + row * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + row * stride_gu + inter + cols, mask=mask, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(Y.dtype.element_ty).to(tl.float32)
    tl.store(Y + row * stride_y + cols, (s * u).to(Y.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate_up[:, :I]) * gate_up[:, I:] -> [T, I]."""
    t, two_i = gate_up.shape
    inter = two_i // 2
    y = torch.empty((t, inter), dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, _pow2(inter))
    if t:
        _silu_mul_kernel[(t, triton.cdiv(inter, block))](gate_up, y, inter, gate_up.stride(0),
                                                         y.stride(0), BLOCK=block, num_warps=4)
    return y


@triton.jit
def _rope_store_kernel(Q, K, V, Q_OUT, K_CACHE, V_CACHE, POS, LOC, COS, SIN,
                       stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                       stride_ot, stride_oh, stride_kc, stride_khc, stride_vc, stride_vhc, stride_cs,
                       HQ: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr,
                       PDL_WAIT: tl.constexpr = False):
    """Program (t, h): h < HQ rotates query head h; h >= HQ rotates kv head h - HQ and stores it
    and the matching V row in the token's cache slot."""
    pdl.launch_dependents(PDL_WAIT)  # chained (layers/pdl.py): attention may launch now,
    pdl.wait(PDL_WAIT)  # and this kernel reads nothing before the kernel before has finished
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK)
    m = d < HALF
    pos = tl.load(POS + t).to(tl.int64)
    cos = tl.load(COS + pos * stride_cs + d, mask=m, other=0.0)
    sin = tl.load(SIN + pos * stride_cs + d, mask=m, other=0.0)
    if h < HQ:
        src = Q + t * stride_qt + h * stride_qh
        dst = Q_OUT + t * stride_ot + h * stride_oh
    else:
        hk = h - HQ
        slot = tl.load(LOC + t).to(tl.int64)
        src = K + t * stride_kt + hk * stride_kh
        dst = K_CACHE + slot * stride_kc + hk * stride_khc
        v = tl.load(V + t * stride_vt + hk * stride_vh + d, mask=m)
        v2 = tl.load(V + t * stride_vt + hk * stride_vh + HALF + d, mask=m)
        vdst = V_CACHE + slot * stride_vc + hk * stride_vhc
        tl.store(vdst + d, v.to(V_CACHE.dtype.element_ty), mask=m)
        tl.store(vdst + HALF + d, v2.to(V_CACHE.dtype.element_ty), mask=m)
    x1 = tl.load(src + d, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + d, mask=m, other=0.0).to(tl.float32)
    # rotate-half: [x1, x2] * [cos, cos] + [-x2, x1] * [sin, sin], with the fma spelled out as
    # attention's _rotate spells it (the attention's RoPE fold must give these bits)
    tl.store(dst + d, tl.fma(x1, cos, (-x2) * sin).to(dst.dtype.element_ty), mask=m)
    tl.store(dst + HALF + d, tl.fma(x2, cos, x1 * sin).to(dst.dtype.element_ty), mask=m)


def rope_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
               cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               loc: torch.Tensor) -> torch.Tensor:
    """q: [T, Hq, D], k, v: [T, Hkv, D] (unit stride along D; views of a qkv output are fine);
    cos, sin: [max_pos, D/2] float32. Returns rotated q as a new [T, Hq, D] tensor; rotated k and v
    go to cache rows `loc` (padding rows all point at the trash slot: written in any order)."""
    t, hq, d = q.shape
    hkv = k.shape[1]
    q_out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    positions, loc = positions.contiguous(), loc.contiguous()  # read with unit stride
    if t:
        half = d // 2
        _rope_store_kernel[(t, hq + hkv)](
            q, k, v, q_out, k_cache, v_cache, positions, loc, cos, sin,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            q_out.stride(0), q_out.stride(1), k_cache.stride(0), k_cache.stride(1),
            v_cache.stride(0), v_cache.stride(1), cos.stride(0),
            HQ=hq, HALF=half, BLOCK=_pow2(half), PDL_WAIT=pdl.chained(q.device, t), num_warps=1,
            **pdl.launch_kwargs(q.device, t))
    return q_out


@triton.jit
def _topk_logp_kernel(L, V_OUT, I_OUT, vocab, stride_l, max_logp, K: tl.constexpr,
                      BLOCK: tl.constexpr):
    """Program t: log-sum-exp of row t, then K passes, each the largest (value, smallest index)
    pair strictly after the previous pick in that order (layers/topk_logp.py). A NaN logit ranks
    as -inf, so a row of NaNs still picks K indices in range (with NaN values, as torch gives);
    an index past the vocabulary would fail the next draft step's embedding lookup."""
    row = tl.program_id(0).to(tl.int64)
    base = L + row * stride_l
    cols0 = tl.arange(0, BLOCK)
    m = tl.max(tl.full((BLOCK,), float("-inf"), tl.float32), 0)
    s = tl.sum(tl.zeros((BLOCK,), tl.float32), 0)
    for start in range(0, vocab, BLOCK):
        cols = start + cols0
        x = tl.load(base + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        new_m = tl.maximum(m, tl.max(x, 0))
        s = s * tl.exp(m - new_m) + tl.sum(tl.exp(x - new_m), 0)
        m = new_m
    lse = m + tl.log(s)
    pv = tl.max(tl.full((BLOCK,), float("inf"), tl.float32), 0)
    pi = tl.min(tl.full((BLOCK,), -1, tl.int32), 0)
    for j in tl.static_range(K):
        bv = tl.max(tl.full((BLOCK,), float("-inf"), tl.float32), 0)
        bi = tl.min(tl.full((BLOCK,), 2147483647, tl.int32), 0)
        for start in range(0, vocab, BLOCK):
            cols = start + cols0
            x = tl.load(base + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
            x = tl.where(x == x, x, float("-inf"))  # NaN ranks as -inf
            ok = (cols < vocab) & ((x < pv) | ((x == pv) & (cols > pi)))
            xv = tl.where(ok, x, float("-inf"))
            cm = tl.max(xv, 0)
            ci = tl.min(tl.where(ok & (xv == cm), cols, 2147483647), 0)
            better = (cm > bv) | ((cm == bv) & (ci < bi))
            bv = tl.where(better, cm, bv)
            bi = tl.where(better, ci, bi)
        v = bv - lse
        # (not tl.minimum: on the GPU min(NaN, x) is x; torch's clamp, like this, keeps the NaN)
        tl.store(V_OUT + row * K + j, tl.where(v > max_logp, max_logp, v))
        tl.store(I_OUT + row * K + j, bi.to(tl.int64))
        pv = bv
        pi = bi


def topk_logp(logits: torch.Tensor, k: int, max_logp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, V] (unit stride along V) -> (float32 [T, k] min(log_softmax, max_logp) top-k
    values, int64 [T, k] their indices; ties to the smaller index)."""
    t, vocab = logits.shape
    values = torch.empty((t, k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, k), dtype=torch.long, device=logits.device)
    if t:
        _topk_logp_kernel[(t,)](logits, values, ids, vocab, logits.stride(0), float(max_logp),
                                K=k, BLOCK=min(4096, _pow2(vocab)), num_warps=8)
    return values, ids
