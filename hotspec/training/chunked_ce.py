"""Soft cross-entropy of a draft head's LM head against the target's distribution, in chunks.

EAGLE-3's loss (losses.eagle3_loss) compares, per counted position, the head's log-softmax over the
draft vocabulary with the target's softmax over the same rows. Written densely, every TTT step
holds [N, D] float32 tensors (the head's log-probabilities, kept for backward, and the target's
probabilities): N ~ 30k positions at batch 32 times a full 151,936-token vocabulary is ~18 GB
each, per step. `soft_cross_entropy` computes the same values from the matmul inputs instead,
CHUNK_ELEMENTS logits at a time. Forward runs over row chunks and saves its inputs and each row's
two log-sum-exps (of the head's and of the target's logits). Backward runs over vocabulary
blocks of all rows: with the log-sum-exps a block's softmax needs no other column, so each block
of the LM-head gradient is one GEMM over every row, written once, and only the [N, H] gradient
of the hidden rows is summed over blocks (in float32). Live [rows, D] data is a few chunks'
worth, whatever N. On CUDA the softmax work of a chunk or block is one Triton kernel
(training/ce_kernels.py) reading the GEMMs' outputs once.

Precision follows the dense path: under autocast the matmuls run in the autocast dtype (as
autocast's linear would run them), otherwise in the inputs' dtype; softmax and log-softmax run
in float32 (float64 when the logits are float64); gradients come back in the dtypes of `h` and
`w`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

# Logits per chunk (rows = CHUNK_ELEMENTS // D): 8,192 rows of an 8,192-token vocabulary, 441 of
# 151,936; float32 chunks of 256 MiB, a handful alive at once.
CHUNK_ELEMENTS = 2 ** 26


def chunk_rows(d: int) -> int:
    return max(1, CHUNK_ELEMENTS // d)


def soft_cross_entropy(h: torch.Tensor, w: torch.Tensor, final: torch.Tensor, target_rows: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row i: -(softmax(final @ target_rows.T)[i] * log_softmax(h @ w.T)[i]).sum() [N], and
    (no gradient) whether the two argmaxes agree [N] bool.

    `h` [N, H] and `w` [D, H] are the head's normed hidden rows and LM-head weight (gradients flow
    to both); `final` [N, H'] and `target_rows` [D, H'] the target's final normed hidden rows and
    LM-head rows of the draft vocabulary (constants: no gradient reaches them)."""
    if h.shape[0] != final.shape[0] or w.shape[0] != target_rows.shape[0]:
        raise ValueError(f"rows disagree: h {tuple(h.shape)}, final {tuple(final.shape)}, "
                         f"w {tuple(w.shape)}, target_rows {tuple(target_rows.shape)}")
    loss, hit = _SoftCrossEntropy.apply(h, w, final.detach(), target_rows.detach())
    return loss, hit


def _compute_dtypes(h: torch.Tensor, w: torch.Tensor, final: torch.Tensor) -> tuple[torch.dtype, torch.dtype]:
    """(head matmul dtype, target matmul dtype): autocast's when it is on for the device, as the
    dense F.linear calls would run, else the inputs' (the target's rows follow `final`)."""
    device = h.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        return dtype, dtype
    return torch.promote_types(h.dtype, w.dtype), final.dtype


def _soft_dtype(dtype: torch.dtype) -> torch.dtype:
    """Softmax precision: float32, or float64 for float64 logits."""
    return torch.promote_types(dtype, torch.float32)


def _fused(h: torch.Tensor, soft: torch.dtype) -> bool:
    """The Triton kernels (training/ce_kernels.py) on CUDA for float32 softmaxes; torch's ops
    otherwise."""
    return h.is_cuda and soft == torch.float32


