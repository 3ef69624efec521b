"""Prometheus metrics of a serving engine, written by the engine thread (an EngineObserver).

Each server gets its own CollectorRegistry, so several servers (tests) never share counters.
prometheus-client's metric objects are thread-safe: the engine thread writes, /metrics reads.
"""

from __future__ import annotations

from collections import Counter as CountOf

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from hotspec.core.request import Request
from hotspec.core.spec_stats import SpecStats
from hotspec.engine.engine import Engine
from hotspec.engine.outputs import StepOutput
from hotspec.runtime import compile_watch

# tau = tokens per verify pass, in [1, num_steps + 1]; quarter steps resolve a typical 2-4.
TAU_BUCKETS = tuple(1.0 + 0.25 * i for i in range(1, 37))
# seconds, 0.5 ms to 20 s: a graphed prefill of a small model takes about a millisecond
TTFT_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
                0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 20.0)


class EngineMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.generated_tokens = Counter("hotspec_generated_tokens", "Tokens generated (all requests)",
                                        registry=r)
        self.prompt_tokens = Counter("hotspec_prompt_tokens", "Prompt tokens of finished requests",
                                     registry=r)
        self.requests = Counter("hotspec_requests_finished", "Finished requests by finish reason",
                                ["finish_reason"], registry=r)
        self.step_errors = Counter("hotspec_engine_step_errors", "Engine steps that raised", registry=r)
        self.tau = Histogram("hotspec_request_tau", "Per finished speculative request: generated "
                             "tokens per verify pass (mean acceptance length)", buckets=TAU_BUCKETS,
                             registry=r)
        self.ttft = Histogram("hotspec_time_to_first_token_seconds", "The engine's time to first "
                              "token: from a request reaching the engine loop to its first token "
                              "leaving it (queueing, prefill, the step that reads it back; not "
                              "HTTP, tokenization or detokenization)", buckets=TTFT_BUCKETS,
                              registry=r)
        self.hot_coverage: Gauge | None = None  # speculative engines only (describe_engine)
        self.spec: _SpecMetrics | None = None
        self.waiting = Gauge("hotspec_num_requests_waiting", "Requests waiting for admission", registry=r)
        self.running = Gauge("hotspec_num_requests_running", "Requests admitted (prefilling or "
                             "decoding)", registry=r)
        self.kv_used = Gauge("hotspec_kv_blocks_used", "KV cache blocks in use", registry=r)
        self.kv_total = Gauge("hotspec_kv_blocks_total", "KV cache blocks", registry=r)
        self.dropped_rows = Counter("hotspec_overlap_dropped_rows", "Rows of launched steps dropped "
                                    "because their request had finished (overlap schedule: a stop "
                                    "or abort in the step before)", registry=r)
        self._dropped_seen = 0
        self.compiles = Gauge("hotspec_kernel_compiles_after_start", "Triton kernels compiled "
                              "after start-up, in the engine's process (each held every running "
                              "request for the compile; logged by name)", registry=r)
        self.graphs = Gauge("hotspec_cuda_graph_batch_sizes", "Captured batch sizes per phase and "
                            "status (graphed, static, eager, eager (<capture error>))",
                            ["phase", "status"], registry=r)

    def describe_engine(self, engine: Engine) -> None:
        """Values fixed at start-up (call before the engine thread starts)."""
        self.kv_total.set(engine.allocator.num_blocks)
        if engine.worker.spec_stats is not None:
            self.hot_coverage = Gauge("hotspec_hot_set_coverage", "FR-Spec: fraction of served "
                                      "tokens inside the draft head's vocabulary", registry=self.registry)
            self.spec = _SpecMetrics(self.registry)
        per_phase = CountOf((phase, status) for (phase, _bs), status in engine.graphs.status.items())
        for (phase, status), n in per_phase.items():
            self.graphs.labels(phase=phase, status=status).set(n)
        self.on_step(engine, [])

    # -- EngineObserver (engine thread) --------------------------------------------------------
    def on_step(self, engine: Engine, outputs: list[StepOutput]) -> None:
        self.generated_tokens.inc(sum(len(o.new_token_ids) for o in outputs))
        self.waiting.set(len(engine.waiting))
        self.running.set(len(engine.prefilling) + len(engine.running))
        self.kv_used.set(engine.allocator.num_blocks - engine.allocator.num_free)
        self.dropped_rows.inc(engine.dropped_rows - self._dropped_seen)
        self._dropped_seen = engine.dropped_rows
        self.compiles.set(compile_watch.compiles())
        stats = engine.worker.spec_stats
        if self.hot_coverage is not None and stats is not None:
            self.hot_coverage.set(stats.hot_coverage)
        if self.spec is not None and stats is not None:
            self.spec.update(stats, engine.worker.chosen_shapes())

    def on_finished(self, engine: Engine, req: Request) -> None:
        self.requests.labels(finish_reason=req.finish_reason or "unknown").inc()
        self.prompt_tokens.inc(len(req.prompt_token_ids))
        if req.stats.spec_steps > 0:
            self.tau.observe(req.stats.tau)

    def on_first_token(self, engine: Engine, req: Request, seconds: float) -> None:
        self.ttft.observe(seconds)

    def on_step_error(self, engine: Engine) -> None:
        self.step_errors.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _SpecMetrics:
    """Speculative decoding's counters (in the spirit of vLLM's spec_decode_* metrics) and, under
    --speculative-adaptive, the shape chosen at each batch size."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.drafted = Counter("hotspec_spec_draft_tokens", "Draft tokens verified", registry=r)
        self.accepted = Counter("hotspec_spec_accepted_tokens", "Draft tokens accepted", registry=r)
        self.per_pos = Counter("hotspec_spec_accepted_tokens_per_pos", "Verify passes that "
                               "accepted the draft token at each depth (position 0: depth 1)",
                               ["position"], registry=r)
        self.steps = Counter("hotspec_spec_steps", "Steps run per speculation shape (off: plain "
                             "decoding)", ["shape"], registry=r)
        self.chosen = Gauge("hotspec_spec_shape_chosen", "1 for the shape --speculative-adaptive "
                            "chose last at each captured batch size", ["batch_size", "shape"],
                            registry=r)
        self._seen: dict[tuple[str, str], int] = {}

    def _inc(self, counter: Counter, key: tuple[str, str], value: int, **labels: str) -> None:
        delta = value - self._seen.get(key, 0)
        if delta > 0:
            (counter.labels(**labels) if labels else counter).inc(delta)
            self._seen[key] = value

    def update(self, stats: SpecStats, chosen: dict[int, str]) -> None:
        self._inc(self.drafted, ("drafted", ""), stats.drafted)
        self._inc(self.accepted, ("accepted", ""), stats.accepted)
        for depth, _reached, accepted in stats.acceptance_by_depth():
            self._inc(self.per_pos, ("pos", str(depth - 1)), accepted, position=str(depth - 1))
        for shape, n in stats.shape_steps.items():
            self._inc(self.steps, ("steps", shape), n, shape=shape)
        if chosen:
            self.chosen.clear()
            for bs, label in chosen.items():
                self.chosen.labels(batch_size=str(bs), shape=label).set(1)
