"""A drifting workload: prompts from categories that accept well, then from ones that accept
badly, served at a fixed concurrency by vanilla decoding, fixed speculation shapes and
--speculative-adaptive, one engine after the other on one target, the same stream each time.

    python benchmarks/drift_bench.py --speculative-algorithm EAGLE3 \\
        --prompts ../shared/data/spec_bench_dev.jsonl \\
        --first writing,roleplay,reasoning,coding,stem,humanities --then translation,summarization \\
        --per-phase 40 --batch-size 8 --fixed 3/1/4 4/8/12

The stream is `--per-phase` prompts of the `--first` categories, then as many of the `--then`
ones (round-robin over each list's categories); a new request is added whenever one finishes,
so `--batch-size` requests are in flight. Per engine: tokens per second in windows of
`--window` seconds, the shape the adaptive policy ran in each window, and how many of its steps
after the first `--then` request started it took to settle on the shape it then kept. Prints a
table last; `--out` writes every number (and `--plot PNG` the tokens/s over time).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hotspec.benchmark.device import device_name
from hotspec.benchmark.script import run_script
from hotspec.benchmark.spec_bench import load_target, run_with_engine
from hotspec.benchmark.stream import round_robin, serve
from hotspec.cli.engine_args import add_engine_args, engine_config
from hotspec.engine.engine import Engine
from hotspec.errors import HotspecError


def stream(path: Path, first: list[str], then: list[str], per_phase: int, tokenizer: Any
           ) -> tuple[list[list[int]], int]:
    """The prompt ids of the stream, and the index where the second phase starts."""
    a = round_robin(path, first, per_phase, tokenizer)
    return a + round_robin(path, then, per_phase, tokenizer), len(a)


def windows(events: list[tuple[float, int, str | None]], width: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for t, n, shape in events:
        k = int(t // width)
        while len(out) <= k:
            out.append({"t": len(out) * width, "tokens": 0, "shapes": {}})
        out[k]["tokens"] += n
        if shape is not None:
            out[k]["shapes"][shape] = out[k]["shapes"].get(shape, 0) + 1
    for w in out:
        w["tokens_per_s"] = w["tokens"] / width
        w["shape"] = max(w["shapes"], key=w["shapes"].get) if w["shapes"] else None
    return out


def steps_to_follow(events: list[tuple[float, int, str | None]], switch_step: int | None
                    ) -> tuple[int | None, str | None, str | None]:
    """Decode steps after the second phase starts until the policy runs the shape it then keeps
    through the stream's busy part (its last quarter excluded: the batch drains), with the shape
    before and that one; None for an engine without speculation. A shape run for a single step
    is a probe (the runner-up re-measured) or a first measurement, not a choice: it is passed
    over."""
    if switch_step is None:
        return None, None, None
    before = next((s for _, _, s in reversed(events[:switch_step]) if s is not None), None)
    ran = [s for _, _, s in events[switch_step:] if s is not None]  # (prefill steps run none)
    busy = ran[: 3 * len(ran) // 4]
    if before is None or not busy:
        return None, before, None
    runs: list[tuple[str, int, int]] = []  # (shape, first step, steps)
    for s, group in itertools.groupby(busy):
        n = len(list(group))
        runs.append((s, runs[-1][1] + runs[-1][2] if runs else 0, n))
    kept = [r for r in runs if r[2] > 1] or runs
    final = kept[-1][0]
    k = len(kept)
    while k > 0 and kept[k - 1][0] == final:
        k -= 1
    return (0 if k == 0 and final == before else kept[k][1]), before, final


def timed(engine: Engine, prompts: list[list[int]], switch: int, args: argparse.Namespace
          ) -> dict[str, Any]:
    """A short warm-up (kernels compiled, the policy's first measurements), then the stream."""
    serve(engine, prompts[: args.batch_size], args.batch_size, 16)
    return serve(engine, prompts, args.batch_size, args.max_tokens, mark=switch)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p)
    p.add_argument("--prompts", required=True, type=Path)
    p.add_argument("--first", required=True, help="categories of the first phase, comma-separated")
    p.add_argument("--then", required=True, help="categories of the second phase")
    p.add_argument("--per-phase", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--fixed", nargs="*", default=["3/1/4"], metavar="S/K/N",
                   help="fixed shapes to run beside vanilla and adaptive")
    p.add_argument("--window", type=float, default=1.0, help="seconds per tokens/s window")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None)
    args = p.parse_args(argv)
    cfg = replace(engine_config(args), max_num_seqs=args.batch_size)
    if cfg.speculative_algorithm is None:
        raise HotspecError("pass --speculative-algorithm (and a head unless the model is the default)")
    target = load_target(cfg)
    prompts, switch = stream(args.prompts, args.first.split(","), args.then.split(","),
                             args.per_phase, target.tokenizer)
    engines: dict[str, Any] = {"vanilla": replace(cfg, speculative_algorithm=None,
                                                  speculative_draft_model_path=None)}
    for f in args.fixed:
        s, k, n = (int(v) for v in f.split("/"))
        engines[f] = replace(cfg, speculative_num_steps=s, speculative_eagle_topk=k,
                             speculative_num_draft_tokens=n, speculative_adaptive=False)
    engines["adaptive"] = replace(cfg, speculative_adaptive=True)
    results = {}
    for name, ecfg in engines.items():
        print(f"engine {name}", file=sys.stderr, flush=True)
        r = run_with_engine(ecfg, target, lambda e: timed(e, prompts, switch, args))
        ev = r["events"]
        split = r["mark_step"] or len(ev)
        t_switch = ev[split - 1][0] if split else 0.0
        tok_a = sum(n for _, n, _ in ev[:split])
        tok_b = sum(n for _, n, _ in ev[split:])
        follow, before, after = steps_to_follow(ev, r["mark_step"])
        results[name] = {
            "wall_s": r["wall_s"], "tokens": tok_a + tok_b,
            "tokens_per_s": (tok_a + tok_b) / r["wall_s"],
            "first_tokens_per_s": tok_a / t_switch if t_switch else None,
            "then_tokens_per_s": tok_b / (r["wall_s"] - t_switch) if r["wall_s"] > t_switch else None,
            "steps_to_follow": follow, "shape_before": before, "shape_after": after,
            "windows": windows(ev, args.window)}
    v = results["vanilla"]["tokens_per_s"]
    lines = [f"{'engine':<10} {'tok/s':>8} {'x vanilla':>9} {'first':>8} {'then':>8} "
             f"{'shape first -> then':>22} {'steps to follow':>15}"]
    for name, r in results.items():
        shapes = f"{r['shape_before']} -> {r['shape_after']}" if r["shape_before"] else "-"
        lines.append(f"{name:<10} {r['tokens_per_s']:>8.1f} {r['tokens_per_s'] / v:>8.2f}x "
                     f"{r['first_tokens_per_s'] or 0:>8.1f} {r['then_tokens_per_s'] or 0:>8.1f} "
                     f"{shapes:>22} {str(r['steps_to_follow']):>15}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "benchmark": "benchmarks/drift_bench.py", "argv": sys.argv[1:] if argv is None else argv,
            "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "device": device_name(target.model.lm_head.weight.device), "switch_prompt": switch,
            "results": results}, indent=1))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(9, 4))
        for name, r in results.items():
            ax.plot([w["t"] for w in r["windows"]], [w["tokens_per_s"] for w in r["windows"]],
                    label=name)
        ax.set(xlabel="seconds", ylabel="tokens/s", title="drifting workload")
        ax.legend()
        fig.savefig(args.plot, dpi=100)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    run_script(main)
