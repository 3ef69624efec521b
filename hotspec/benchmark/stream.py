"""Serve a stream of prompts at a fixed concurrency, as a server under steady load: a new request
joins whenever one finishes, so `batch` requests are in flight until the stream runs dry. Per
engine step: its end time, the tokens it emitted and the speculation shape it ran."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hotspec.benchmark.device import sync
from hotspec.benchmark.prompts import BenchPrompt, prompt_ids, read_bench_prompts
from hotspec.core.request import Request, Status
from hotspec.engine.engine import Engine
from hotspec.errors import HotspecError
from hotspec.sampling_params import SamplingParams


def round_robin(path: Path, categories: list[str] | None, n: int, tokenizer: Any
                ) -> list[list[int]]:
    """`n` prompt ids taking the categories in turn (None: every category of the file, in the
    order they first appear), each category's prompts in file order, from the start again when
    they run out."""
    prompts = read_bench_prompts(path)
    cats = categories if categories is not None else list(dict.fromkeys(p.category for p in prompts))
    by_cat: dict[str, list[BenchPrompt]] = {c: [p for p in prompts if p.category == c] for c in cats}
    missing = [c for c, ps in by_cat.items() if not ps]
    if missing:
        raise HotspecError(f"no prompts of categories {missing} in {path}")
    out: list[list[int]] = []
    i = 0
    while len(out) < n:
        for c in cats:
            if len(out) < n:
                ps = by_cat[c]
                out.append(prompt_ids(ps[i % len(ps)], tokenizer, True))
        i += 1
    return out


def serve(engine: Engine, prompts: list[list[int]], batch: int, max_tokens: int,
          mark: int | None = None) -> dict[str, Any]:
    """Run the stream greedily at `batch` requests in flight. Returns the wall time, the steps
    (end time, tokens emitted, the shape the speculative worker ran, None for prefill-only steps
    and vanilla), `mark_step`: the step at which prompt `mark` joined, and every request's output
    token ids in stream order."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    stats = engine.worker.spec_stats
    next_i = 0
    events: list[tuple[float, int, str | None]] = []
    reqs: list[Request] = []
    mark_step: int | None = None
    sync(engine.device)
    t0 = time.perf_counter()
    while next_i < len(prompts) or engine.has_unfinished():
        live = sum(r.status is not Status.FINISHED for r in reqs)
        while live < batch and next_i < len(prompts):
            reqs.append(engine.add_request(prompts[next_i], params))
            if next_i == mark:
                mark_step = len(events)
            next_i, live = next_i + 1, live + 1
        before = dict(stats.shape_steps) if stats is not None else {}
        outs = engine.step()
        ran = [k for k, n in (stats.shape_steps.items() if stats is not None else ())
               if n > before.get(k, 0)]
        events.append((time.perf_counter() - t0, sum(len(o.new_token_ids) for o in outs),
                       ran[-1] if ran else None))
    sync(engine.device)
    return {"wall_s": time.perf_counter() - t0, "events": events, "mark_step": mark_step,
            "outputs": [list(r.output_token_ids) for r in reqs]}
