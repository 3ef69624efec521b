"""Where an engine decode step's wall time goes on the host: launching, waiting, everything else.

    python lab/benchmarks/host_bench.py [engine options] --batch-size 8 --max-tokens 64
    python lab/benchmarks/host_bench.py --speculative-algorithm EAGLE3 --batch-size 8

B requests of random token ids run greedy to --max-tokens (EOS ignored). Every decode step
(`Engine.step()` after the prefill) is timed, and inside it:
  run    the graph runner's `run` calls: writing host inputs into their pinned slot and
         launching the phase's graph (on the CPU, or eager, the model's whole computation);
  wait   `HostSlot.tolist` / `HostCopy.tolist`: the host blocked on the device for a step's
         output (CUDA: the graph's published slot; eager: a copy);
  other  the rest: scheduling, block tables, the worker's host tensors, stop checks, text.
With the overlap schedule a step's `other` overlaps the device's work on the step launched
before; when `other` + `run` exceeds the graph's replay time, the host is the bottleneck.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hotspec.benchmark.device import device_name, sync
from hotspec.cli.engine_args import add_engine_args, engine_config
from hotspec.core import launches
from hotspec.engine.engine import Engine
from hotspec.runtime.host_io import HostSlot
from hotspec.sampling_params import SamplingParams


class _Timer:
    """Seconds spent inside a wrapped callable, summed until read."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Any) -> Any:
        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - t0
        return timed

    def take(self) -> float:
        s, self.seconds = self.seconds, 0.0
        return s


def measure(engine: Engine, batch: int, prompt_len: int, max_tokens: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    run_t, wait_t = _Timer(), _Timer()
    engine.graphs.run = run_t.wrap(engine.graphs.run)  # type: ignore[method-assign]
    tolist, slot_tolist = launches.HostCopy.tolist, HostSlot.tolist
    launches.HostCopy.tolist = wait_t.wrap(tolist)  # type: ignore[method-assign]
    HostSlot.tolist = wait_t.wrap(slot_tolist)  # type: ignore[method-assign]
    try:
        for _ in range(batch):
            engine.add_request([rng.randrange(3, vocab) for _ in range(prompt_len)], params)
        while engine.waiting or engine.prefilling:  # prefill, untimed
            engine.step()
        sync(engine.device)
        run_t.take(), wait_t.take()
        steps: list[tuple[float, float, float, int]] = []
        while engine.has_unfinished():
            t0 = time.perf_counter()
            outs = engine.step()
            wall = time.perf_counter() - t0
            steps.append((wall, run_t.take(), wait_t.take(), sum(len(o.new_token_ids) for o in outs)))
    finally:
        launches.HostCopy.tolist = tolist  # type: ignore[method-assign]
        HostSlot.tolist = slot_tolist  # type: ignore[method-assign]
        del engine.graphs.run  # the instance attribute: the class's method again
    walls = [s[0] for s in steps]
    n = len(steps)

    def ms(i: int) -> float:
        return 1e3 * statistics.median(s[i] for s in steps)

    return {"batch": batch, "steps": n, "tokens": sum(s[3] for s in steps),
            "ms_step": 1e3 * statistics.median(walls), "ms_run": ms(1), "ms_wait": ms(2),
            "ms_other": 1e3 * statistics.median(s[0] - s[1] - s[2] for s in steps)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p)
    p.add_argument("--batch-sizes", default="1,8", help="comma-separated")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-seed", dest="bench_seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the rows here as JSON")
    args = p.parse_args(argv)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    cfg = replace(engine_config(args), max_num_seqs=max(sizes))
    engine = Engine(cfg)
    # one untimed pass: compiles kernels, captures nothing new, warms the allocator
    measure(engine, max(sizes), args.prompt_len, 8, args.bench_seed)
    rows = [measure(engine, b, args.prompt_len, args.max_tokens, args.bench_seed + b) for b in sizes]
    mode = cfg.speculative_algorithm or "vanilla"
    print(f"{mode} on {device_name(engine.device)}, {engine.graphs.mode} graphs, "
          f"{'overlap' if engine.worker.overlapping else 'plain'} schedule; median ms per decode step")
    print(f"{'batch':>5} {'steps':>6} {'tok/step':>8} {'step':>8} {'run':>8} {'wait':>8} {'other':>8}")
    for r in rows:
        per_step = r["tokens"] / max(r["steps"], 1)
        print(f"{r['batch']:>5} {r['steps']:>6} {per_step:>8.2f} {r['ms_step']:>8.3f} "
              f"{r['ms_run']:>8.3f} {r['ms_wait']:>8.3f} {r['ms_other']:>8.3f}")
    if args.out:
        args.out.write_text(json.dumps({"mode": mode, "device": device_name(engine.device),
                                        "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
