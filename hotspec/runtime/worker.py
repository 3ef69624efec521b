"""The worker contract: what the engine (and the server's metrics, the benchmarks, the trainer)
may ask of a worker, declared in one place. Optional capabilities have no-op defaults here, so a
caller never probes for them.

A worker prefills requests (eagerly, ragged), then runs steps through its `StepExecutor`: `launch`
enqueues one (no host sync), `collect` reads the oldest back; `step` does both. With the overlap
schedule the engine launches step N+1 before it collects step N (core/launches.py).
"""

from __future__ import annotations

from typing import Any

import torch

from hotspec.core.forward_batch import ForwardBatch
from hotspec.core.request import Request
from hotspec.core.spec_stats import SpecStats
from hotspec.layers.argmax import argmax
from hotspec.runtime.batch_builder import last_token_index, prefill_batch
from hotspec.runtime.decode import CausalLM
from hotspec.runtime.model_runner import ModelRunner
from hotspec.runtime.phase_io import Sampled, sampling_fields
from hotspec.runtime.step_executor import StepExecutor


class Worker:
    """Base of every worker. Subclasses implement `prefill`, `launch` and `collect`."""

    def __init__(self, executor: StepExecutor, target: CausalLM, target_runner: ModelRunner) -> None:
        self.executor, self.target, self.target_runner = executor, target, target_runner
        self.profile = False  # time each speculative phase (synchronises; speculative workers)

    # -- required -------------------------------------------------------------------------------
    def prefill(self, reqs: list[Request], chunks: list[int] | None = None) -> list[list[int]]:
        """KV for `chunks[i]` pending tokens of each request (all when None); a request whose
        chunk was its last gets its next token, the others none yet."""
        raise NotImplementedError

    def launch(self, reqs: list[Request]) -> None:
        """Enqueue one step for `reqs`; no host sync."""
        raise NotImplementedError

    def collect(self) -> tuple[list[Request], list[list[int]]]:
        """The oldest launched step's requests and their new tokens (the step's one host sync)."""
        raise NotImplementedError

    @torch.inference_mode()
    def step(self, reqs: list[Request]) -> list[list[int]]:
        """One step, launched and collected."""
        self.launch(reqs)
        return self.collect()[1]

    # -- what the engine schedules by -------------------------------------------------------------
    @property
    def reserve(self) -> int:
        """KV slots a step writes beyond a request's length, at most."""
        return self.executor.reserve

    @property
    def max_advance(self) -> int:
        """Positions a step advances a request by, at most."""
        return self.executor.max_advance

    @property
    def overlapping(self) -> bool:
        """Whether the engine may launch a step before collecting the last one."""
        return self.executor.overlap

    def unread(self) -> int:
        """Launched steps not collected yet."""
        return len(self.executor.launches)

    def ahead(self, req: Request) -> int:
        """Launched steps of `req` not collected yet."""
        return self.executor.launches.ahead(req)

    def drop_unread(self) -> None:
        """Forget every uncollected step (they died with a step that failed)."""
        self.executor.launches.clear()

    # -- optional capabilities (no-op defaults) --------------------------------------------------
    @property
    def spec_stats(self) -> SpecStats | None:
        """Speculative decoding's statistics; None for a worker that does not speculate."""
        return None

    def chosen_shapes(self) -> dict[int, str]:
        """The adaptive policy's last shape per batch-size bucket ({} without one)."""
        return {}

    def drains_before(self, reqs: list[Request]) -> bool:
        """Whether every launched step must be read before the next launch of `reqs`."""
        return False

    def record_served(self, tokens: list[int]) -> None:
        """The tokens of steps the engine kept (stops applied), for statistics."""

    def start_up(self) -> list[str]:
        """Work after the graphs are captured, before serving; returns lines for the log."""
        return []


def prefill_chunks(reqs: list[Request], chunks: list[int] | None) -> tuple[list[list[int]], list[bool]]:
    """Each request's next `chunks[i]` pending tokens (prompt + tokens already generated, the
    recompute after a preemption), starting at its `seq_len`; all of them when `chunks` is None.
    Also whether that chunk is the last one: only then is a next token sampled."""
    tokens: list[list[int]] = []
    final: list[bool] = []
    for i, r in enumerate(reqs):
        seq = r.prompt_token_ids + r.output_token_ids
        end = len(seq) if chunks is None else r.seq_len + chunks[i]
        assert r.seq_len < end <= len(seq), "a prefill chunk must be non-empty and pending"
        tokens.append(seq[r.seq_len : end])
        final.append(end == len(seq))
    return tokens, final


class Prefilled:
    """A target prefill pass over pending chunks: its batch, the target's hidden states and aux
    layers, and the next token of each request whose chunk was its last (`next[i]`, else None).
    Lengths are not advanced yet (the speculative worker's draft pass reads them first)."""

    def __init__(self, worker: Worker, reqs: list[Request], chunks: list[int] | None) -> None:
        assert not any(worker.ahead(r) for r in reqs), "collect a request's steps before prefill"
        self.reqs = reqs
        self.tokens, self.final = prefill_chunks(reqs, chunks)
        ex = worker.executor
        self.batch: ForwardBatch = prefill_batch(reqs, self.tokens, ex.block_size, ex.device)
        self.hidden, self.aux = worker.target_runner.forward(self.batch)
        self.last = last_token_index(self.batch)
        rows = [i for i, f in enumerate(self.final) if f]
        self.next: list[int | None] = [None] * len(reqs)
        if rows:
            logits = worker.target.compute_logits(self.hidden[self.last[rows]])
            for i, t in zip(rows, sample_for([reqs[i] for i in rows], logits).tolist()):
                self.next[i] = t

    def advance(self) -> list[list[int]]:
        """Each request's length grows by its chunk; returns the tokens the prefill emitted."""
        for r, t in zip(self.reqs, self.tokens):
            r.seq_len += len(t)
        return [[t] if t is not None else [] for t in self.next]


def sample_for(reqs: list[Request], logits: torch.Tensor) -> torch.Tensor:
    """Each row's next token: the argmax when every request is greedy, else drawn with its
    sampling parameters (greedy rows keep the argmax)."""
    if all(r.params.temperature == 0 for r in reqs):
        return argmax(logits)
    fields: dict[str, Any] = sampling_fields(reqs, logits.device)
    return Sampled(**fields).sampling().sample(logits)
