"""Decode throughput of hotspec's own engine: vanilla decoding, eager, torch reference attention.

Every timed step is one `Engine.step()` (batch building, attention planning, the forward pass,
the LM head, greedy sampling, stop checks), so host overheads are included, as a user sees them.

    python benchmarks/decode_bench.py --model default --device cpu --batch-sizes 1,8 \\
        --context 512 --tokens 16 --out cpu.json
    python benchmarks/decode_bench.py --model llama8b-shape --device cuda --batch-sizes 1,8,32 \\
        --context 512 --tokens 64 --out h200.json

Run from the repository root; without `pip install -e .`, prefix `PYTHONPATH=.` (hotspec imports
the `gguf` package at load time, so a machine without it needs it on PYTHONPATH too).

`llama8b-shape` is Llama-3.1-8B's shape with random weights generated on the device (no files);
`smollm2-shape` the default model's, likewise.
Weight bytes per step count every Linear weight and norm once (a tied embedding is read once, as
the LM head); the embedding gather is negligible. Achieved bandwidth is that over the median
step time; on CUDA it is also given as a fraction of the H200 roofline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch import nn

from hotspec.benchmark.device import device_name
from hotspec.benchmark.hf_baseline import hf_generate_tokens_per_s
from hotspec.benchmark.random_models import SHAPES, random_state
from hotspec.config import EngineConfig
from hotspec.engine.engine import Engine, resolve_device_dtype
from hotspec.layers import fused
from hotspec.layers.norm import RMSNorm
from hotspec.models.build import build_target
from hotspec.sampling_params import SamplingParams

H200_BANDWIDTH = 4.37e12  # bytes/s, the roofline the fraction is reported against
BLOCK_SIZE = 16
EAGER_TORCH_REF = {"attention_backend": "torch", "disable_cuda_graph": True}



@dataclass
class Result:
    batch_size: int
    steps: int
    ms_per_step: float  # median
    ms_per_step_min: float
    tokens_per_s: float
    weight_bytes_per_step: int
    weight_gb_per_s: float
    roofline_fraction: float | None  # cuda only
    prefill_ms: float
    replay_ms: float | None = None  # graphed: the decode graph replayed alone (GPU time)


def weight_bytes_per_step(model: nn.Module) -> int:
    """Bytes of every Linear and norm parameter, each tensor once (a tied LM head is the embedding)."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        if isinstance(module, (nn.Linear, RMSNorm)):
            for p in module.parameters(recurse=False):
                if p.data_ptr() not in seen:
                    seen.add(p.data_ptr())
                    total += p.numel() * p.element_size()
    return total


