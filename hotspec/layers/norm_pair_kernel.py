"""The EAGLE-3 head's input in one kernel: [rms_norm(embed[token]) | rms_norm(feature)].

Each draft forward starts with an embedding lookup and two RMSNorms (the token's embedding and
the feature, each with its own weight) written into the halves of one [T, 2H] buffer: three
small kernels in a launch-bound loop. Here program (t, 0) gathers row t's embedding and
normalises it into out[t, :H], program (t, 1) normalises feature[t] into out[t, H:], each rounded
exactly as fused_kernels._rms_norm_kernel rounds (the normalised row before the weight)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotspec.layers import triton_interpret  # noqa: F401  (the interpreter fix)


@triton.jit
def _embed_norm_pair_kernel(IDS, EMB, FEAT, W0, W1, OUT, h, eps0, eps1, stride_e, stride_f,
                            stride_o, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    half = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    mask = cols < h
    if half == 0:
        tok = tl.load(IDS + t).to(tl.int64)
        x = tl.load(EMB + tok * stride_e + cols, mask=mask, other=0.0)
        w = tl.load(W0 + cols, mask=mask, other=0.0).to(tl.float32)
        eps = eps0
    else:
        x = tl.load(FEAT + t * stride_f + cols, mask=mask, other=0.0)
        w = tl.load(W1 + cols, mask=mask, other=0.0).to(tl.float32)
        eps = eps1
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, axis=0) / h + eps)
    normed = (xf * inv).to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + t * stride_o + half * h + cols, (w * normed).to(OUT.dtype.element_ty), mask=mask)


def embed_norm_pair(ids: torch.Tensor, embed: torch.Tensor, w_embed: torch.Tensor, eps_embed: float,
                    feature: torch.Tensor, w_feature: torch.Tensor, eps_feature: float) -> torch.Tensor:
    """[rms_norm(embed[ids]) * w_embed | rms_norm(feature) * w_feature]: ids [T], embed [V, H],
    feature [T, H] (unit stride along H, all of one dtype) -> [T, 2H] in feature's dtype. `ids`
    may be a strided view (a chain's tokens: the first column of the [B, K] draft state)."""
    t, h = feature.shape
    ids = ids.contiguous()  # read with unit stride
    if embed.shape[1] != h or feature.stride(1) != 1 or embed.stride(1) != 1:
        raise ValueError(f"embed_norm_pair: embed [V, {h}] and feature [T, {h}] with unit stride "
                         f"along H, got {tuple(embed.shape)}, {tuple(feature.shape)}")
    if len({embed.dtype, feature.dtype, w_embed.dtype, w_feature.dtype}) != 1:
        raise ValueError("embed_norm_pair: embedding, feature and norm weights of one dtype")
    out = torch.empty((t, 2 * h), dtype=feature.dtype, device=feature.device)
    if t:
        _embed_norm_pair_kernel[(t, 2)](
            ids, embed, feature, w_embed, w_feature, out, h, eps_embed, eps_feature, embed.stride(0),
            feature.stride(0), out.stride(0), BLOCK=triton.next_power_of_2(h),
            num_warps=4 if h <= 4096 else 8)
    return out
