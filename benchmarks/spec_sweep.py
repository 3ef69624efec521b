"""Speculative configurations side by side: one target, one vanilla pass, then one pass per variant.

`hotspec bench` compares one speculative configuration with vanilla decoding. Choosing a tree
shape, the fused step graph or a token map means comparing several, and each `hotspec bench`
rebuilds the target and re-runs vanilla. This script loads the target once, times vanilla once,
then each variant in an engine of its own (released before the next), on the same prompts:

    python benchmarks/spec_sweep.py --speculative-algorithm EAGLE3 [engine options] \\
        --prompts ../shared/data/spec_bench_dev.jsonl --num-prompts 26 --max-tokens 256 \\
        --variants 6/8/16:unfused 6/8/16 4/1/5 8/10/60 6/8/16:map=freq_16384.pt

A variant is STEPS/TOPK/DRAFT_TOKENS, or `adaptive` (--speculative-adaptive over the default
candidates; the table then lists its steps per shape), then options joined by ':': `fused` / `unfused`
(--fuse-spec-step / --no-fuse-spec-step; else the engine options' setting, fused by default),
`map=PATH` (--speculative-token-map; `map=none` drops the engine options' map), `draft=DIR`
(--speculative-draft-model-path: two heads side by side; `draft=default` is the default model's
shipped head), `overlap` / `plain` (--overlap-schedule or not; vanilla follows the engine
options), `profile` (a second, phase-timed pass over the prompts; `profile=N`: over the first N
only, enough for the phases' ms a call at a fraction of the time). Greedy; prints a table last
(tau: the mean over requests with its 95 % confidence interval, and the acceptance rate at each
draft depth; tokens/s end to end and decode only, speedup over vanilla, ms per speculative step
(wall per engine decode step; `rows`: requests per step on average, as batches thin out at the
end), greedy outputs identical to vanilla, and on CUDA the fused step graph
replayed alone: its device time, so ms/step minus it is host time) and writes every number to
--out.

At batch 1 each category runs on its own (per-category figures in the JSON). At a larger batch
the prompts run as one stream in the order read (round robin over the categories), so batches
stay full: run by category, a file of 13 categories at 24 prompts would hold about two rows per
step whatever --batch-size says (`--by-category` keeps the per-category runs anyway).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hotspec.benchmark.device import device_name
from hotspec.benchmark.modes import RunOptions, run_speculative, run_vanilla
from hotspec.benchmark.prompts import prompt_ids, read_bench_prompts
from hotspec.benchmark.report import ci95, first_mismatch, mode_summary, phase_breakdown, spec_summary
from hotspec.benchmark.script import run_script
from hotspec.benchmark.spec_bench import BatchRun, load_target
from hotspec.cli.engine_args import add_engine_args, engine_config
from hotspec.core.spec_shape import SpecShape
from hotspec.engine.engine import Engine
from hotspec.errors import HotspecError
from hotspec.runtime.timing import graph_replay_ms

PROFILE_ALL = sys.maxsize  # `profile`: the profiled pass runs every prompt


def parse_variant(text: str) -> tuple[dict[str, Any], int | None]:
    """'6/8/16:unfused:map=P:profile=8' -> (EngineConfig overrides, prompts of the profiled pass:
    None for none, PROFILE_ALL for `profile`); 'adaptive' (or 'adaptive:...') is
    --speculative-adaptive over the default candidates."""
    shape, *opts = text.split(":")
    over: dict[str, Any]
    if shape == "adaptive":
        over = {"speculative_adaptive": True}
    else:
        try:
            s = SpecShape.parse(shape)
        except ValueError as e:
            raise HotspecError(f"variant {text!r}: {e}; a variant is STEPS/TOPK/DRAFT_TOKENS"
                               "[:fused][:map=PATH][:profile] or adaptive, e.g. 6/8/16:fused") from None
        if s.off:
            raise HotspecError(f"variant {text!r}: vanilla runs in every sweep; name a speculation shape")
        over = {"speculative_num_steps": s.num_steps, "speculative_eagle_topk": s.topk,
                "speculative_num_draft_tokens": s.num_draft_tokens}
    profile: int | None = None
    for o in opts:
        if o in ("fused", "unfused"):
            over["fuse_spec_step"] = o == "fused"
        elif o in ("overlap", "plain"):
            over["overlap_schedule"] = o == "overlap"
        elif o == "profile":
            profile = PROFILE_ALL
        elif o.startswith("profile=") and o[8:].isdigit() and int(o[8:]) > 0:
            profile = int(o[8:])
        elif o.startswith("map="):
            over["speculative_token_map"] = None if o[4:] == "none" else o[4:]
        elif o.startswith("draft="):
            over["speculative_draft_model_path"] = None if o[6:] == "default" else o[6:]
        else:
            raise HotspecError(f"variant {text!r}: unknown option {o!r} (fused, unfused, overlap, "
                               "plain, profile, profile=N, map=PATH, draft=DIR)")
    return over, profile


def first_prompts(groups: dict[str, list[list[int]]], n: int) -> dict[str, list[list[int]]]:
    """The first `n` prompts of `groups`, in their order, grouped as they were."""
    out: dict[str, list[list[int]]] = {}
    for c, ids in groups.items():
        if n <= 0:
            break
        out[c], n = ids[:n], n - len(ids[:n])
    return out


def step_replay_ms(engine: Engine, batch_size: int, iters: int = 30) -> float | None:
    """Device time of one speculative step: the greedy `step` graph of `batch_size` replayed
    alone, on the inputs the timed pass left in its static buffers (the requests are finished,
    so the KV it writes is dead). ms/step minus this is host time. None without a fused CUDA
    graph."""
    graph = engine.graphs.captured("step", batch_size)
    return graph_replay_ms(graph, iters) if graph is not None else None


def _flat(runs: dict[str, BatchRun]) -> list[BatchRun]:
    return list(runs.values())


def _identical(vanilla: dict[str, BatchRun], spec: dict[str, BatchRun]) -> tuple[int, int]:
    pairs = [(a, b) for c in vanilla for a, b in zip(vanilla[c].outputs, spec[c].outputs)]
    return sum(first_mismatch(a, b) is None for a, b in pairs), len(pairs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p)
    p.add_argument("--prompts", required=True, type=Path)
    p.add_argument("--num-prompts", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--warmup-tokens", type=int, default=16)
    p.add_argument("--by-category", action=argparse.BooleanOptionalAction, default=None,
                   help="run each category on its own (default: at batch 1 only; else one stream)")
    p.add_argument("--variants", nargs="+", required=True,
                   metavar="S/K/N[:fused][:overlap][:map=P][:draft=D][:profile[=N]]")
    p.add_argument("--out", type=Path, default=None, help="JSON with every number")
    args = p.parse_args(argv)
    cfg = engine_config(args)
    if cfg.speculative_algorithm is None:
        raise HotspecError("pass --speculative-algorithm (and a head unless the model is the default)")
    base = replace(cfg, max_num_seqs=args.batch_size, profile_phases=False)
    variants = []  # bad variants (syntax or engine options) fail here, before anything loads
    for v in args.variants:
        over, profile = parse_variant(v)
        variants.append((v, replace(base, **over), over, profile))
    vanilla_cfg = replace(base, speculative_algorithm=None, speculative_draft_model_path=None,
                          speculative_token_map=None)
    prompts = read_bench_prompts(args.prompts, args.num_prompts)
    started = datetime.now(timezone.utc)
    target = load_target(cfg)
    by_category = args.by_category if args.by_category is not None else args.batch_size == 1
    groups: dict[str, list[list[int]]] = {}
    for bp in prompts:
        groups.setdefault(bp.category if by_category else "all", []).append(
            prompt_ids(bp, target.tokenizer, args.chat))
    first = [i for c in groups for i in groups[c]][: args.batch_size]
    opts = RunOptions(args.max_tokens, False, args.warmup_tokens, first)

    vanilla, _, device = run_vanilla(vanilla_cfg, target, groups, opts, False)
    v = mode_summary(_flat(vanilla))
    rows: list[dict[str, Any]] = [{"variant": "vanilla", **v}]
    for name, vcfg, over, profile in variants:
        print(f"variant {name}", file=sys.stderr, flush=True)
        replay: list[float | None] = []
        try:
            spec, profiled, source = run_speculative(
                vcfg, target, groups, opts, profile is not None,
                after_timed=lambda e, out=replay: out.append(step_replay_ms(e, args.batch_size)),
                profile_groups=None if profile is None else first_prompts(groups, profile))
        except Exception as exc:  # noqa: BLE001 - one failed variant is reported, the rest still run
            print(f"variant {name} FAILED: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            rows.append({"variant": name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        s = mode_summary(_flat(spec))
        st = spec_summary(_flat(spec))
        same, n = _identical(vanilla, spec)
        steps = st["verify_steps"]
        rows.append({
            "variant": name, **s, **st, "speedup": s["tokens_per_s"] / v["tokens_per_s"],
            "decode_speedup": s["decode_tokens_per_s"] / v["decode_tokens_per_s"],
            # wall per decode step as the engine ran it (prefill steps excluded), not per
            # batch-full of verify passes, which would overstate it once batches thin out
            "ms_per_spec_step": 1e3 * s["decode_s"] / max(s["decode_steps"], 1),
            "verify_passes_per_step": steps / max(s["decode_steps"], 1),
            "greedy_identical": f"{same}/{n}", "engine_overrides": over,
            "step_replay_ms": replay[0] if replay else None,
            "per_category": {c: {"tau_mean": sum(spec[c].taus) / len(spec[c].taus),
                                 "tau_ci95": ci95(spec[c].taus),
                                 "tokens_per_s": spec[c].generated / spec[c].wall_s,
                                 "vanilla_tokens_per_s": vanilla[c].generated / vanilla[c].wall_s}
                             for c in spec},
            "phases": phase_breakdown(_flat(profiled), source) if profile else None})

    vms = 1e3 * v["decode_s"] / max(v["decode_steps"], 1)  # per engine decode step
    dtype = str(next(target.model.parameters()).dtype).removeprefix("torch.")
    overlap = (base.overlap_schedule if base.overlap_schedule is not None
               else device.type == "cuda" and not base.disable_cuda_graph)  # the vanilla run's
    head = (f"{cfg.model or 'default model'}, {dtype} on {device_name(device)}; batch "
            f"{args.batch_size}, {len(prompts)} prompts {'by category' if by_category else 'in one stream'}, "
            f"max_tokens {args.max_tokens}, greedy, "
            f"{'overlap' if overlap else 'plain'} schedule; vanilla {v['tokens_per_s']:.1f} tok/s, "
            f"{vms:.3f} ms per decode step ({v['decode_tokens'] / max(v['decode_steps'], 1):.1f} rows)")
    lines = [head, f"{'variant':<34} {'tau':>5} {'+-95%':>5} {'tok/s':>8} {'speedup':>7} {'decode x':>8} "
             f"{'ms/step':>7} {'rows':>5} {'steps/vanilla':>13} {'identical':>9} {'replay ms':>9}"]
    for r in rows[1:]:
        if "error" in r:
            lines.append(f"{r['variant']:<34} FAILED: {r['error'][:120]}")
            continue
        ci = f"{r['tau_ci95']:>5.2f}" if r["tau_ci95"] is not None else f"{'-':>5}"
        lines.append(f"{r['variant']:<34} {r['tau_mean']:>5.2f} {ci} {r['tokens_per_s']:>8.1f} "
                     f"{r['speedup']:>6.2f}x {r['decode_speedup']:>7.2f}x {r['ms_per_spec_step']:>7.3f} "
                     f"{r['verify_passes_per_step']:>5.1f} {r['ms_per_spec_step'] / vms:>13.2f} "
                     f"{r['greedy_identical']:>9} "
                     + (f"{r['step_replay_ms']:>9.3f}" if r["step_replay_ms"] is not None else f"{'-':>9}"))
        if r["acceptance_by_depth"]:
            lines.append("    accepted at draft depth: " + ", ".join(
                f"d{e['depth']} {e['rate']:.0%}" for e in r["acceptance_by_depth"])
                + ("" if r["hot_coverage"] >= 1
                   else f"; the draft vocabulary covers {r['hot_coverage']:.1%} of the served tokens"))
        if len(r.get("steps_per_shape", {})) > 1:  # the adaptive variant: what it chose
            lines.append("    steps per shape: " + ", ".join(
                f"{k} {n}" for k, n in r["steps_per_shape"].items()))
        if r["phases"]:
            ph = r["phases"]["phases"]
            lines.append("    profiled ms/call: " + ", ".join(
                f"{k} {e['ms_per_call']:.3f}" for k, e in ph.items() if e["ms_per_call"] is not None))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "benchmark": "benchmarks/spec_sweep.py", "argv": sys.argv[1:] if argv is None else argv,
            "date_utc": started.strftime("%Y-%m-%d %H:%M UTC"), "device": device_name(device),
            "vanilla_ms_per_step": vms, "rows": rows}, indent=2, default=str))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    run_script(main)
