"""Run prompts through one engine as a user would: submitted together, greedy, timed per step.

`drive` submits a batch of prompts and steps the engine until it is idle, timing every
`Engine.step()` (host work included) and splitting the steps that prefill from those that decode,
so both end-to-end and decode-only tokens/s come out of one pass. The speculative worker's
statistics (acceptance histogram, phase calls and seconds, hot-set coverage) are returned as the
change over the pass, so warm-up and earlier passes never leak into a result.
"""

from __future__ import annotations

import copy
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import torch

from hotspec.benchmark.device import sync
from hotspec.config import EngineConfig
from hotspec.core.spec_stats import SpecStats
from hotspec.engine.builder import load_target as load_target_parts
from hotspec.engine.engine import Engine
from hotspec.models.config import ModelConfig
from hotspec.models.llama import LlamaForCausalLM
from hotspec.runtime import compile_watch
from hotspec.sampling_params import SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

T = TypeVar("T")


@dataclass
class LoadedTarget:
    """A target built once and shared by the vanilla and speculative engines (no second copy)."""

    model_config: ModelConfig
    model: LlamaForCausalLM
    tokenizer: PreTrainedTokenizerBase | None


@dataclass
class BatchRun:
    wall_s: float  # submission to the last token, as a user sees it
    prefill_s: float  # steps that prefilled (admitted requests; decoding waits for them)
    prefill_tokens: int  # tokens those steps emitted (each request's first)
    outputs: list[list[int]]  # generated ids per prompt, in submission order
    verify_steps: list[int]  # per prompt; 0 without speculation
    taus: list[float]  # per prompt: RequestStats.tau (generated tokens per verify pass)
    stats: SpecStats | None = field(default=None)  # the speculative worker's, over this pass only
    # Engine.step() calls that did not prefill: the decode steps as the engine ran them, whatever
    # their batch (a batch thins out as its requests finish, so tokens / batch size undercounts)
    decode_steps: int = 0
    compiles: int = 0  # Triton kernels compiled during the pass (runtime/compile_watch.py)

    @property
    def generated(self) -> int:
        return sum(len(o) for o in self.outputs)


def load_target(cfg: EngineConfig) -> LoadedTarget:
    """The checkpoint named by `cfg` (model, dtype, device) built as Engine(cfg) would build it."""
    return LoadedTarget(*load_target_parts(cfg))


def run_with_engine(cfg: EngineConfig, target: LoadedTarget, fn: Callable[[Engine], T]) -> T:
    """Build an engine around the shared target, call `fn` with it, then release its KV pools and
    CUDA graphs before returning, so that two engines never hold device memory at once."""
    engine = Engine.from_model(cfg, target.model_config, target.model, target.tokenizer)
    device = engine.device
    try:
        return fn(engine)
    finally:
        engine.graphs.close()
        del engine
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _stats_delta(before: SpecStats, after: SpecStats) -> SpecStats:
    return SpecStats(accept_hist=after.accept_hist - before.accept_hist,
                     phase_calls=after.phase_calls - before.phase_calls,
                     phase_seconds=after.phase_seconds - before.phase_seconds,
                     hot_hits=after.hot_hits - before.hot_hits, served=after.served - before.served,
                     drafted=after.drafted - before.drafted,
                     shape_steps=after.shape_steps - before.shape_steps)


def drive(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> BatchRun:
    """Submit `prompts` together and step the engine until every one has finished."""
    worker_stats: SpecStats | None = engine.worker.spec_stats
    before = copy.deepcopy(worker_stats) if worker_stats is not None else None
    dev = engine.device
    prefill_s, prefill_tokens, decode_steps = 0.0, 0, 0
    sync(dev)
    compiled = compile_watch.compiles()
    start = time.perf_counter()
    reqs = [engine.add_request(p, params) for p in prompts]
    while engine.has_unfinished():
        # Only a step that may prefill (requests waiting or mid-prefill) is timed apart, between
        # two device syncs: the first lets a decode step still in flight (overlap schedule) finish
        # outside it. Decode steps are never synced here: a sync per step would undo the overlap.
        waiting, prefilling = len(engine.waiting), len(engine.prefilling)
        may_admit = waiting and len(engine.running) + prefilling < engine.cfg.max_num_seqs
        pending = {id(r) for r in (*engine.waiting, *engine.prefilling)} if prefilling or may_admit else set()
        if pending:
            sync(dev)
        t0 = time.perf_counter()
        outs = engine.step()
        # A step prefills iff requests were mid-prefill or it admitted some (waiting shrank; a
        # decode step can only grow `waiting`, by preemption).
        if prefilling or len(engine.waiting) < waiting:
            sync(dev)
            prefill_s += time.perf_counter() - t0
            # the prefilled requests' first tokens (a decode step drained before the prefill, if
            # any, is the running requests' and counts as decode)
            prefill_tokens += sum(len(o.new_token_ids) for o in outs if id(o.request) in pending)
        else:
            decode_steps += 1
    wall = time.perf_counter() - start
    stats = None
    if worker_stats is not None and before is not None:
        stats = _stats_delta(before, worker_stats)
    return BatchRun(wall, prefill_s, prefill_tokens, [list(r.output_token_ids) for r in reqs],
                    [r.stats.spec_steps for r in reqs], [r.stats.tau for r in reqs], stats, decode_steps,
                    compile_watch.compiles() - compiled)


def run_categories(engine: Engine, groups: dict[str, list[list[int]]],
                   params: SamplingParams) -> dict[str, BatchRun]:
    """One `drive` per category, in order: per-category tokens/s come from separate passes."""
    return {cat: drive(engine, prompts, params) for cat, prompts in groups.items()}


def warm_up(engine: Engine, prompts: list[list[int]], max_tokens: int) -> None:
    """A short untimed pass with the benchmark's own batch (kernels, allocator, caches)."""
    if max_tokens > 0 and prompts:
        drive(engine, prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