def build_engine(args: argparse.Namespace, num_kv_blocks: int, max_batch: int) -> Engine:
    # eager-torch: the issue-2 baseline (eager, torch reference attention); graphed: Triton
    # attention with every decode step replayed from a CUDA graph.
    known = {f.name for f in fields(EngineConfig)}
    pinned = {k: v for k, v in EAGER_TORCH_REF.items() if k in known}
    if args.mode == "graphed":
        pinned = {"attention_backend": "auto", "disable_cuda_graph": False,
                  "cuda_graph_max_bs": max_batch}
    elif args.mode == "eager-triton":
        pinned = {"attention_backend": "triton", "disable_cuda_graph": True}
    # whole prompts, every prefill step before the first decode step (a batch larger than the
    # prefill graphs' largest bucket prefills in several steps), so every timed step is a decode step
    cfg = EngineConfig(dtype=args.dtype, device=args.device, block_size=BLOCK_SIZE,
                       num_kv_blocks=num_kv_blocks, max_num_seqs=max_batch, skip_tokenizer_init=True,
                       max_prefill_tokens=None, decode_during_prefill=False,
                       overlap_schedule=args.overlap_schedule,
                       seed=args.seed, deterministic=args.deterministic, **pinned)
    if args.model == "default":
        return Engine(cfg)
    device, dtype = resolve_device_dtype(cfg)
    if args.dtype == "auto":
        dtype = torch.bfloat16
    model_cfg = SHAPES[args.model]
    if args.num_layers is not None:
        model_cfg = replace(model_cfg, num_hidden_layers=args.num_layers)
    target = build_target(model_cfg, random_state(model_cfg, device, dtype, args.seed), dtype, device)
    return Engine.from_model(replace(cfg, dtype="auto", device="auto"), model_cfg, target)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(engine: Engine, batch: int, context: int, warmup: int, tokens: int, seed: int,
            weight_bytes: int) -> Result:
    gen = torch.Generator().manual_seed(seed + batch)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=1 + warmup + tokens, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(torch.randint(0, vocab, (context,), generator=gen).tolist(), params)
    dev = engine.device
    _sync(dev)
    t0 = time.perf_counter()
    outs = engine.step()  # prefill steps, until every request has its first token
    while engine.prefilling and len(outs) < batch:
        outs += engine.step()
    _sync(dev)
    prefill_ms = (time.perf_counter() - t0) * 1e3
    if len(outs) != batch or engine.waiting:
        raise RuntimeError(f"prefill admitted {len(outs)} of {batch} requests; raise num_kv_blocks")
    # Overlap schedule: the first decode step only launches, and no step syncs beyond its own
    # read, so each timed step is the pipeline's period (launch N+1, read N).
    overlap = engine.worker.overlapping
    if overlap and engine.step():
        raise RuntimeError("the overlap schedule's first decode step returned tokens")
    times: list[float] = []
    for i in range(warmup + tokens):
        if not overlap:
            _sync(dev)
        t0 = time.perf_counter()
        outs = engine.step()
        if not overlap:
            _sync(dev)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        if len(outs) != batch or any(len(o.new_token_ids) != 1 for o in outs):
            raise RuntimeError(f"decode step {i} produced {[len(o.new_token_ids) for o in outs]}")
    if engine.has_unfinished() or engine.allocator.num_free != engine.allocator.num_blocks:
        raise RuntimeError("requests still running or KV blocks held after the last step")
    med = statistics.median(times)
    replay_ms = _replay_only_ms(engine, batch, tokens)
    return Result(replay_ms=replay_ms, batch_size=batch, steps=len(times), ms_per_step=med * 1e3,
                  ms_per_step_min=min(times) * 1e3, tokens_per_s=batch / med,
                  weight_bytes_per_step=weight_bytes, weight_gb_per_s=weight_bytes / med / 1e9,
                  roofline_fraction=weight_bytes / med / H200_BANDWIDTH if dev.type == "cuda" else None,
                  prefill_ms=prefill_ms)


def _replay_only_ms(engine: Engine, batch: int, n: int) -> float | None:
    """Median of 5 timings of `n` back-to-back replays of the captured decode graph (one sync per
    timing): the GPU's own time per step, so step time minus this is the host's share."""
    graph = engine.graphs.captured("decode", batch)
    if graph is None:
        return None
    runs = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            graph.replay()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - t0) / n * 1e3)
    return statistics.median(runs)


def kernel_stats(engine: Engine, batch: int, phase: str = "decode") -> tuple[float, float, list]:
    """(kernels per replay, kernel ms per replay, profiler rows by total time) of one replay of
    `phase`'s graph for `batch` (torch.profiler over 10 replays)."""
    from torch.profiler import ProfilerActivity, profile

    graph = engine.graphs.captured(phase, batch)
    assert graph is not None, f"no captured {phase} graph for batch {batch}"
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            graph.replay()
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    rows.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in rows) / 10
    return sum(e.count for e in rows) / 10, total / 1e3, rows


