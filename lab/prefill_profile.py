"""Where an eager prefill step's host time goes: a random-weight target of a real shape (no
files), `--batch` requests of `--tokens` prompt tokens prefilled in one engine step, timed warm,
then the same step under cProfile (Python functions by own time) and torch.profiler (kernels
launched, device time).

    python3 lab/prefill_profile.py --model smollm2-shape --batch 8 --tokens 64
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from hotspec.benchmark.random_models import SHAPES, random_state
from hotspec.config import EngineConfig
from hotspec.engine.engine import Engine
from hotspec.models.build import build_target
from hotspec.sampling_params import SamplingParams


def prefill_once(engine: Engine, batch: int, tokens: int, seed: int) -> float:
    """One engine step that prefills `batch` new prompts; its wall time in ms (device synced)."""
    gen = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    reqs = [engine.add_request(torch.randint(0, engine.model_config.vocab_size, (tokens,),
                                             generator=gen).tolist(), params) for _ in range(batch)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    engine.step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    while engine.has_unfinished():
        engine.step()
    assert all(r.finish_reason for r in reqs)
    return ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", choices=sorted(SHAPES), default="smollm2-shape")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    cfg_m = SHAPES[args.model]
    target = build_target(cfg_m, random_state(cfg_m, dev, dtype), dtype, dev)
    engine = Engine.from_model(EngineConfig(skip_tokenizer_init=True, max_num_seqs=args.batch,
                                            kv_cache_memory_gb=4, cuda_graph_max_bs=args.batch),
                               cfg_m, target)
    for i in range(3):
        prefill_once(engine, args.batch, args.tokens, i)
    times = [prefill_once(engine, args.batch, args.tokens, 10 + i) for i in range(args.repeats)]
    print(f"{args.model}: prefill of {args.batch} x {args.tokens} tokens: median "
          f"{statistics.median(times):.2f} ms (min {min(times):.2f}) over {args.repeats}")
    prof = cProfile.Profile()
    prof.enable()
    prefill_once(engine, args.batch, args.tokens, 99)
    prof.disable()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
        prefill_once(engine, args.batch, args.tokens, 98)
    print(tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
