"""The speculation shape by batch size, under steady load: vanilla decoding, each fixed shape of
the adaptive candidate set and --speculative-adaptive, each served the same prompt stream at each
batch size, one engine after the other on one target.

    python benchmarks/batch_bench.py --speculative-algorithm EAGLE3 \\
        --prompts ../shared/data/spec_bench_dev.jsonl --batch-sizes 1 4 8 16 32 64 --max-tokens 256

The stream takes the file's categories in turn; at batch size B it is `--rounds` x B prompts (at
least `--min-prompts`), served with B requests in flight (a new one joins whenever one finishes,
as on a loaded server). Each engine serves every batch size in turn, after a short warm-up of its
own, so the adaptive policy carries what it measured from one batch size to the next as a server
does. Per batch size: vanilla tokens/s, each engine's as a multiple of it, adaptive against the
best fixed shape, the steps adaptive ran per shape, and (float32) whether each engine's greedy
outputs are vanilla's. Prints a table last; `--out` writes every number.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hotspec.benchmark.device import device_name
from hotspec.benchmark.spec_bench import load_target, run_with_engine
from hotspec.benchmark.stream import round_robin, serve
from hotspec.config import EngineConfig
from hotspec.engine.engine import Engine
from hotspec.entrypoints.engine_args import add_engine_args, engine_config
from hotspec.errors import HotspecError
from hotspec.speculative.adaptive import SpecShape


def engines(cfg: EngineConfig, fixed: list[str]) -> dict[str, EngineConfig]:
    """vanilla, each fixed shape, adaptive: the configurations, by name."""
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
    return out


def run_all(engine: Engine, streams: dict[int, list[list[int]]], max_tokens: int
            ) -> dict[int, dict[str, Any]]:
    """Every batch size's stream on one engine, each after a warm-up of B prompts x 16 tokens."""
    out = {}
    stats = getattr(engine.worker, "stats", None)
    for b, prompts in streams.items():
        serve(engine, prompts[:b], b, 16)
        before = dict(stats.shape_steps) if stats is not None else {}
        r = serve(engine, prompts, b, max_tokens)
        tokens = sum(n for _, n, _ in r["events"])
        steps = ({k: n - before.get(k, 0) for k, n in stats.shape_steps.items()
                  if n > before.get(k, 0)} if stats is not None else {})
        out[b] = {"wall_s": r["wall_s"], "tokens": tokens, "tokens_per_s": tokens / r["wall_s"],
                  "steps": len(r["events"]), "steps_per_shape": steps, "outputs": r["outputs"]}
    return out


def table(results: dict[str, dict[int, dict[str, Any]]], sizes: list[int]) -> tuple[list[str], dict]:
    """The printed table and the per-batch-size summary."""
    names = list(results)
    fixed = [n for n in names if n not in ("vanilla", "adaptive")]
    head = f"{'batch':>5} {'vanilla':>8} " + " ".join(f"{n:>8}" for n in names[1:])
    lines = ["tokens/s of vanilla; the others as a multiple of it", head]
    summary: dict[int, dict[str, Any]] = {}
    for b in sizes:
        v = results["vanilla"][b]
        ratio = {n: results[n][b]["tokens_per_s"] / v["tokens_per_s"] for n in names[1:]}
        best = max(fixed, key=lambda n: ratio[n]) if fixed else None
        same = {n: sum(o == w for o, w in zip(results[n][b]["outputs"], v["outputs"]))
                for n in names[1:]}
        summary[b] = {"vanilla_tokens_per_s": v["tokens_per_s"], "x_vanilla": ratio,
                      "best_fixed": best, "adaptive_x_best": ratio["adaptive"] / ratio[best]
                      if best else None, "identical": same, "prompts": len(v["outputs"]),
                      "adaptive_steps": results["adaptive"][b]["steps_per_shape"]}
        lines.append(f"{b:>5} {v['tokens_per_s']:>8.1f} "
                     + " ".join(f"{ratio[n]:>7.2f}x" for n in names[1:]))
    lines.append("")
    lines.append(f"{'batch':>5} {'adaptive':>9} {'best fixed':>16} {'adaptive/best':>13} "
                 f"{'identical':>10}  adaptive steps per shape")
    for b in sizes:
        s = summary[b]
        best = f"{s['best_fixed']} {s['x_vanilla'][s['best_fixed']]:.2f}x" if s["best_fixed"] else "-"
        ident = min(s["identical"].values())
        steps = ", ".join(f"{k} {n}" for k, n in sorted(s["adaptive_steps"].items(),
                                                         key=lambda kv: -kv[1]))
        lines.append(f"{b:>5} {s['x_vanilla']['adaptive']:>8.2f}x {best:>16} "
                     f"{s['adaptive_x_best'] or 0:>13.2f} {ident:>4}/{s['prompts']:<5}  {steps}")
    return lines, summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p)
    p.add_argument("--prompts", required=True, type=Path)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    p.add_argument("--rounds", type=int, default=4, help="prompts per batch size: ROUNDS x B")
    p.add_argument("--min-prompts", type=int, default=24)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--fixed", nargs="*", default=None, metavar="S/K/N",
                   help="fixed shapes beside vanilla and adaptive (default: the adaptive "
                        "candidates, --speculative-candidates)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    sizes = sorted(set(args.batch_sizes))
    cfg = replace(engine_config(args), max_num_seqs=sizes[-1])
    if cfg.speculative_algorithm is None:
        raise HotspecError("pass --speculative-algorithm (and a head unless the model is the default)")
    target = load_target(cfg)
    streams = {b: round_robin(args.prompts, None, max(args.rounds * b, args.min_prompts),
                              target.tokenizer) for b in sizes}
    fixed = args.fixed if args.fixed is not None else list(cfg.speculative_candidates)
    results: dict[str, dict[int, dict[str, Any]]] = {}
    for name, ecfg in engines(cfg, fixed).items():
        print(f"engine {name}", file=sys.stderr, flush=True)
        results[name] = run_with_engine(ecfg, target,
                                        lambda e: run_all(e, streams, args.max_tokens))
        print("  tokens/s by batch size: " + ", ".join(
            f"{b}: {r['tokens_per_s']:.1f}" for b, r in results[name].items()), file=sys.stderr,
            flush=True)
    lines, summary = table(results, sizes)
    dev = device_name(target.model.lm_head.weight.device)
    head = (f"{dev}, {cfg.dtype}; {args.max_tokens} tokens a request, greedy; "
            f"prompts per batch size: {', '.join(f'{b}: {len(streams[b])}' for b in sizes)}")
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
    try:
        sys.exit(main())
    except HotspecError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
