"""The worker contract: what the engine (and the server's metrics, the benchmarks, the trainer)
may ask of a worker, declared in one place. Optional capabilities have no-op defaults here, so a
caller never probes for them.

A worker prefills requests (runtime/prefill.py: CUDA graphs by token bucket, else eagerly),
then runs steps through its `StepExecutor`: `launch`
enqueues one (no host sync), `collect` reads the oldest back; `step` does both. With the overlap
schedule the engine launches step N+1 before it collects step N (core/launches.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from hotspec.core.forward_batch import ForwardBatch
from hotspec.core.request import Request
from hotspec.core.spec_stats import SpecStats
from hotspec.runtime.decode import CausalLM, Feature
from hotspec.runtime.model_runner import ModelRunner
from hotspec.runtime.prefill import PrefillGraphs, PrefillIn, PrefillOut
from hotspec.runtime.step_executor import StepExecutor, constrained


class Worker:
    """Base of every worker. Subclasses implement `prefill`, `launch` and `collect`."""

    def __init__(self, executor: StepExecutor, target: CausalLM, target_runner: ModelRunner,
                 feature: Feature | None = None) -> None:
        """`feature`: what a draft head reads of the target's prefill (speculative workers)."""
        self.executor, self.target, self.target_runner = executor, target, target_runner
        self.feature = feature
        self.profile = False  # time each speculative phase (synchronises; speculative workers)
        self.prefill_graphs: PrefillGraphs | None = None
        if executor.prefill_sizes:
            self.prefill_graphs = PrefillGraphs(
                executor, "prefill", self._prefill_step, PrefillOut, target_runner.kv.trash_slot)

    def _prefill_step(self, x: PrefillIn, fb: ForwardBatch) -> PrefillOut:
        """The graphed target prefill: the LM head at each request's last token (float32, for
        sampling) and, for a draft head, the feature of every token."""
        hidden, aux = self.target_runner.forward(fb)
        return PrefillOut(logits=self.target.compute_logits(hidden[x.last]),
                          feature=self.feature(hidden, aux) if self.feature is not None else None)

    # -- required -------------------------------------------------------------------------------
    def prefill(self, reqs: list[Request], chunks: list[int] | None = None, *,
                meanwhile: Callable[[], None] | None = None) -> list[list[int]]:
        """KV for `chunks[i]` pending tokens of each request (all when None); a request whose
        chunk was its last gets its next token, the others none yet. `meanwhile`: host work to
        do once the pass is launched, before its tokens are read (the engine collects the steps
        still in flight there: the device runs the prefill while the host emits their tokens)."""
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

    def ahead_counts(self) -> Mapping[Request, int]:
        """Every request with launched steps not collected yet, and how many (a live view: one
        lookup a request where a step's scheduling asks for many)."""
        return self.executor.launches.counts

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
        """Whether every launched step must be read before the next launch of `reqs`: a request
        follows a grammar (its matcher reads each step's tokens before the next mask)."""
        return self.unread() > 0 and constrained(reqs)

    def record_served(self, tokens: list[int]) -> None:
        """The tokens of steps the engine kept (stops applied), for statistics."""

    def prefill_limits(self) -> tuple[int, int] | None:
        """(tokens, requests) a prefill step holds at most to run as a graph; None: no graphs."""
        g = self.prefill_graphs
        return (g.max_tokens, g.rows) if g is not None else None

    def start_up(self) -> list[str]:
        """Work after the graphs are captured, before serving; returns lines for the log."""
        return []
