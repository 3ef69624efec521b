"""Does HOTSPEC_ATTN_ROPE's fold change the engine's greedy tokens? The default model through
`LLM`, the three prompts of the GPU token test, once without and once with the fold; prints both
token lists, how often rope_store ran (the fold skips it at decode), and EQUAL or DIFFER (exit 1).

    python scripts/fold_engine_check.py [--device cpu|cuda] [--dtype bfloat16] [--tokens 24]
                                        [--eager]

On the CPU, Triton attention and the fused RoPE / norm kernels are forced on and run in Triton's
interpreter (the GEMVs stay torch): the engine's plumbing of the fold, about 6 minutes per pass at
24 tokens on 2 cores. That forces private switches of hotspec.layers.fused, so it is a
diagnostic, not a supported way to run the engine. On CUDA it runs the engine as deployed
(CUDA graphs up to batch 4; `--eager` without them; HOTSPEC_PDL=0 in the environment without PDL),
to narrow down a difference. Session 11: EQUAL on the CPU in bfloat16 and float32 (RESULTS.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--eager", action="store_true", help="CUDA: no CUDA graphs")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before any Triton kernel module is imported

    from hotspec import LLM, SamplingParams
    from hotspec.layers import fused
    from hotspec.layers.attention import triton_backend

    opts: dict[str, object] = {"max_num_seqs": 3}
    if args.device == "cpu":
        fused._on_device = lambda x: True  # the fused path is CUDA-only otherwise
        fused._available = lambda: True
        fused._gemv_allowed = lambda: False  # the interpreted GEMV would take hours
        fused._norm_gemv_allowed = lambda: False
        opts["attention_backend"] = "triton"
    else:
        opts.update(kv_cache_memory_gb=0.5, cuda_graph_max_bs=4, disable_cuda_graph=args.eager)
    calls = [0]
    rope_store = fused.rope_store

    def counted(*a, **k):
        calls[0] += 1
        return rope_store(*a, **k)

    fused.rope_store = counted
    prompts = ["The capital of France is", "def quicksort(arr):", "List three colours:"]
    params = SamplingParams(temperature=0, max_tokens=args.tokens)
    out = {}
    for fold in (False, True):
        triton_backend._FOLD_ROPE = fold
        calls[0] = 0
        t0 = time.time()
        llm = LLM(dtype=args.dtype, device=args.device, **opts)
        out[fold] = [o.token_ids for o in llm.generate(prompts, params)]
        print(f"fold={fold}: {out[fold]} ({time.time() - t0:.0f} s, rope_store called {calls[0]} "
              "times outside CUDA graphs)", flush=True)
    same = out[False] == out[True]
    print("EQUAL" if same else "DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