def kernel_table(engine: Engine, batch: int, top: int = 15, phase: str = "decode") -> str:
    """The kernels of one replay of `phase`'s graph for `batch`, by total time, with the number of
    kernels per replay."""
    n, ms, rows = kernel_stats(engine, batch, phase)
    lines = [f"{phase} batch {batch}: {n:.0f} kernels per replay, {ms:.3f} ms of kernel time per replay"]
    for e in rows[:top]:
        lines.append(f"  {e.device_time_total / 10 / 1e3:8.3f} ms  x{e.count / 10:5.0f}  {e.key[:90]}")
    return "\n".join(lines)


def _replayed_kernels(engine: Engine, batch: int, phase: str, replays: int
                      ) -> list[tuple[float, float, str]]:
    """(start, end, name) of every kernel of `replays` back-to-back replays of `phase`'s graph for
    `batch` under torch.profiler (after one warm replay), in start order."""
    from torch.profiler import ProfilerActivity, profile

    graph = engine.graphs.captured(phase, batch)
    assert graph is not None, f"no captured {phase} graph for batch {batch}"
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    return sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                  if e.device_type.name == "CUDA")


def timeline(engine: Engine, batch: int, edge: int, phase: str = "decode") -> str:
    """When each kernel of `phase`'s graph runs: two replays back to back under torch.profiler,
    then the last `edge` kernels of the first and the first `edge` of the second, each with its
    start (us after the first replay's first kernel), its duration and the idle gap before it;
    and the replay's total idle time between kernels. PDL-launched kernels overlap the one
    before, so their gap is negative (their duration then includes their wait)."""
    ks = _replayed_kernels(engine, batch, phase, 2)
    n = len(ks) // 2
    t0 = ks[0][0]
    gaps = [max(0.0, ks[i][0] - ks[i - 1][1]) for i in range(1, n)]
    lines = [f"{phase} batch {batch}: {n} kernels per replay, first to last "
             f"{ks[n - 1][1] - t0:.1f} us, idle between kernels {sum(gaps):.1f} us"]
    for i in list(range(max(1, n - edge), n)) + list(range(n, min(len(ks), n + edge))):
        start, end, name = ks[i]
        mark = "| next replay" if i == n else ""
        lines.append(f"  {start - t0:9.1f} {end - start:7.1f} us  gap {start - ks[i - 1][1]:6.1f}  "
                     f"{name[:70]} {mark}")
    return "\n".join(lines)


def window(engine: Engine, batch: int, phase: str, first: int, count: int) -> str:
    """Kernels first .. first + count - 1 of one replay of `phase`'s graph (e.g. one layer's),
    each with its start (us after the replay's first kernel), its duration and the gap before it
    (negative where a PDL launch overlaps the kernel before)."""
    ks = _replayed_kernels(engine, batch, phase, 1)
    t0 = ks[0][0]
    lines = [f"{phase} batch {batch}: kernels {first}..{first + count - 1} of {len(ks)}"]
    for i in range(max(1, first), min(len(ks), first + count)):
        start, end, name = ks[i]
        lines.append(f"  {start - t0:9.1f} {end - start:7.1f} us  gap {start - ks[i - 1][1]:6.1f}  "
                     f"{name[:70]}")
    return "\n".join(lines)


