"""The speculation shape by batch size: vanilla decoding, each fixed shape of the adaptive
candidate set and --speculative-adaptive (also without `off`, when it is a candidate), each
given the same batches at each batch size, one engine after the other on one target (or, with
`--interleave`, all built at once, taking turns batch by batch: on a shared CPU, whose speed
drifts by 5-10 % from one minute to the next, a sequence of engines measures the drift).

    python benchmarks/batch_bench.py --speculative-algorithm EAGLE3 \\
        --prompts ../shared/data/spec_bench_dev.jsonl --batch-sizes 1 4 8 16 32 64 --max-tokens 256

At batch size B the prompts (the file's categories in turn) come as `--rounds` batches of B (at
least `--min-prompts` prompts in all), each submitted together and run to its end, as offline
batch inference does. Each engine runs every batch size in turn, after a short warm-up of its own,
so the adaptive policy carries what it measured from one batch size to the next. Per batch size:
vanilla tokens/s (end to end: prefill included), each engine's as a multiple of it, adaptive
against the best fixed shape, the steps adaptive ran per shape and its catch-ups after plain
decode, and (float32) whether each engine's greedy outputs are vanilla's. Prints a table last;
`--out` writes every number.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from hotspec.benchmark.device import device_name
from hotspec.benchmark.script import run_script
from hotspec.benchmark.spec_bench import drive, load_target, run_with_engine
from hotspec.benchmark.stream import round_robin
from hotspec.cli.engine_args import add_engine_args, engine_config
from hotspec.config import EngineConfig
from hotspec.engine.engine import Engine
from hotspec.errors import HotspecError
from hotspec.sampling_params import SamplingParams
from hotspec.speculative.adaptive import SpecShape


def engines(cfg: EngineConfig, fixed: list[str]) -> dict[str, EngineConfig]:
    """vanilla, each fixed shape, adaptive (and adaptive without off): the configurations."""
    out = {"vanilla": replace(cfg, speculative_algorithm=None, speculative_draft_model_path=None,
                              speculative_token_map=None)}
    for f in fixed:
        s = SpecShape.parse(f)
        if s.off:
            continue
        out[s.label] = replace(cfg, speculative_num_steps=s.num_steps, speculative_eagle_topk=s.topk,
                               speculative_num_draft_tokens=s.num_draft_tokens,
                               speculative_adaptive=False)
    out["adaptive"] = replace(cfg, speculative_adaptive=True)
    spec = tuple(c for c in cfg.speculative_candidates if not SpecShape.parse(c).off)
    if len(spec) < len(cfg.speculative_candidates):
        out["adaptive w/o off"] = replace(cfg, speculative_adaptive=True, speculative_candidates=spec)
    return out


def run_all(engines: dict[str, Engine], prompts: dict[int, list[list[int]]], max_tokens: int
            ) -> dict[str, dict[int, dict[str, Any]]]:
    """Every batch size's batches on each engine, each size after a warm-up: every batch of it
    for 4 tokens (each prompt's prefill shape compiled, whichever engine runs first), then the
    first for 16. With several engines, they take turns batch by batch (a machine whose speed
    drifts, as a shared CPU's does, slows them alike)."""
    out: dict[str, dict[int, dict[str, Any]]] = {n: {} for n in engines}
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    for b, ps in prompts.items():
        for engine in engines.values():
            for i in range(0, len(ps), b):
                drive(engine, ps[i:i + b], SamplingParams(temperature=0.0, max_tokens=4))
            drive(engine, ps[:b], SamplingParams(temperature=0.0, max_tokens=16))
        runs: dict[str, list[Any]] = {n: [] for n in engines}
        for i in range(0, len(ps), b):
            for n, engine in engines.items():
                runs[n].append(drive(engine, ps[i:i + b], params))
        for n in engines:
            out[n][b] = _summary(runs[n])
    return out


def _summary(runs: list[Any]) -> dict[str, Any]:
    wall = sum(r.wall_s for r in runs)
    outputs = [o for r in runs for o in r.outputs]
    tokens = sum(len(o) for o in outputs)
    shapes: Counter[str] = Counter()
    catch_ups = 0
    for r in runs:
        if r.stats is not None:
            shapes += r.stats.shape_steps
            catch_ups += r.stats.phase_calls["catch_up"]
    return {"wall_s": wall, "prefill_s": sum(r.prefill_s for r in runs), "tokens": tokens,
            "tokens_per_s": tokens / wall, "decode_steps": sum(r.decode_steps for r in runs),
            "steps_per_shape": dict(shapes), "catch_ups": catch_ups, "outputs": outputs,
            "compiles": sum(r.compiles for r in runs)}


def decode_rate(r: dict[str, Any]) -> float:
    """Tokens a second of decode time: the timed pass without its prefill steps."""
    return r["tokens"] / max(r["wall_s"] - r["prefill_s"], 1e-9)


def table(results: dict[str, dict[int, dict[str, Any]]], sizes: list[int]) -> tuple[list[str], dict]:
    """The printed table and the per-batch-size summary."""
    names = list(results)
    fixed = [n for n in names if n != "vanilla" and not n.startswith("adaptive")]
    w = {n: max(8, len(n)) for n in names}
    head = f"{'batch':>5} {'vanilla':>8} " + " ".join(f"{n:>{w[n]}}" for n in names[1:])
    lines = ["tokens/s of vanilla; the others as a multiple of it", head]
    summary: dict[int, dict[str, Any]] = {}
    for b in sizes:
        v = results["vanilla"][b]
        ratio = {n: results[n][b]["tokens_per_s"] / v["tokens_per_s"] for n in names[1:]}
        decode = {n: decode_rate(results[n][b]) / decode_rate(v) for n in names[1:]}
        best = max(fixed, key=lambda n: ratio[n]) if fixed else None
        same = {n: sum(o == w for o, w in zip(results[n][b]["outputs"], v["outputs"]))
                for n in names[1:]}
        summary[b] = {"vanilla_tokens_per_s": v["tokens_per_s"], "x_vanilla": ratio,
                      "best_fixed": best, "adaptive_x_best": ratio["adaptive"] / ratio[best]
                      if best else None, "decode_x_vanilla": decode, "identical": same,
                      "prompts": len(v["outputs"]),
                      "adaptive_steps": results["adaptive"][b]["steps_per_shape"],
                      "adaptive_catch_ups": results["adaptive"][b]["catch_ups"]}
        lines.append(f"{b:>5} {v['tokens_per_s']:>8.1f} "
                     + " ".join(f"{ratio[n]:>{w[n] - 1}.2f}x" for n in names[1:]))
    lines.append("")
    lines.append("decode only (prefill time left out), as a multiple of vanilla's")
    lines.append(head)
    for b in sizes:
        d = summary[b]["decode_x_vanilla"]
        lines.append(f"{b:>5} {decode_rate(results['vanilla'][b]):>8.1f} "
                     + " ".join(f"{d[n]:>{w[n] - 1}.2f}x" for n in names[1:]))
    lines.append("")
    lines.append(f"{'batch':>5} {'adaptive':>9} {'best fixed':>16} {'adaptive/best':>13} "
                 f"{'identical':>10}  adaptive steps per shape (catch-ups)")
    for b in sizes:
        s = summary[b]
        best = f"{s['best_fixed']} {s['x_vanilla'][s['best_fixed']]:.2f}x" if s["best_fixed"] else "-"
        ident = min(s["identical"].values())
        steps = ", ".join(f"{k} {n}" for k, n in sorted(s["adaptive_steps"].items(),
                                                         key=lambda kv: -kv[1]))
        lines.append(f"{b:>5} {s['x_vanilla']['adaptive']:>8.2f}x {best:>16} "
                     f"{s['adaptive_x_best'] or 0:>13.2f} {ident:>4}/{s['prompts']:<5}  {steps} "
                     f"({s['adaptive_catch_ups']})")
    compiled = [f"{n} b{b}: {results[n][b]['compiles']}" for n in names for b in sizes
                if results[n][b]["compiles"]]
    if compiled:  # (each one held its step for the compile: that engine's figure is not clean)
        lines.append("Triton kernels compiled inside timed passes: " + ", ".join(compiled))
    return lines, summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p)
    p.add_argument("--prompts", required=True, type=Path)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    p.add_argument("--rounds", type=int, default=4, help="batches per batch size")
    p.add_argument("--min-prompts", type=int, default=24)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--fixed", nargs="*", default=None, metavar="S/K/N",
                   help="fixed shapes beside vanilla and adaptive (default: the adaptive "
                        "candidates, --speculative-candidates)")
    p.add_argument("--interleave", action="store_true",
                   help="build every engine at once and give them each batch in turn, not one "
                   "engine after the other: for a machine whose speed drifts (a shared CPU); "
                   "each engine holds its KV cache throughout")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    sizes = sorted(set(args.batch_sizes))
    cfg = replace(engine_config(args), max_num_seqs=sizes[-1])
    if cfg.speculative_algorithm is None:
        raise HotspecError("pass --speculative-algorithm (and a head unless the model is the default)")
    target = load_target(cfg)
    prompts = {b: round_robin(args.prompts, None, max(args.rounds * b, args.min_prompts),
                              target.tokenizer) for b in sizes}
    fixed = args.fixed if args.fixed is not None else list(cfg.speculative_candidates)
    results: dict[str, dict[int, dict[str, Any]]] = {}
    cfgs = engines(cfg, fixed)
    if args.interleave:
        built = {n: Engine.from_model(c, target.model_config, target.model, target.tokenizer)
                 for n, c in cfgs.items()}
        results = run_all(built, prompts, args.max_tokens)
    for name, ecfg in cfgs.items():
        if not args.interleave:
            print(f"engine {name}", file=sys.stderr, flush=True)
            results[name] = run_with_engine(
                ecfg, target, lambda e, n=name: run_all({n: e}, prompts, args.max_tokens)[n])
        print(f"{name}: tokens/s by batch size: " + ", ".join(
            f"{b}: {r['tokens_per_s']:.1f}" for b, r in results[name].items()), file=sys.stderr,
            flush=True)
    lines, summary = table(results, sizes)
    dev = device_name(target.model.lm_head.weight.device)
    head = (f"{dev}, {cfg.dtype}; {args.max_tokens} tokens a request, greedy; "
            f"prompts per batch size: {', '.join(f'{b}: {len(prompts[b])}' for b in sizes)}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "benchmark": "benchmarks/batch_bench.py", "argv": sys.argv[1:] if argv is None else argv,
            "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": dev,
            "summary": summary,
            "results": {n: {b: {k: v for k, v in r.items() if k != "outputs"} for b, r in per.items()}
                        for n, per in results.items()}}, indent=1))
    print(head)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    run_script(main)