def vocab_block(n: int, d: int) -> int:
    """Columns of the backward's vocabulary blocks: CHUNK_ELEMENTS logits of all `n` rows."""
    return max(1, min(d, CHUNK_ELEMENTS // max(n, 1)))


class _SoftCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, w: torch.Tensor, final: torch.Tensor,
                target_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        head_dtype, target_dtype = _compute_dtypes(h, w, final)
        soft = _soft_dtype(head_dtype)
        n, step = h.shape[0], chunk_rows(w.shape[0])
        with torch.autocast(h.device.type, enabled=False):
            hc, wc = h.to(head_dtype), w.to(head_dtype)
            fc, tc = final.to(target_dtype), target_rows.to(target_dtype)
            loss = torch.empty(n, dtype=soft, device=h.device)
            hit = torch.empty(n, dtype=torch.bool, device=h.device)
            lse = torch.empty(2, n, dtype=soft, device=h.device)  # head's, target's
            for s in range(0, n, step):
                e = min(n, s + step)
                if _fused(hc, soft):
                    from hotspec.training.ce_kernels import soft_ce_rows  # (CUDA: triton is there)

                    soft_ce_rows(F.linear(hc[s:e], wc), F.linear(fc[s:e], tc), loss[s:e],
                                 lse[0, s:e], lse[1, s:e], hit[s:e])
                    continue
                z = F.linear(hc[s:e], wc).to(soft)
                lse[0, s:e] = torch.logsumexp(z, dim=-1)
                logp = z.sub_(lse[0, s:e, None])
                zt = F.linear(fc[s:e], tc).to(soft)
                lse[1, s:e] = torch.logsumexp(zt, dim=-1)
                target_p = zt.sub_(lse[1, s:e, None]).exp_()
                hit[s:e] = logp.argmax(-1) == target_p.argmax(-1)
                loss[s:e] = -(target_p.mul_(logp)).sum(-1)
        # The rows in their matmul dtypes (what backward multiplies), the weights as given (a cast
        # copy of a [D, H] weight per TTT step would outweigh the chunks).
        ctx.save_for_backward(hc, w, fc, target_rows, lse)
        ctx.dtypes = (head_dtype, target_dtype, h.dtype)
        ctx.mark_non_differentiable(hit)
        return loss, hit

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_loss: torch.Tensor, _grad_hit: torch.Tensor | None
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        hc, w, fc, target_rows, lse = ctx.saved_tensors
        head_dtype, target_dtype, h_dtype = ctx.dtypes
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        soft = _soft_dtype(head_dtype)
        n, d = hc.shape[0], w.shape[0]
        grad_h = torch.zeros(hc.shape, dtype=soft, device=hc.device) if need_h else None
        grad_w = torch.empty(w.shape, dtype=w.dtype, device=w.device) if need_w else None
        scale = grad_loss.to(soft).contiguous()
        lse_h, lse_t = lse[0, :, None], lse[1, :, None]
        with torch.autocast(hc.device.type, enabled=False):
            wc, tc = w.to(head_dtype), target_rows.to(target_dtype)
            step = vocab_block(n, d)
            for s in range(0, d, step):
                e = min(d, s + step)
                # d/dlogits of -(p_target * log_softmax(logits)).sum() is softmax(logits) - p_target.
                z, zt = F.linear(hc, wc[s:e]), F.linear(fc, tc[s:e])
                if _fused(hc, soft):
                    from hotspec.training.ce_kernels import soft_ce_grad_

                    g = soft_ce_grad_(z, zt, lse[0], lse[1], scale)
                else:  # (the logits minus the log-sum-exps: one op promotes and subtracts)
                    g = torch.sub(z, lse_h).exp_().sub_(torch.sub(zt, lse_t).exp_())
                    g = g.mul_(scale[:, None]).to(head_dtype)
                if grad_h is not None:
                    grad_h += g @ wc[s:e]
                if grad_w is not None:
                    grad_w[s:e] = g.T @ hc
        return (None if grad_h is None else grad_h.to(h_dtype)), grad_w, None, None
