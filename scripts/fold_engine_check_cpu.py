"""Does HOTSPEC_ATTN_ROPE's fold change the engine's greedy tokens? A CPU check of the engine-level
plumbing, without a GPU: the default model through `LLM`, with Triton attention and the fused
RoPE / norm kernels forced on and run in Triton's interpreter (the GEMVs stay torch), once
without and once with the fold. Prints both token lists, how often rope_store ran (the fold skips
it at decode), and EQUAL or DIFFER.

    python scripts/fold_engine_check_cpu.py [DTYPE=bfloat16] [TOKENS=24]

About 6 minutes per pass at 24 tokens on 2 cores. It forces private switches of
hotspec.layers.fused, so it is a diagnostic, not a supported way to run the engine. Session 11:
EQUAL in bfloat16 and float32 (RESULTS.md, "Session 11").
"""

from __future__ import annotations

import os
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"  # before any Triton kernel module is imported

from hotspec import LLM, SamplingParams  # noqa: E402
from hotspec.layers import fused  # noqa: E402
from hotspec.layers.attention import triton_backend  # noqa: E402


def main() -> int:
    dtype = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 24
    fused._on_device = lambda x: True  # the fused path is CUDA-only otherwise
    fused._available = lambda: True
    fused._gemv_allowed = lambda: False  # the interpreted GEMV would take hours
    fused._norm_gemv_allowed = lambda: False
    calls = [0]
    rope_store = fused.rope_store

    def counted(*args, **kwargs):
        calls[0] += 1
        return rope_store(*args, **kwargs)

    fused.rope_store = counted
    prompts = ["The capital of France is", "def quicksort(arr):", "List three colours:"]
    params = SamplingParams(temperature=0, max_tokens=tokens)
    out = {}
    for fold in (False, True):
        triton_backend._FOLD_ROPE = fold
        calls[0] = 0
        t0 = time.time()
        llm = LLM(dtype=dtype, device="cpu", attention_backend="triton", max_num_seqs=3)
        out[fold] = [o.token_ids for o in llm.generate(prompts, params)]
        print(f"fold={fold}: {out[fold]} ({time.time() - t0:.0f} s, rope_store ran {calls[0]} times)",
              flush=True)
    print("EQUAL" if out[False] == out[True] else "DIFFER")
    return 0 if out[False] == out[True] else 1


if __name__ == "__main__":
    raise SystemExit(main())
