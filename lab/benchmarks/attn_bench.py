"""The Triton paged-attention kernel alone, per phase shape, with its tile and split choices.

Verify's attention is the largest single item of a speculative step on the H200 (SmolLM2, batch 1:
30 calls of ~10 us, against ~3.6 us per decode call; benchmarks/RESULTS.md). This times
`TritonBackend.forward` (attention plus the split combine) by itself, captured in a CUDA graph of
`--copies` calls and replayed, for the shapes the engine runs:

    decode        1 query row, causal
    verify        N tree rows, the custom tree mask   (verify-causal: same rows, causal mask)
    draft         topk rows, the custom scratch mask  (draft-causal: same rows, causal mask)
    draft_extend  num_steps + 1 rows, causal

and for each, the kernel's automatic choice beside: the custom mask packed into a word per row
(`bits`, the default) or a byte per slot (`bytes`, what masks wider than 64 slots use); forced
kv-tile rows (`n32`, `n128`), query-tile rows (`m16`, `m32`, `m64`) and kv split counts (`s1`,
`s4`, `s8`, `s16`): TritonBackend's constructor options. The split count follows
`max_kv`, which the engine sets to the static context bound (`--static-kv`) rather than the real
length (`--context`); `real-kv` rows plan with the real length. Every variant is checked against
the torch reference backend (max abs error) before it is timed.

    python lab/benchmarks/attn_bench.py --model default --context 512 [--batch-sizes 1,8]

On the CPU (Triton's interpreter, TRITON_INTERPRET=1) it runs the same checks at `--model tiny`
with host timings that mean nothing: a smoke test of the script.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402

from hotspec.benchmark.device import device_name  # noqa: E402
from hotspec.core.forward_batch import ForwardBatch, ForwardMode  # noqa: E402
from hotspec.layers.attention.torch_ref import TorchRefBackend  # noqa: E402
from hotspec.layers.attention.triton_backend import KernelTuning, TritonBackend  # noqa: E402
from hotspec.runtime.timing import graph_replay_ms  # noqa: E402

PAGE = 16
# (query heads, kv heads, head dim) of each model's attention
MODELS = {"default": (9, 3, 64), "llama8b-shape": (32, 8, 128), "tiny": (4, 2, 16)}
# phase: (rows per request, mask kind, mask width M); SGLang-style shapes of a 4/8/12 tree
PHASES = {"decode": (1, "causal", 0), "verify": (12, "tree", 12), "verify-4": (4, "tree", 4),
          "verify-16": (16, "tree", 16), "verify-causal": (12, "causal", 0),
          "draft": (8, "scratch", 24), "draft-causal": (8, "causal", 0), "draft_extend": (5, "causal", 0)}
VARIANTS = {"auto": {}, "bits": {"mask_bits": True}, "bytes": {"mask_bits": False},
            "n32": {"block_n": 32}, "n128": {"block_n": 128}, "m16": {"block_m": 16},
            "m32": {"block_m": 32}, "m64": {"block_m": 64}, "s1": {"num_splits": 1}, "s8": {"num_splits": 8},
            "s16": {"num_splits": 16}, "s4": {"num_splits": 4}, "s2": {"num_splits": 2},
            "s32": {"num_splits": 32}, "real-kv": {},
            # the deterministic mode's one config for every phase (no split), and tile candidates
            "det": {"deterministic": True}, "det-n32": {"deterministic": True, "block_n": 32},
            "det-n128": {"deterministic": True, "block_n": 128},
            "det-st1": {"deterministic": True, "num_stages": 1},
            "det-st3": {"deterministic": True, "num_stages": 3}}


@dataclass
class Case:
    fb: ForwardBatch
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


def tree_mask(n: int, g: torch.Generator) -> torch.Tensor:
    """A random tree of n nodes (parent[i] < i): mask[i, j] = j is i or one of its ancestors."""
    m = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        m[i, i] = True
        if i:
            m[i] |= m[int(torch.randint(0, i, (), generator=g))]
    return m


def scratch_mask(k: int, m: int, g: torch.Generator) -> torch.Tensor:
    """Draft-like [k, m]: each row sees a random part of the scratch region and its own slot."""
    mask = torch.rand(k, m, generator=g) < 0.3
    mask[torch.arange(k), m - k + torch.arange(k)] = True
    return mask


def make_case(phase: str, batch: int, context: int, static_kv: int, heads: tuple[int, int, int],
              dtype: torch.dtype, device: torch.device, seed: int = 0) -> Case:
    """Requests of `context` committed tokens plus this phase's rows, in a shuffled paged cache."""
    rows, kind, m = PHASES[phase]
    hq, hkv, d = heads
    g = torch.Generator().manual_seed(seed)
    kv_len = context + rows if kind != "scratch" else context + m
    blocks = triton.cdiv(kv_len, PAGE)
    perm = torch.randperm(batch * blocks, generator=g) + 1  # block 0 stays the null block
    tables = torch.zeros(batch, triton.cdiv(static_kv, PAGE), dtype=torch.int32)
    tables[:, :blocks] = perm.view(batch, blocks).to(torch.int32)
    slots = (batch * blocks + 1) * PAGE
    k = torch.randn(slots, hkv, d, generator=g).to(dtype)
    v = torch.randn(slots, hkv, d, generator=g).to(dtype)
    q = torch.randn(batch * rows, hq, d, generator=g).to(dtype)
    mask = None
    if kind == "tree":
        mask = torch.stack([tree_mask(rows, g) for _ in range(batch)])
    elif kind == "scratch":
        mask = torch.stack([scratch_mask(rows, m, g) for _ in range(batch)])
    zeros = torch.zeros(batch * rows, dtype=torch.long, device=device)
    # positions: the tree's depths past the context (the deterministic verify reads them)
    depth = mask.sum(-1) - 1 if kind == "tree" else torch.arange(rows).expand(batch, rows)
    positions = (kv_len - (m if kind != "causal" else rows) + depth).reshape(-1).to(device)
    fb = ForwardBatch(
        mode={"tree": ForwardMode.VERIFY, "scratch": ForwardMode.DRAFT}.get(kind, ForwardMode.DECODE),
        input_ids=zeros,
        positions=positions, out_cache_loc=zeros,
        q_lens=torch.full((batch,), rows, dtype=torch.long, device=device),
        kv_lens=torch.full((batch,), kv_len, dtype=torch.long, device=device),
        block_tables=tables.to(device), width=rows, max_q=rows, max_kv=static_kv,
        custom_mask=None if mask is None else mask.to(device))
    return Case(fb, q.to(device), k.to(device), v.to(device))


