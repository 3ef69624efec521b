"""Time each phase of one speculative step: draft, verify (+accept), draft_extend.

For every (draft vocabulary, tree shape, batch size, graph mode) the engine is built around one
shared target, B random prompts of --context tokens are prefilled, one real speculative step is
run to record each phase's inputs, and then each phase is replayed --iters times through the
engine's GraphRunner exactly as a step calls it (copy into static buffers, replay, copy out).
Draft vocabularies: `full` (the target's LM head) or N (an FR-Spec map of N hot ids).

    python benchmarks/spec_phase_bench.py --target default --device cpu --batch-sizes 1 \\
        --shapes 5,1,6 --hot full,32768,16384,8192 --phases draft --iters 5
    python benchmarks/spec_phase_bench.py --target llama8b-shape --device cuda \\
        --batch-sizes 1,16 --shapes 5,1,6 6,8,16 --hot full,32768 --modes graphed,eager
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from decode_bench import kernel_table, timeline  # noqa: E402

from hotspec.benchmark.random_models import SHAPES, random_state  # noqa: E402
from hotspec.config import EngineConfig  # noqa: E402
from hotspec.engine.engine import Engine  # noqa: E402
from hotspec.models.build import build_target  # noqa: E402
from hotspec.models.default_model import default_draft_head, default_model_path  # noqa: E402
from hotspec.models.draft_checkpoint import random_draft_checkpoint  # noqa: E402
from hotspec.models.loader import load_checkpoint  # noqa: E402
from hotspec.sampling_params import SamplingParams  # noqa: E402


def build_target_model(args, device, dtype):
    if args.target == "default":
        cfg, state = load_checkpoint(default_model_path(), dtype)
    else:
        shape = SHAPES[args.target]
        cfg = replace(shape, num_hidden_layers=args.target_layers or shape.num_hidden_layers,
                      max_position_embeddings=8192)
        state = random_state(cfg, device, dtype)
    return cfg, build_target(cfg, state, dtype, device)


def time_phase(engine: Engine, name: str, inputs: dict, iters: int) -> float:
    dev = engine.device
    run = engine.graphs.run
    for _ in range(3):
        run(name, inputs)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run(name, inputs)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        return statistics.median(times)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        run(name, inputs)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", choices=["default", *SHAPES], default="default",
                   help="the default GGUF, or a shape with random weights")
    p.add_argument("--target-layers", type=int, default=None, help="shrink a shape (draft-only runs)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--batch-sizes", default="1,16")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="the engine's static context bound (default: --context + 64). The "
                        "attention's kv split count follows it, not the real length, so a "
                        "server's bound (the model's context) gives more splits than the default")
    p.add_argument("--shapes", nargs="+", default=["5,1,6", "6,8,16"])
    p.add_argument("--hot", default="full,32768")
    p.add_argument("--modes", default="graphed,eager",
                   help="graphed and/or eager")
    p.add_argument("--phases", default="draft,verify,draft_extend",
                   help="draft, verify, draft_extend (each its own graph), or step alone: the "
                        "engine's default fused step graph (fuse_spec_step)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--draft", default="random",
                   help="`random` (a random EAGLE-1 head), `default` (the shipped EAGLE-3 head of "
                        "the default model) or the path of an EAGLE-3 head")
    p.add_argument("--kernels", action="store_true",
                   help="graphed: print the kernels of one replay of each phase (torch.profiler)")
    p.add_argument("--timeline", type=int, default=0, metavar="N",
                   help="graphed: each phase graph's idle time between kernels per replay, and the "
                        "last N kernels of one replay and the first N of the next (torch.profiler)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    fused_step = "step" in args.phases.split(",")
    if fused_step and args.phases != "step":
        p.error("--phases step times the fused step graph, alone; the others need unfused graphs")
    device = torch.device(args.device)
    default_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = getattr(torch, args.dtype) if args.dtype else default_dtype
    if device.type != "cuda":
        args.modes = "eager"
    model_cfg, target = build_target_model(args, device, dtype)
    tmp = Path(tempfile.mkdtemp())
    algorithm = "EAGLE3"
    if args.draft == "random":
        head, algorithm = random_draft_checkpoint(tmp / "head", model_cfg, "EAGLE", seed=0), "EAGLE"
    elif args.draft == "default":
        head = default_draft_head()
    else:
        head = Path(args.draft)
    rows = []
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    for hot in args.hot.split(","):
        tmap = None
        if hot != "full":
            tmap = str(tmp / f"freq_{hot}.pt")
            torch.save(list(range(int(hot))), tmap)
        for shape in args.shapes:
            steps, topk, ntok = (int(x) for x in shape.split(","))
            for mode in args.modes.split(","):
                cfg = EngineConfig(
                    device="auto", dtype="auto", skip_tokenizer_init=True, kv_cache_memory_gb=2.0,
                    max_model_len=args.max_model_len or args.context + 64, max_num_seqs=max(batch_sizes),
                    cuda_graph_max_bs=max(batch_sizes), disable_cuda_graph=(mode == "eager"),
                    speculative_algorithm=algorithm, speculative_draft_model_path=str(head),
                    speculative_num_steps=steps, speculative_eagle_topk=topk,
                    speculative_num_draft_tokens=ntok, speculative_token_map=tmap,
                    fuse_spec_step=fused_step)  # unfused: each phase its own graph, timed apart
                engine = Engine.from_model(cfg, model_cfg, target)
                for bs in batch_sizes:
                    rows += bench_one(engine, args, bs, hot, shape, mode)
                    print(json.dumps(rows[-1]), flush=True)
                engine.graphs.close()
                del engine
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    print_table(rows)


def bench_one(engine: Engine, args, bs: int, hot: str, shape: str, mode: str) -> list[dict]:
    g = torch.Generator().manual_seed(bs)
    vocab = engine.model_config.vocab_size
    reqs = [engine.add_request(torch.randint(0, vocab, (args.context,), generator=g).tolist(),
                               SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
            for _ in range(bs)]
    seen: dict[str, dict] = {}
    real = engine.graphs.run

    def spy(name, inputs, **kw):
        seen[name] = inputs
        return real(name, inputs, **kw)

    engine.step()  # prefill
    engine.graphs.run = spy
    engine.step()  # one real speculative step records every phase's inputs
    engine.graphs.run = real
    out = []
    for phase in args.phases.split(","):
        ms = time_phase(engine, phase, seen[phase], args.iters)
        out.append({"target": args.target, "hot": hot, "shape": shape, "bs": bs, "mode": mode,
                    "phase": phase, "ms": round(ms, 4)})
        if args.kernels and engine.graphs.mode == "cuda":
            print(f"[{hot} {shape}] " + kernel_table(engine, bs, top=25, phase=phase), flush=True)
        if args.timeline and engine.graphs.mode == "cuda":
            print(f"[{hot} {shape}] " + timeline(engine, bs, args.timeline, phase=phase), flush=True)
    for r in reqs:
        engine.abort(r)
    return out


def print_table(rows: list[dict]) -> None:
    print("\ntarget        hot    shape    bs  mode     phase          ms    vs full  graphed/eager")
    full = {(r["shape"], r["bs"], r["mode"], r["phase"]): r["ms"] for r in rows if r["hot"] == "full"}
    eager = {(r["hot"], r["shape"], r["bs"], r["phase"]): r["ms"] for r in rows if r["mode"] == "eager"}
    for r in rows:
        f = full.get((r["shape"], r["bs"], r["mode"], r["phase"]))
        e = eager.get((r["hot"], r["shape"], r["bs"], r["phase"]))
        vs_full = f"{f / r['ms']:.2f}x" if f and r["hot"] != "full" else "-"
        vs_eager = f"{e / r['ms']:.2f}x" if e and r["mode"] != "eager" else "-"
        print(f"{r['target']:<13} {r['hot']:<6} {r['shape']:<8} {r['bs']:>3}  {r['mode']:<8} "
              f"{r['phase']:<13} {r['ms']:>8.3f}  {vs_full:>7}  {vs_eager:>7}")


if __name__ == "__main__":
    main()
