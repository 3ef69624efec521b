"""Each phase of one speculative step and the fused step, beside a vanilla decode step of the
same target, with kernels per replay and the bytes-read bound of each.

For every (draft vocabulary, tree shape, batch size, graph mode) the engine is built around one
shared target with both the fused step graph and the phase graphs, B random prompts of
--context tokens are prefilled, one real fused step and one real phased step record each graph's
inputs, and each graph is then replayed --iters times through the engine's GraphRunner exactly as
a step calls it. A vanilla engine over the same target times a decode step at each batch size.

Bounds (weights read once, KV ignored): decode and verify read the target's weights; each draft
forward and draft_extend read the draft head's (its LM head included); the step reads the target
once and the head num_steps times. A phase's "of bound" is its bound over its time.

    python benchmarks/spec_phase_bench.py --target llama8b-shape --draft eagle3:32768 \\
        --batch-sizes 1,8,32 --shapes 3,1,4 5,1,6 7,1,8 4,8,12 6,8,16
    python benchmarks/spec_phase_bench.py --target default --draft default --batch-sizes 1,8,32 \\
        --shapes 3,1,4 4,8,12
    python benchmarks/spec_phase_bench.py --target smollm2-shape --device cpu --batch-sizes 1 \\
        --shapes 3,1,4 --draft eagle3:4096 --iters 2     # a smoke run on the CPU (eager)

Draft heads: `random` (an EAGLE-1 head on the target's LM head), `eagle3:N` (a random EAGLE-3
head with its own N-token LM head and d2t), `default` (the shipped head of the default model) or
the path of a head; `--hot full,32768` adds FR-Spec maps of N hot ids.
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
from decode_bench import H200_BANDWIDTH, kernel_stats, kernel_table, weight_bytes_per_step, window  # noqa: E402

from hotspec.benchmark.random_models import SHAPES, random_state  # noqa: E402
from hotspec.config import EngineConfig  # noqa: E402
from hotspec.core.spec_shape import SpecShape
from hotspec.engine.engine import Engine  # noqa: E402
from hotspec.layers import fused  # noqa: E402
from hotspec.models.build import build_target  # noqa: E402
from hotspec.models.default_model import default_draft_head, default_model_path  # noqa: E402
from hotspec.models.draft_checkpoint import random_draft_checkpoint  # noqa: E402
from hotspec.models.loader import load_checkpoint  # noqa: E402
from hotspec.sampling_params import SamplingParams  # noqa: E402

PHASES = ("draft", "verify", "draft_extend", "step")


def build_target_model(args, device, dtype):
    if args.target == "default":
        cfg, state = load_checkpoint(default_model_path(), dtype)
    else:
        shape = SHAPES[args.target]
        cfg = replace(shape, num_hidden_layers=args.target_layers or shape.num_hidden_layers,
                      max_position_embeddings=8192)
        state = random_state(cfg, device, dtype)
    return cfg, build_target(cfg, state, dtype, device)


def draft_head(spec: str, model_cfg, tmp: Path) -> tuple[Path, str]:
    if spec == "random":
        return random_draft_checkpoint(tmp / "head", model_cfg, "EAGLE", seed=0), "EAGLE"
    if spec.startswith("eagle3:"):
        n = int(spec.split(":", 1)[1])
        return random_draft_checkpoint(tmp / f"head3_{n}", model_cfg, "EAGLE3", seed=0,
                                       draft_vocab_size=n), "EAGLE3"
    return (default_draft_head() if spec == "default" else Path(spec)), "EAGLE3"


def timed_ms(fn, device: torch.device, iters: int) -> float:
    """Median wall (CPU) or device-event (CUDA) milliseconds of `fn`, after three warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def add_requests(engine: Engine, bs: int, context: int) -> list:
    """`bs` random prompts of `context` tokens, prefilled (in chunks where they exceed
    max_prefill_tokens), each with its first token."""
    g = torch.Generator().manual_seed(bs)
    vocab = engine.model_config.vocab_size
    reqs = [engine.add_request(torch.randint(0, vocab, (context,), generator=g).tolist(),
                               SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
            for _ in range(bs)]
    while engine.waiting or engine.prefilling:
        engine.step()
    return reqs


def decode_ms(engine: Engine, bs: int, args) -> tuple[float, float | None]:
    """A vanilla decode step at `bs`: its graph replayed alone (CUDA) or one engine step (CPU);
    and the kernels per replay (CUDA)."""
    reqs = add_requests(engine, bs, args.context)
    graph = engine.graphs.captured("decode", bs)
    if graph is not None:
        ms = timed_ms(graph.replay, engine.device, args.iters)
        kernels = kernel_stats(engine, bs, "decode")[0]
        if args.kernels:
            print(kernel_table(engine, bs, args.kernels, "decode"), flush=True)
        if args.window:
            print(window(engine, bs, "decode", *args.window), flush=True)
    else:
        ms, kernels = timed_ms(engine.step, engine.device, args.iters), None
    for r in reqs:
        engine.abort(r)
    return ms, kernels


def phase_rows(engine: Engine, bs: int, args) -> dict[str, tuple[float, float | None]]:
    """Each phase graph and the fused step at `bs`, replayed from the inputs of real steps."""
    reqs = add_requests(engine, bs, args.context)
    seen: dict[str, dict] = {}
    real = engine.graphs.run

    def spy(name, inputs, **kw):
        seen[name] = inputs
        return real(name, inputs, **kw)

    worker = engine.worker
    engine.graphs.run = spy  # type: ignore[method-assign]
    worker.profile = False
    engine.step()  # a fused step (and any launched step read)
    worker.profile = True
    engine.step()  # a phased step: draft, verify, draft_extend
    engine.graphs.run = real  # type: ignore[method-assign]
    out = {}
    for phase in args.phases.split(","):
        ms = timed_ms(lambda p=phase: real(p, seen[p]), engine.device, args.iters)
        kernels = kernel_stats(engine, bs, phase)[0] if engine.graphs.mode == "cuda" else None
        if args.kernels and kernels is not None:
            print(kernel_table(engine, bs, args.kernels, phase), flush=True)
        if args.window and kernels is not None:
            print(window(engine, bs, phase, *args.window), flush=True)
        out[phase] = (ms, kernels)
    for r in reqs:
        engine.abort(r)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", choices=["default", *SHAPES], default="default",
                   help="the default GGUF, or a shape with random weights")
    p.add_argument("--target-layers", type=int, default=None, help="shrink a shape (smoke runs)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cuda or cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--batch-sizes", default="1,8,32", help="comma-separated")
    p.add_argument("--context", type=int, default=512, help="prompt length (random token ids)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="the engine's static context bound (default: --context + 64)")
    p.add_argument("--shapes", nargs="+", default=["3,1,4", "7,1,8", "6,8,16"],
                   help="STEPS,TOPK,DRAFT_TOKENS each")
    p.add_argument("--hot", default="full", help="draft vocabularies: full and/or FR-Spec map sizes")
    p.add_argument("--phases", default=",".join(PHASES), help="which of " + ", ".join(PHASES))
    p.add_argument("--iters", type=int, default=20, help="timed replays per phase")
    p.add_argument("--draft", default="eagle3:32768",
                   help="random (EAGLE-1), eagle3:N (random EAGLE-3, N-token LM head), default, "
                        "or a head's path")
    p.add_argument("--kernels", type=int, default=0,
                   help="print each graph's N kernels of most total time (CUDA)")
    p.add_argument("--window", type=int, nargs=2, metavar=("FIRST", "COUNT"), default=None,
                   help="print kernels FIRST..FIRST+COUNT-1 of one replay of each graph (CUDA)")
    p.add_argument("--row-gemv", type=int, default=None, metavar="R",
                   help="run 2..R rows' projections as one-row GEMVs side by side "
                        "(layers/fused.ROW_GEMV_MAX; default: the engine's)")
    p.add_argument("--out", default=None, help="write the rows here as JSON")
    args = p.parse_args(argv)
    if args.row_gemv is not None:
        fused.ROW_GEMV_MAX = args.row_gemv
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (
        torch.bfloat16 if device.type == "cuda" else torch.float32)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    model_cfg, target = build_target_model(args, device, dtype)
    tmp = Path(tempfile.mkdtemp())
    head, algorithm = draft_head(args.draft, model_cfg, tmp)
    base = EngineConfig(device="auto", dtype="auto", skip_tokenizer_init=True, kv_cache_memory_gb=4.0,
                        max_model_len=args.max_model_len or args.context + 64,
                        max_num_seqs=max(batch_sizes), cuda_graph_bs=tuple(batch_sizes))
    target_bytes = weight_bytes_per_step(target)
    vanilla = Engine.from_model(base, model_cfg, target)
    decode = {bs: decode_ms(vanilla, bs, args) for bs in batch_sizes}
    vanilla.graphs.close()
    del vanilla
    rows = []
    for hot in args.hot.split(","):
        tmap = None
        if hot != "full":
            tmap = str(tmp / f"freq_{hot}.pt")
            torch.save(list(range(int(hot))), tmap)
        for shape in args.shapes:
            sh = SpecShape.parse(shape.replace(",", "/"))
            steps, topk, ntok = sh.num_steps, sh.topk, sh.num_draft_tokens
            cfg = replace(base, speculative_algorithm=algorithm, speculative_draft_model_path=str(head),
                          speculative_num_steps=steps, speculative_eagle_topk=topk,
                          speculative_num_draft_tokens=ntok, speculative_token_map=tmap,
                          fuse_spec_step=True, profile_phases=True)
            engine = Engine.from_model(cfg, model_cfg, target)
            assert engine.draft is not None
            draft_bytes = weight_bytes_per_step(engine.draft)
            bound_bytes = {"draft": (steps - 1) * draft_bytes, "verify": target_bytes,
                           "draft_extend": draft_bytes, "step": target_bytes + steps * draft_bytes}
            for bs in batch_sizes:
                for phase, (ms, kernels) in phase_rows(engine, bs, args).items():
                    d_ms, d_kernels = decode[bs]
                    bound = bound_bytes[phase] / H200_BANDWIDTH * 1e3
                    rows.append({"target": args.target, "draft": args.draft, "hot": hot, "shape": shape,
                                 "bs": bs, "phase": phase, "ms": round(ms, 4),
                                 "decode_ms": round(d_ms, 4), "x_decode": round(ms / d_ms, 3),
                                 "kernels": kernels, "decode_kernels": d_kernels,
                                 "bound_ms": round(bound, 4), "of_bound": round(bound / ms, 3),
                                 "draft_mb": round(draft_bytes / 1e6, 1)})
                    print(json.dumps(rows[-1]), flush=True)
            engine.graphs.close()
            del engine
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    print_table(rows, device)


def print_table(rows: list[dict], device: torch.device) -> None:
    bound = "of 4.37 TB/s bound" if device.type == "cuda" else "(bound: H200 figures)"
    print(f"\nhot    shape    bs  phase           ms   decode  x decode  kernels  {bound}")
    for r in rows:
        k = "-" if r["kernels"] is None else f"{r['kernels']:.0f}/{r['decode_kernels']:.0f}"
        print(f"{r['hot']:<6} {r['shape']:<8} {r['bs']:>3}  {r['phase']:<12} {r['ms']:>7.3f} "
              f"{r['decode_ms']:>7.3f}  {r['x_decode']:>7.2f}x  {k:>7}  {r['of_bound']:>6.1%}")


if __name__ == "__main__":
    main()
