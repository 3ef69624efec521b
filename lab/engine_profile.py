"""Where the engine process's time goes under `hotspec bench-serve`'s load, without HTTP.

    python3 lab/engine_profile.py [--vanilla] [--cprofile N] [bench-serve options...]

Builds the Engine as `hotspec serve` does (the default head unless --vanilla), makes the
bench-serve workload (--num-requests, prompt and token ranges, sampled/greedy mix; hang-ups run to
the end), submits it all at once (rate inf) to the same EngineLoop the engine process runs, with a
post that pickles every delivery as the process's pipe does, and reports output tok/s, steps,
and, with --cprofile N, the N functions with the most own time and the most cumulative time.
A warm-up pass of the same workload runs first (every prefill shape compiled).
"""

from __future__ import annotations

import argparse
import cProfile
import pickle
import pstats
import sys
import time
from pathlib import Path

from hotspec.benchmark.load_test import DEFAULT_PROMPTS, make_workload, read_words
from hotspec.cli.engine_args import engine_config
from hotspec.cli.main import build_parser
from hotspec.engine.engine import Engine
from hotspec.entrypoints.engine_loop import EngineLoop, Stop, Submit
from hotspec.entrypoints.engine_process import RemoteHandle
from hotspec.entrypoints.request_handle import RequestEvent
from hotspec.sampling_params import SamplingParams


def params(body: dict) -> SamplingParams:
    keys = ("temperature", "top_p", "top_k", "seed", "max_tokens", "ignore_eos")
    return SamplingParams(**{k: body[k] for k in keys if k in body})


def run(engine: Engine, work: list[tuple[list[int], SamplingParams]], prof: cProfile.Profile | None
        ) -> tuple[float, int, int, float]:
    left = [len(work)]
    tokens = [0]
    sent = [0]

    def post(deliveries: list) -> None:
        items = [(h.cid, item) for h, item in deliveries]
        for _, item in items:
            if isinstance(item, RequestEvent):
                tokens[0] += len(item.token_ids)
                left[0] -= item.finish_reason is not None
            elif isinstance(item, BaseException):  # rejected (e.g. over the context)
                print(f"rejected: {item}")
                left[0] -= 1
        sent[0] += len(pickle.dumps(("out", items, 0, 0)))
        if left[0] == 0:
            loop.inbox.put(Stop())

    loop = EngineLoop(engine, None, post=post)
    for i, (ids, p) in enumerate(work):
        loop.inbox.put(Submit(RemoteHandle(i), ids, p))
    steps = [0]
    step = engine.step

    def counted() -> list:
        steps[0] += 1
        return step()

    engine.step = counted  # type: ignore[method-assign]
    t = time.perf_counter()
    if prof:
        prof.enable()
    loop.run()
    if prof:
        prof.disable()
    wall = time.perf_counter() - t
    engine.step = step  # type: ignore[method-assign]
    return wall, tokens[0], steps[0], sent[0] / 1e6


def main() -> None:
    own = argparse.ArgumentParser()
    own.add_argument("--vanilla", action="store_true")
    own.add_argument("--cprofile", type=int, default=0)
    mine, rest = own.parse_known_args()
    ns = build_parser().parse_args(["bench-serve", *rest])
    cfg = engine_config(ns, default_head=not mine.vanilla)
    engine = Engine(cfg)
    tok = engine.tokenizer
    words = read_words(Path(ns.prompts) if ns.prompts else DEFAULT_PROMPTS)
    work = []
    for job in make_workload(ns, words, "m"):
        text = tok.apply_chat_template(job.body["messages"], tokenize=False, add_generation_prompt=True)
        work.append((tok.encode(text, add_special_tokens=False), params(job.body)))
    prompt_tokens = sum(len(ids) for ids, _ in work)
    print(f"{'vanilla' if mine.vanilla else 'speculative'}: {len(work)} requests, "
          f"{prompt_tokens} prompt tokens", flush=True)
    run(engine, work, None)  # warm-up
    for rnd in range(2):
        prof = cProfile.Profile() if (mine.cprofile and rnd == 1) else None
        wall, tokens, steps, mb = run(engine, work, prof)
        print(f"round {rnd}: {wall:.3f} s, {tokens} output tokens, {tokens / wall:.0f} tok/s, "
              f"{steps} steps, {mb:.2f} MB pickled{' (profiled)' if prof else ''}", flush=True)
        if prof:
            for key in ("tottime", "cumulative"):
                pstats.Stats(prof, stream=sys.stdout).sort_stats(key).print_stats(mine.cprofile)
    ms = sorted(first_token_ms(engine, work[:20]))
    print(f"engine-side first token, one request at a time ({len(ms)}): p50 {ms[len(ms) // 2]:.2f} ms, "
          f"min {ms[0]:.2f}, max {ms[-1]:.2f}; prompt tokens {[len(w[0]) for w in work[:20]]}")


def first_token_ms(engine: Engine, work: list[tuple[list[int], SamplingParams]]) -> list[float]:
    """Engine-side TTFT of requests sent one at a time to an idle loop on its own thread."""
    import threading

    got = threading.Event()
    times: list[float] = []
    t0 = [0.0]

    def post(deliveries: list) -> None:
        for _, item in deliveries:
            if isinstance(item, RequestEvent) and item.token_ids and not got.is_set():
                times.append((time.perf_counter() - t0[0]) * 1e3)
                got.set()

    loop = EngineLoop(engine, None, post=post)
    th = threading.Thread(target=loop.run, daemon=True)
    th.start()
    for i, (ids, p) in enumerate(work):
        got.clear()
        time.sleep(0.05)
        t0[0] = time.perf_counter()
        loop.inbox.put(Submit(RemoteHandle(i), ids, SamplingParams(max_tokens=2, temperature=p.temperature)))
        got.wait(10)
        time.sleep(0.02)  # let it finish
    loop.inbox.put(Stop())
    th.join()
    return times


if __name__ == "__main__":
    main()
