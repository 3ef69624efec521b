"""The two timed modes of `hotspec bench`, each in an engine of its own that is released before
the next one is built: vanilla (then, optionally, transformers on the same weights) and
speculative (then, on GPU, a separate pass that times the phases)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from hotspec.benchmark.hf_baseline import HFRun, hf_generate_prompts, hf_unsupported_reason
from hotspec.benchmark.spec_bench import BatchRun, LoadedTarget, run_categories, run_with_engine, warm_up
from hotspec.config import EngineConfig
from hotspec.engine.builder import resolve_device_dtype
from hotspec.engine.engine import Engine
from hotspec.errors import HotspecError
from hotspec.sampling_params import SamplingParams

Groups = dict[str, list[list[int]]]  # category -> prompt token ids, in file order

PROFILED_IN_TIMED = "timed pass (CPU: phase timing needs no device sync, so it costs nothing)"
PROFILED_SEPARATELY = ("separate profiled pass (the device is synchronised after every phase, so "
                       "its wall time is longer than the timed pass's)")
NOT_PROFILED = "not measured (--no-profile-pass)"


@dataclass(frozen=True)
class RunOptions:
    max_tokens: int
    ignore_eos: bool
    warmup_tokens: int
    warmup_prompts: list[list[int]]  # the first batch: the warm-up runs the benchmark's own shapes

    @property
    def params(self) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=self.max_tokens, ignore_eos=self.ignore_eos)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def warm_up_all(engine: Engine, groups: Groups, opts: RunOptions) -> None:
    """The untimed passes before a timed one: the first batch for `warmup_tokens` tokens, then
    every prompt's prefill (one token each) alone and all of them together. The first engine of
    a process otherwise pays, inside its timed prefill, for what the later ones find ready:
    kernels compiled for each new prefill shape (one prompt or several, lengths by their
    divisibility) and the allocator's first blocks of each size, which would flatter every mode
    timed after it."""
    if opts.warmup_tokens <= 0:
        return
    warm_up(engine, opts.warmup_prompts, opts.warmup_tokens)
    prompts = [p for c in groups for p in groups[c]]
    for p in prompts:
        warm_up(engine, [p], 1)
    warm_up(engine, prompts, 1)


def run_vanilla(cfg: EngineConfig, target: LoadedTarget, groups: Groups, opts: RunOptions,
                vs_hf: bool) -> tuple[dict[str, BatchRun], HFRun | None, torch.device]:
    """Vanilla runs per category; with `vs_hf`, transformers generate on the same prompts, each
    allowed as many new tokens as vanilla produced for it (greedy: the same tokens)."""
    if vs_hf:
        reason = hf_unsupported_reason(target.model_config)
        if reason is not None:
            raise HotspecError(f"--vs-hf: no transformers Llama baseline for this target: {reason}")

    def run(engine: Engine) -> tuple[dict[str, BatchRun], HFRun | None, torch.device]:
        warm_up_all(engine, groups, opts)
        _log(f"vanilla: {sum(map(len, groups.values()))} prompts in {len(groups)} categories")
        runs = run_categories(engine, groups, opts.params)
        hf = None
        if vs_hf:
            _log("transformers generate (static cache, batch 1)")
            prompts = [p for c in groups for p in groups[c]]
            lengths = [len(o) for c in groups for o in runs[c].outputs]
            hf = hf_generate_prompts(engine, prompts, lengths, opts.ignore_eos)
        return runs, hf, engine.device

    return run_with_engine(cfg, target, run)


def run_speculative(cfg: EngineConfig, target: LoadedTarget, groups: Groups, opts: RunOptions,
                    profile_pass: bool, after_timed: Callable[[Engine], None] | None = None,
                    profile_groups: Groups | None = None
                    ) -> tuple[dict[str, BatchRun], dict[str, BatchRun], str]:
    """Speculative runs per category, and the runs whose phase seconds make the breakdown (the
    timed ones on CPU, a profiled repeat on GPU, of `profile_groups` when given, else of every
    prompt) with a label saying which. `after_timed` sees the engine after the timed pass (e.g.
    to replay its graphs alone)."""

    def run(engine: Engine) -> tuple[dict[str, BatchRun], dict[str, BatchRun], str]:
        worker = engine.worker
        warm_up_all(engine, groups, opts)
        on_cpu = engine.device.type != "cuda"
        # (the adaptive policy's steps are not split into phases: their breakdown is the step's)
        worker.profile = on_cpu
        _log("speculative: timed pass" + (" (phases profiled)" if on_cpu else ""))
        runs = run_categories(engine, groups, opts.params)
        if after_timed is not None:
            after_timed(engine)
        if on_cpu:
            return runs, runs, PROFILED_IN_TIMED
        if not profile_pass:
            return runs, runs, NOT_PROFILED
        worker.profile = True
        _log("speculative: profiled pass (phase times)")
        profiled = run_categories(engine, groups if profile_groups is None else profile_groups,
                                  opts.params)
        return runs, profiled, PROFILED_SEPARATELY

    # Profiled passes run the phase graphs, built only for an engine that profiles phases (the
    # timed pass on CUDA turns profiling off and replays the fused step).
    profiles = profile_pass or resolve_device_dtype(cfg)[0].type != "cuda"
    return run_with_engine(replace(cfg, profile_phases=True) if profiles else cfg, target, run)
