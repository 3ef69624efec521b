"""The engine's host time per decode step at large batch, without a GPU: the static graph mode
(the exact path CUDA graphs replay, run eagerly) on a tiny model, each graph body timed and
subtracted, so what is left is what the host spends around a replay (scheduling, inputs, reading
back, emitting tokens). With CUDA graphs and the overlap schedule a step costs max(host, device):
at large batch the host's part can be the step.

    python3 lab/host_step_cost.py [--batch-sizes 64 256] [--modes vanilla 3/1/4] [--steps 30]
        [--no-overlap] [--reuse-outputs] [--loop] [--cprofile N]

Prints per mode and batch: host ms a step and us a request; --cprofile N: the N functions with
the most own time (--reuse-outputs: the host's alone). --loop: the batch's requests submitted
at once to the EngineLoop as the engine process runs it (deliveries pickled as for its pipe),
60 tokens each, prefill steps included.
"""

from __future__ import annotations

import argparse
import cProfile
import pickle
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from engine_utils import tiny_target_and_head  # noqa: E402

from hotspec import LLM, SamplingParams  # noqa: E402
from hotspec.engine.builder import EngineBuilder  # noqa: E402
from hotspec.runtime.graph_runner import GraphRunner  # noqa: E402

BODY = [0.0]  # seconds in graph bodies
CACHE: dict | None = None  # --reuse-outputs: each graph's first outputs, by (phase, rows)


def timed(fn):  # type: ignore[no-untyped-def]
    def wrap(self, *a):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            if CACHE is None:
                return fn(self, *a)
            # (_replay(entry, name, rows), run_bucket(name, inputs))
            key = a[1:] if isinstance(a[-1], int) else (a[0], len(next(iter(a[1].values()))))
            if key not in CACHE:
                CACHE[key] = fn(self, *a)
            return CACHE[key]
        finally:
            BODY[0] += time.perf_counter() - t
    return wrap


def through_loop(eng, bs: int) -> int:  # type: ignore[no-untyped-def]
    """The batch through the engine process's loop (a pickling post), to its end: its steps."""
    from hotspec.entrypoints.engine_loop import EngineLoop, Stop, Submit
    from hotspec.entrypoints.engine_process import RemoteHandle
    from hotspec.entrypoints.request_handle import RequestEvent

    left, g = [bs], torch.Generator().manual_seed(1)

    def post(deliveries: list) -> None:  # type: ignore[type-arg]
        items = [(h.cid, it) for h, it in deliveries]
        left[0] -= sum(isinstance(it, RequestEvent) and it.finish_reason is not None for _, it in items)
        pickle.dumps(("out", items, 0, 0))
        if left[0] == 0:
            loop.inbox.put(Stop())

    loop = EngineLoop(eng, None, post=post)
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    for i in range(bs):
        loop.inbox.put(Submit(RemoteHandle(i), torch.randint(0, 96, (20,), generator=g).tolist(), params))
    steps, step = [0], eng.step

    def counted():  # type: ignore[no-untyped-def]
        steps[0] += 1
        return step()

    eng.step = counted
    try:
        loop.run()
    finally:
        eng.step = step
    return steps[0]


def run(target: Path, head: Path, mode: str, bs: int, steps: int, overlap: bool,
        prof: int, loop: bool) -> None:
    kw: dict = dict(model=str(target), dtype="float32", device="cpu", skip_tokenizer_init=True,
                    num_kv_blocks=bs * 16 + 64, block_size=16, max_model_len=256, max_num_seqs=bs,
                    cuda_graph_max_bs=bs, overlap_schedule=overlap)
    if mode != "vanilla":
        s, k, n = map(int, mode.split("/"))
        kw.update(speculative_algorithm="EAGLE3", speculative_draft_model_path=str(head),
                  speculative_num_steps=s, speculative_eagle_topk=k, speculative_num_draft_tokens=n)
    eng = LLM(**kw).engine
    if loop:
        through_loop(eng, bs)  # (warm: every shape once)
        p = cProfile.Profile() if prof else None
        BODY[0] = 0.0
        t0 = time.perf_counter()
        if p:
            p.enable()
        n = through_loop(eng, bs)
        if p:
            p.disable()
        host = (time.perf_counter() - t0 - BODY[0]) / n
        print(f"{mode:>8} b{bs:<4} loop: host {host * 1e3:6.2f} ms a step over {n} steps", flush=True)
        if p:
            pstats.Stats(p).sort_stats("tottime").print_stats(prof)
        return
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    for _ in range(bs):
        eng.add_request(torch.randint(0, 96, (20,), generator=g).tolist(), params)
    while eng.waiting or eng.prefilling:
        eng.step()
    for _ in range(5):
        eng.step()
    BODY[0] = 0.0
    p = cProfile.Profile() if prof else None
    t0 = time.perf_counter()
    if p:
        p.enable()
    for _ in range(steps):
        eng.step()
    if p:
        p.disable()
    host = (time.perf_counter() - t0 - BODY[0]) / steps
    print(f"{mode:>8} b{bs:<4} overlap {'on ' if overlap else 'off'}: host {host * 1e3:6.2f} ms a "
          f"step, {host / bs * 1e6:5.1f} us a request", flush=True)
    if p:
        pstats.Stats(p).sort_stats("tottime").print_stats(prof)


def main() -> None:
    a = argparse.ArgumentParser()
    a.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256])
    a.add_argument("--modes", nargs="+", default=["vanilla", "3/1/4"])
    a.add_argument("--steps", type=int, default=30)
    a.add_argument("--no-overlap", action="store_true")
    a.add_argument("--cprofile", type=int, default=0)
    a.add_argument("--loop", action="store_true", help="through the engine process's loop")
    a.add_argument("--reuse-outputs", action="store_true",
                   help="a graph's first outputs stand for every later replay (no compute: the "
                   "profile is the host's alone; every step then emits the same tokens)")
    args = a.parse_args()
    global CACHE
    CACHE = {} if args.reuse_outputs else None
    sizes = sorted({1, 8, *args.batch_sizes})
    EngineBuilder._graph_runner = lambda self: GraphRunner(self.device, "static", sizes)  # type: ignore[method-assign]
    GraphRunner._replay = timed(GraphRunner._replay)  # type: ignore[method-assign]
    GraphRunner.run_bucket = timed(GraphRunner.run_bucket)  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as d:
        target, head = tiny_target_and_head(Path(d), layers=3)
        for mode in args.modes:
            for bs in args.batch_sizes:
                run(target, head, mode, bs, args.steps, not args.no_overlap, args.cprofile, args.loop)


if __name__ == "__main__":
    main()
