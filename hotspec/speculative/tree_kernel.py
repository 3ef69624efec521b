"""`build_tree` (speculative/tree.py) in one Triton kernel: one program per request.

The torch spelling is about twenty small kernels (a top-k, a sort, scatters, gathers, one gather
per tree depth for the ancestor mask, a sum); at the head of verify they are pure launch cost.
Here a program

  1. ranks its G candidates by (score descending, global index ascending), a NaN score ranking
     as -inf, and keeps the N - 1 best: the same set torch.topk keeps when scores are distinct,
     and where they tie the earlier candidate wins, so a parent whose child's score rounds to its
     own still precedes it and the tree stays ancestor-closed;
  2. numbers the kept candidates in global order (a prefix sum): their tree indices 1..N-1;
  3. maps each kept candidate's global parent to its tree index through a per-request scratch row;
  4. builds each node's ancestor set as one int64 word (bit j: node j is the node or an
     ancestor), `max_depth` passes of word[i] = own bit | word[parent[i]], and writes the bool
     mask and the depth (the word's population count minus one) from it.

Trees of at most 64 nodes (one word); speculative/tree.py runs torch beyond.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotspec.layers import triton_interpret  # noqa: F401  (the interpreter fix)
from hotspec.speculative.tree import KERNEL_MAX_NODES, DraftTree


@triton.jit
def _tree_kernel(ROOT, SCORES, TOKENS, PARENTS, G2T, WORDS, OUT_TOK, OUT_PAR, OUT_DEPTH, OUT_MASK,
                 G, N: tl.constexpr, MAX_DEPTH: tl.constexpr, G_PAD: tl.constexpr,
                 CH: tl.constexpr, N_PAD: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, G_PAD)
    gm = g < G
    s = tl.load(SCORES + b * G + g, mask=gm, other=float("-inf"))
    s = tl.where(gm & (s == s), s, float("-inf"))
    rank = tl.zeros((G_PAD,), dtype=tl.int32)
    for j0 in range(0, G, CH):
        j = j0 + tl.arange(0, CH)
        jm = j < G
        sj = tl.load(SCORES + b * G + j, mask=jm, other=float("-inf"))
        sj = tl.where(jm & (sj == sj), sj, float("-inf"))
        better = (sj[None, :] > s[:, None]) | ((sj[None, :] == s[:, None]) & (j[None, :] < g[:, None]))
        rank += tl.sum((better & jm[None, :]).to(tl.int32), 1)
    sel = gm & (rank < N - 1)
    pos = tl.cumsum(sel.to(tl.int32), 0)  # tree index of each kept candidate, in global order
    tl.store(G2T + b * G + g, tl.where(sel, pos, 0), mask=gm)
    tl.debug_barrier()  # the map is written before any thread reads it back
    par_g = tl.load(PARENTS + b * G + g, mask=sel, other=-1)
    par_t = tl.load(G2T + b * G + tl.maximum(par_g, 0), mask=sel & (par_g >= 0), other=0)
    tl.store(OUT_TOK + b * N + pos, tl.load(TOKENS + b * G + g, mask=sel, other=0), mask=sel)
    tl.store(OUT_PAR + b * N + pos, par_t.to(tl.int64), mask=sel)
    tl.store(OUT_TOK + b * N, tl.load(ROOT + b))
    tl.store(OUT_PAR + b * N, tl.zeros((), dtype=tl.int64))
    tl.debug_barrier()
    n = tl.arange(0, N_PAD)
    nm = n < N
    par = tl.load(OUT_PAR + b * N + n, mask=nm, other=0)
    own = tl.where(nm, tl.full((N_PAD,), 1, tl.int64) << n.to(tl.int64), 0)
    w = own
    for _ in tl.static_range(MAX_DEPTH):  # each pass adds one more generation of ancestors
        tl.store(WORDS + b * N + n, w, mask=nm)
        tl.debug_barrier()
        w = own | tl.load(WORDS + b * N + par, mask=nm, other=0)
        tl.debug_barrier()  # every read of this pass is done before the next pass's store
    bits = (w[:, None] >> n[None, :].to(tl.int64)) & 1  # [node, slot]
    both = nm[:, None] & nm[None, :]
    tl.store(OUT_MASK + b * N * N + n[:, None] * N + n[None, :], bits.to(tl.int8), mask=both)
    tl.store(OUT_DEPTH + b * N + n, tl.sum(tl.where(both, bits, 0), 1) - 1, mask=nm)


def build_tree(root: torch.Tensor, scores: torch.Tensor, tokens: torch.Tensor,
               parents: torch.Tensor, num_draft_tokens: int, max_depth: int) -> DraftTree:
    """As speculative/tree.build_tree_torch (same shapes and dtypes), for N <= 64."""
    b, g = scores.shape
    n = num_draft_tokens
    if n > KERNEL_MAX_NODES:
        raise ValueError(f"tree kernel: at most {KERNEL_MAX_NODES} nodes, got {n}")
    dev = scores.device
    scores, tokens, parents = scores.float().contiguous(), tokens.contiguous(), parents.contiguous()
    out_tok = torch.empty((b, n), dtype=torch.long, device=dev)
    out_par = torch.empty((b, n), dtype=torch.long, device=dev)
    depth = torch.empty((b, n), dtype=torch.long, device=dev)
    mask = torch.empty((b, n, n), dtype=torch.bool, device=dev)
    g2t = torch.empty((b, g), dtype=torch.int32, device=dev)
    words = torch.empty((b, n), dtype=torch.int64, device=dev)
    if b:
        g_pad = triton.next_power_of_2(max(g, 16))
        _tree_kernel[(b,)](root.contiguous(), scores, tokens, parents, g2t, words, out_tok, out_par,
                           depth, mask.view(torch.int8), g, N=n, MAX_DEPTH=max_depth, G_PAD=g_pad,
                           CH=min(32, g_pad), N_PAD=triton.next_power_of_2(max(n, 16)),
                           num_warps=4)
    return DraftTree(tokens=out_tok, parents=out_par, depth=depth, mask=mask)
