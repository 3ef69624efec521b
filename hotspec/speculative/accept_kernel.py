"""Greedy acceptance and the index work of the KV commit in one Triton kernel: one program per
request (speculative/verify.greedy_accept's CUDA path).

From the target's argmax at every tree node it computes what verify_greedy and EaglePhases.accept
compute in about twenty small torch kernels: node j matches when its token is the argmax after
its parent (the root always); it is on an accepted path when every node of its ancestor set
(its mask row) matches; the path ends at the deepest such node `cur`, whose mask row lists the
path; then per path position d < W: the node, its token, and the commit's source and destination
slots (trash past the accepted length). Trees of at most 64 nodes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotspec.layers import triton_interpret  # noqa: F401  (the interpreter fix)


@triton.jit
def _accept_kernel(PRED, TOK, PAR, DEPTH, MASK, SLOTS, PATH, ALEN, BONUS, ACC_TOK, SRC, DST,
                   trash, stride_slots, N: tl.constexpr, W: tl.constexpr, N_PAD: tl.constexpr,
                   W_PAD: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    n = tl.arange(0, N_PAD)
    nm = n < N
    tok = tl.load(TOK + b * N + n, mask=nm, other=0)
    par = tl.load(PAR + b * N + n, mask=nm, other=0)
    dep = tl.load(DEPTH + b * N + n, mask=nm, other=0)
    match = (tok == tl.load(PRED + b * N + par, mask=nm, other=-1)) | (n == 0)
    both = nm[:, None] & nm[None, :]
    anc = tl.load(MASK + b * N * N + n[:, None] * N + n[None, :], mask=both, other=0) != 0
    bad = tl.sum((anc & ~match[None, :]).to(tl.int32), 1)
    key = tl.where(nm & (bad == 0), dep, -1)
    best = tl.max(key, 0)
    cur = tl.min(tl.where(key == best, n, N_PAD), 0)  # the first deepest matching node
    on_path = tl.load(MASK + b * N * N + cur * N + n, mask=nm, other=0) != 0
    a = tl.sum(tl.where(n == cur, dep, 0), 0) + 1
    tl.store(ALEN + b, a)
    tl.store(BONUS + b, tl.load(PRED + b * N + cur))
    d = tl.arange(0, W_PAD)
    dm = d < W
    at = on_path[None, :] & (dep[None, :] == d[:, None])  # [position, node]
    node = tl.sum(tl.where(at, n[None, :], 0), 1).to(tl.int64)  # 0 past the path, as the scatter
    acc_tok = tl.sum(tl.where(n[None, :] == node[:, None], tok[None, :], 0), 1)
    keep = d < a
    src = tl.load(SLOTS + b * stride_slots + node, mask=dm, other=0)
    dst = tl.load(SLOTS + b * stride_slots + d, mask=dm, other=0)
    tl.store(PATH + b * W + d, node, mask=dm)
    tl.store(ACC_TOK + b * W + d, acc_tok, mask=dm)
    tl.store(SRC + b * W + d, tl.where(keep, src, trash), mask=dm)
    tl.store(DST + b * W + d, tl.where(keep, dst, trash), mask=dm)


def greedy_accept(pred: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                  depth: torch.Tensor, mask: torch.Tensor, slots: torch.Tensor, trash: int,
                  max_depth: int) -> tuple[torch.Tensor, ...]:
    """(path, accept_len, bonus, acc_tokens, src, dst) as speculative/verify.greedy_accept_torch."""
    b, n = tokens.shape
    w = max_depth + 1
    dev = tokens.device
    path = torch.empty((b, w), dtype=torch.long, device=dev)
    alen = torch.empty((b,), dtype=torch.long, device=dev)
    bonus = torch.empty((b,), dtype=torch.long, device=dev)
    acc_tok = torch.empty((b, w), dtype=torch.long, device=dev)
    src = torch.empty((b, w), dtype=torch.long, device=dev)
    dst = torch.empty((b, w), dtype=torch.long, device=dev)
    if b:
        _accept_kernel[(b,)](pred.contiguous(), tokens.contiguous(), parents.contiguous(),
                             depth.contiguous(), mask.contiguous().view(torch.int8), slots, path,
                             alen, bonus, acc_tok, src, dst, trash, slots.stride(0), N=n, W=w,
                             N_PAD=triton.next_power_of_2(max(n, 16)),
                             W_PAD=triton.next_power_of_2(max(w, 16)), num_warps=4)
    return path, alen, bonus, acc_tok, src, dst