def reference(case: Case, scale: float) -> torch.Tensor:
    ref = TorchRefBackend(PAGE)
    ref.plan(case.fb)
    return ref.forward(case.fb, case.q.float(), case.k.float(), case.v.float(), scale)


def run_variant(case: Case, name: str, scale: float, copies: int, iters: int,
                ref: torch.Tensor) -> dict[str, float]:
    over = dict(VARIANTS[name])
    backend = TritonBackend(PAGE, KernelTuning(**over))
    fb = case.fb
    if name == "real-kv":
        fb = ForwardBatch(**{**fb.__dict__, "max_kv": int(fb.kv_lens.max()), "attn_meta": None})
    backend.plan(fb)
    out = torch.empty_like(case.q)
    backend.forward(fb, case.q, case.k, case.v, scale, out=out)  # compile, and the check
    err = (out.float() - ref).abs().max().item()
    if case.q.device.type != "cuda":
        t0 = time.perf_counter()
        backend.forward(fb, case.q, case.k, case.v, scale, out=out)
        return {"us": (time.perf_counter() - t0) * 1e6, "max_err": err}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(copies):
            backend.forward(fb, case.q, case.k, case.v, scale, out=out)
    return {"us": graph_replay_ms(graph, iters) * 1e3 / copies, "max_err": err}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=tuple(MODELS), default="default")
    p.add_argument("--context", type=int, default=512, help="committed tokens per request")
    p.add_argument("--static-kv", type=int, default=8192,
                   help="the max_kv bound the engine plans with (max_model_len)")
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--copies", type=int, default=20, help="calls per captured graph")
    p.add_argument("--iters", type=int, default=20, help="graph replays timed")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    heads = MODELS[args.model]
    scale = heads[2] ** -0.5
    phases = args.phases.split(",")
    variants = args.variants.split(",")
    for name in phases + variants:
        if name not in PHASES and name not in VARIANTS:
            p.error(f"unknown phase or variant {name!r}: phases {', '.join(PHASES)}; "
                    f"variants {', '.join(VARIANTS)}")
    rows = []
    for bs in (int(b) for b in args.batch_sizes.split(",")):
        for phase in phases:
            case = make_case(phase, bs, args.context, args.static_kv, heads, dtype, device)
            ref = reference(case, scale)
            for name in variants:
                r = run_variant(case, name, scale, args.copies, args.iters, ref)
                rows.append({"batch": bs, "phase": phase, "variant": name, **r})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    tol = 5e-2 if dtype != torch.float32 else 1e-3
    bad = [r for r in rows if not r["max_err"] <= tol]
    print(f"{device_name(device)}; {args.model} heads {heads}, context {args.context}, "
          f"static kv bound {args.static_kv}, {str(dtype).removeprefix('torch.')}; us per call "
          "(attention + split combine)")
    print(f"{'batch':>5} {'phase':<14}" + "".join(f"{v:>10}" for v in variants))
    for bs in sorted({r["batch"] for r in rows}):
        for phase in phases:
            cells = {r["variant"]: r["us"] for r in rows if r["batch"] == bs and r["phase"] == phase}
            print(f"{bs:>5} {phase:<14}" + "".join(f"{cells[v]:>10.2f}" for v in variants))
    if args.out is not None:
        args.out.write_text(json.dumps({"device": device_name(device), "rows": rows}, indent=1))
    if bad:
        print(f"WRONG RESULTS (max abs error > {tol}): {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
