"""What each prefill step of a benchmark pass costs: requests, prompt tokens and wall time, for
vanilla and for speculative decoding on the same prompts, side by side in one process.

    python lab/benchmarks/prefill_steps.py [engine options] --speculative-algorithm EAGLE3 \\
        --prompts ../shared/data/spec_bench_dev.jsonl --num-prompts 32 --batch-size 8

The prompts run greedy to --max-tokens as `hotspec bench` and spec_sweep run them (at a batch
above 1 as one stream: finished requests are replaced as they end), after the same warm-up.
Every engine step that prefills is timed between two device syncs. It prints, per mode, the
prefill steps, their total and median wall time, their prompt tokens, and the decode steps, then
the speculative engine's prefill time over vanilla's; --out writes every step. --profile-rows N
adds one prefill step under torch.profiler: its CUDA kernels and where the host's time goes. Prefill is not
captured as a CUDA graph, so a step's wall time is mostly launches while prompts are short.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch.profiler import ProfilerActivity, profile

from hotspec.benchmark.device import device_name, sync
from hotspec.benchmark.modes import RunOptions, warm_up_all
from hotspec.benchmark.prompts import prompt_ids, read_bench_prompts
from hotspec.benchmark.script import run_script
from hotspec.benchmark.spec_bench import drive, load_target, run_with_engine
from hotspec.cli.engine_args import add_engine_args, engine_config
from hotspec.engine.engine import Engine
from hotspec.sampling_params import SamplingParams


def timed_pass(engine: Engine, prompts: list[list[int]], opts: RunOptions) -> dict[str, Any]:
    """Warm up, then one pass over `prompts` with every prefill step timed."""
    warm_up_all(engine, {"all": prompts}, opts)
    steps: list[dict[str, Any]] = []
    prefill = engine._prefill_step

    def timed() -> Any:
        sync(engine.device)
        reqs = len(engine.prefilling)
        tokens = sum(len(r.prompt_token_ids) + len(r.output_token_ids) - r.seq_len
                     for r in engine.prefilling)
        t0 = time.perf_counter()
        out = prefill()
        sync(engine.device)
        steps.append({"requests": reqs, "pending_tokens": tokens,
                      "ms": 1e3 * (time.perf_counter() - t0)})
        return out

    engine._prefill_step = timed  # type: ignore[method-assign]
    try:
        run = drive(engine, prompts, opts.params)
    finally:
        del engine._prefill_step
    ms = [s["ms"] for s in steps]
    return {"prefill_steps": len(steps), "prefill_ms": sum(ms),
            "median_step_ms": statistics.median(ms) if ms else None,
            "prompt_tokens": sum(map(len, prompts)), "decode_steps": run.decode_steps,
            "wall_s": run.wall_s, "generated_tokens": run.generated, "steps": steps}


def profile_step(engine: Engine, prompt: list[int], rows: int) -> dict[str, Any]:
    """One prefill step of `prompt` alone under torch.profiler: the host's time by operator (the
    `rows` costliest), and on CUDA the kernels it launched."""
    activities = [ProfilerActivity.CPU]
    if engine.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    sync(engine.device)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        sync(engine.device)
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type.name == "CUDA"]
    ops = sorted((e for e in events if e.device_type.name == "CPU"),
                 key=lambda e: -e.self_cpu_time_total)[:rows]
    return {"tokens": len(prompt), "wall_ms": 1e3 * wall, "cuda_kernels": sum(k.count for k in kernels),
            "cuda_kernel_ms": sum(k.device_time_total for k in kernels) / 1e3,
            "host_ops": [{"op": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3}
                         for e in ops]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p)
    p.add_argument("--prompts", required=True, type=Path)
    p.add_argument("--num-prompts", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--warmup-tokens", type=int, default=16)
    p.add_argument("--profile-rows", type=int, default=0, metavar="N",
                   help="then one prefill step of the median-length prompt alone under "
                   "torch.profiler: its wall time, CUDA kernels and the N costliest host operators")
    p.add_argument("--out", type=Path, default=None, help="JSON with every prefill step")
    args = p.parse_args(argv)
    cfg = replace(engine_config(args), max_num_seqs=args.batch_size, profile_phases=False)
    modes = {"vanilla": replace(cfg, speculative_algorithm=None, speculative_draft_model_path=None,
                                speculative_token_map=None)}
    if cfg.speculative_algorithm is not None:
        modes["speculative"] = cfg
    target = load_target(cfg)
    prompts = [prompt_ids(bp, target.tokenizer, args.chat)
               for bp in read_bench_prompts(args.prompts, args.num_prompts)]
    opts = RunOptions(args.max_tokens, False, args.warmup_tokens, prompts[: args.batch_size])
    results: dict[str, dict[str, Any]] = {}
    devices: list[str] = []

    median_prompt = sorted(prompts, key=len)[len(prompts) // 2]

    def run(engine: Engine) -> dict[str, Any]:
        devices.append(device_name(engine.device))
        out = timed_pass(engine, prompts, opts)
        if args.profile_rows > 0:
            out["profiled_step"] = profile_step(engine, median_prompt, args.profile_rows)
        return out

    for name, mcfg in modes.items():
        print(f"{name}: timed pass", file=sys.stderr, flush=True)
        results[name] = run_with_engine(mcfg, target, run)
    device = devices[0]
    lines = [f"{cfg.model or 'default model'} on {device}; batch {args.batch_size}, "
             f"{len(prompts)} prompts ({sum(map(len, prompts)):,} prompt tokens), max_tokens "
             f"{args.max_tokens}, greedy",
             f"{'mode':<12} {'prefill steps':>13} {'prefill ms':>10} {'median ms':>9} "
             f"{'tokens/step':>11} {'decode steps':>12} {'wall s':>7}"]
    for name, r in results.items():
        med = f"{r['median_step_ms']:>9.1f}" if r["median_step_ms"] is not None else f"{'-':>9}"
        lines.append(f"{name:<12} {r['prefill_steps']:>13} {r['prefill_ms']:>10.1f} {med} "
                     f"{r['prompt_tokens'] / max(r['prefill_steps'], 1):>11.0f} "
                     f"{r['decode_steps']:>12} {r['wall_s']:>7.3f}")
    for name, r in results.items():
        if "profiled_step" in r:
            ps = r["profiled_step"]
            lines.append(f"{name}: one prefill step of {ps['tokens']} tokens under the profiler: "
                         f"{ps['wall_ms']:.1f} ms wall, {ps['cuda_kernels']} CUDA kernels "
                         f"({ps['cuda_kernel_ms']:.2f} ms of kernel time); host time by operator:")
            lines += [f"    {o['op']:<48} {o['calls']:>6} calls {o['self_cpu_ms']:>8.2f} ms"
                      for o in ps["host_ops"]]
    if "speculative" in results and results["vanilla"]["prefill_ms"] > 0:
        lines.append(f"speculative prefill / vanilla prefill: "
                     f"{results['speculative']['prefill_ms'] / results['vanilla']['prefill_ms']:.2f}x")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"benchmark": "lab/benchmarks/prefill_steps.py",
                                        "argv": sys.argv[1:] if argv is None else argv,
                                        "device": device, "modes": results}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    run_script(main)