def step_timeline(engine: Engine, batch: int, context: int, steps: int, seed: int, edge: int = 4) -> str:
    """What runs between two decode graphs when the engine steps (torch.profiler over `steps`
    engine steps of `batch` fresh requests): the step's period, the graph's own span (its first
    kernel to its last) and the rest, the boundary (input copies, read-back, idle); then the
    events around one boundary, each with its start (us after the step's first kernel), duration
    and gap before it."""
    from torch.profiler import ProfilerActivity, profile

    gen = torch.Generator().manual_seed(seed + 1000 + batch)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(torch.randint(0, vocab, (context,), generator=gen).tolist(), params)
    for _ in range(4):  # prefill, then warm steps
        engine.step()
    _sync(engine.device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        _sync(engine.device)
    while engine.has_unfinished():
        engine.step()
    ev = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                if e.device_type.name == "CUDA")
    heads = [i for i, e in enumerate(ev) if "decode_inputs" in e[2]]
    if len(heads) < 3:
        return f"step timeline batch {batch}: {len(heads)} decode graphs seen (no decode_inputs kernel?)"
    periods, spans = [], []
    for a, b in zip(heads, heads[1:]):
        last = max(j for j in range(a, b) if not ev[j][2].startswith(("Memcpy", "Memset")))
        periods.append(ev[b][0] - ev[a][0])
        spans.append(ev[last][1] - ev[a][0])
    med = statistics.median
    lines = [f"step timeline batch {batch}: {len(periods)} steps, period {med(periods):.1f} us, graph span "
             f"{med(spans):.1f} us, boundary {med(p - s for p, s in zip(periods, spans)):.1f} us "
             f"(copies, read-back, idle)"]
    mid = heads[len(heads) // 2]
    t0 = ev[heads[len(heads) // 2 - 1]][0]
    for i in range(max(1, mid - edge), min(len(ev), mid + edge)):
        start, end, name = ev[i]
        mark = " | next step" if i == mid else ""
        lines.append(f"  {start - t0:9.1f} {end - start:7.1f} us  gap {start - ev[i - 1][1]:6.1f}  "
                     f"{name[:70]}{mark}")
    return "\n".join(lines)


def machine(device: torch.device) -> str:
    return f"{device_name(device)}, torch {torch.__version__}"


def table(results: list[Result], cuda: bool) -> str:
    head = f"{'batch':>5} {'tok/s':>10} {'ms/step':>9} {'weights MB/step':>15} {'GB/s':>8}"
    head += f" {'of 4.37 TB/s':>12} {'replay ms':>9}" if cuda else ""
    rows = [head]
    for r in results:
        row = (f"{r.batch_size:>5} {r.tokens_per_s:>10.1f} {r.ms_per_step:>9.2f} "
               f"{r.weight_bytes_per_step / 1e6:>15.1f} {r.weight_gb_per_s:>8.1f}")
        if cuda and r.roofline_fraction is not None:
            row += f" {r.roofline_fraction:>12.1%}"
            row += f" {r.replay_ms:>9.2f}" if r.replay_ms is not None else f" {'-':>9}"
        rows.append(row)
    return "\n".join(rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("default", *SHAPES), default="default")
    p.add_argument("--device", choices=("cpu", "cuda"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
                   help="auto: the engine's rule (bfloat16 on cuda, float32 on cpu); "
                        "the random-weight shapes: bfloat16")
    p.add_argument("--batch-sizes", default="1,8", help="comma-separated, e.g. 1,8,32")
    p.add_argument("--context", type=int, default=512, help="prompt length (random token ids)")
    p.add_argument("--tokens", type=int, default=64, help="decode steps measured after warm-up")
    p.add_argument("--warmup", type=int, default=3, help="decode steps run before measuring")
    p.add_argument("--num-layers", type=int, default=None,
                   help="random-weight shapes only: fewer layers, for a quick smoke run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mode", choices=("eager-torch", "eager-triton", "graphed"), default="eager-torch")
    p.add_argument("--vs-hf", action="store_true",
                   help="also time transformers generate (static cache) on the same weights")
    p.add_argument("--kernels", action="store_true",
                   help="graphed: print the kernels of one decode step (torch.profiler)")
    p.add_argument("--timeline", type=int, default=0, metavar="N",
                   help="graphed: print when the last N kernels of one decode replay and the "
                        "first N of the next run, with the gaps between them (torch.profiler)")
    p.add_argument("--step-timeline", type=int, default=0, metavar="N",
                   help="graphed: profile N engine steps and print what runs between two decode "
                        "graphs (input copies, read-back, idle) and the events around one boundary")
    p.add_argument("--overlap-schedule", action=argparse.BooleanOptionalAction, default=None,
                   help="launch decode step N+1 before reading step N (the engine option; "
                        "default: the engine's, on with CUDA graphs)")
    p.add_argument("--deterministic", action="store_true",
                   help="the engine's --deterministic (batch-invariant kernels)")
    p.add_argument("--row-gemv", type=int, default=None, metavar="R",
                   help="run 2..R rows' projections as one-row GEMVs side by side "
                        "(layers/fused.ROW_GEMV_MAX; default: the engine's)")
    p.add_argument("--out", type=Path, default=None, help="write the results here as JSON")
    args = p.parse_args(argv)
    if args.row_gemv is not None:
        fused.ROW_GEMV_MAX = args.row_gemv
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if min(args.batch_sizes) < 1 or args.context < 1 or args.tokens < 1 or args.warmup < 0:
        p.error("batch sizes, --context and --tokens must be >= 1, --warmup >= 0")
    if args.num_layers is not None and args.model == "default":
        p.error("--num-layers only applies to the random-weight shapes (llama8b-shape, smollm2-shape)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = datetime.now(timezone.utc)
    max_batch = max(args.batch_sizes)
    generated = max(1 + args.warmup + args.tokens, args.step_timeline + 8)
    per_request = -(-(args.context + generated + 1) // BLOCK_SIZE)
    engine = build_engine(args, num_kv_blocks=max_batch * per_request, max_batch=max_batch)
    dev = engine.device
    weight_bytes = weight_bytes_per_step(engine.target)
    mc = engine.model_config
    print(f"model {args.model}: {mc.num_hidden_layers} layers, hidden {mc.hidden_size}, vocab "
          f"{mc.vocab_size}, {engine.dtype} on {dev}; weights read per step {weight_bytes / 1e9:.3f} GB",
          file=sys.stderr)
    results = []
    for b in args.batch_sizes:
        r = measure(engine, b, args.context, args.warmup, args.tokens, args.seed, weight_bytes)
        print(f"batch {b}: prefill {r.prefill_ms:.0f} ms, decode {r.ms_per_step:.2f} ms/step "
              f"(min {r.ms_per_step_min:.2f})", file=sys.stderr)
        results.append(r)
        if args.kernels and engine.graphs.mode == "cuda":
            print(kernel_table(engine, b))
        if args.timeline and engine.graphs.mode == "cuda":
            print(timeline(engine, b, args.timeline))
        if args.step_timeline and engine.graphs.mode == "cuda":
            print(step_timeline(engine, b, args.context, args.step_timeline, args.seed))
    hf_rows = []
    if args.vs_hf:
        for b in args.batch_sizes:
            hf_rows.append(hf_generate_tokens_per_s(engine, b, args.context, args.tokens, args.seed))
            print(f"transformers generate (static cache), batch {b}: {hf_rows[-1]:.1f} tok/s",
                  file=sys.stderr)
    report = {
        "benchmark": f"decode_bench (vanilla, {args.mode}, "
                     f"{'overlap' if engine.worker.overlapping else 'plain'} schedule)",
        "hf_static_cache_tokens_per_s": hf_rows,
        "command": " ".join(["python", *sys.argv]),
        "date_utc": started.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(dev),
        "model": args.model,
        "model_config": asdict(mc),
        "device": str(dev),
        "dtype": str(engine.dtype).removeprefix("torch."),
        "context": args.context,
        "warmup_steps": args.warmup,
        "weight_bytes_per_step": weight_bytes,
        "results": [asdict(r) for r in results],
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['machine']}; {args.model}, {report['dtype']}, context {args.context}, "
          f"median of {args.tokens} steps")
    print(table(results, dev.type == "cuda"))
    for r, hf in zip(results, hf_rows):
        print(f"batch {r.batch_size}: hotspec {r.tokens_per_s:.1f} tok/s vs transformers static-cache "
              f"generate {hf:.1f} tok/s = {r.tokens_per_s / hf:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
