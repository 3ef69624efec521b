"""Prometheus metrics of a serving engine, written by the engine thread (an EngineObserver).

Each server gets its own CollectorRegistry, so several servers (tests) never share counters.
prometheus-client's metric objects are thread-safe: the engine thread writes, /metrics reads.
"""

from __future__ import annotations

from collections import Counter as CountOf

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from hotspec.engine.engine import Engine, StepOutput
from hotspec.engine.request import Request

# tau = tokens per verify pass, in [1, num_steps + 1]; quarter steps resolve a typical 2-4.
TAU_BUCKETS = tuple(1.0 + 0.25 * i for i in range(1, 37))


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
        self.hot_coverage: Gauge | None = None  # speculative engines only (describe_engine)
        self.waiting = Gauge("hotspec_num_requests_waiting", "Requests waiting for admission", registry=r)
        self.running = Gauge("hotspec_num_requests_running", "Requests admitted (prefilling or "
                             "decoding)", registry=r)
        self.kv_used = Gauge("hotspec_kv_blocks_used", "KV cache blocks in use", registry=r)
        self.kv_total = Gauge("hotspec_kv_blocks_total", "KV cache blocks", registry=r)
        self.dropped_rows = Counter("hotspec_overlap_dropped_rows", "Rows of launched steps dropped "
                                    "because their request had finished (overlap schedule: a stop "
                                    "or abort in the step before)", registry=r)
        self._dropped_seen = 0
        self.graphs = Gauge("hotspec_cuda_graph_batch_sizes", "Captured batch sizes per phase and "
                            "status (graphed, static, eager, eager (<capture error>))",
                            ["phase", "status"], registry=r)

    def describe_engine(self, engine: Engine) -> None:
        """Values fixed at start-up (call before the engine thread starts)."""
        self.kv_total.set(engine.allocator.num_blocks)
        if hasattr(getattr(engine.worker, "stats", None), "hot_coverage"):
            self.hot_coverage = Gauge("hotspec_hot_set_coverage", "FR-Spec: fraction of served "
                                      "tokens inside the draft head's vocabulary", registry=self.registry)
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
        if self.hot_coverage is not None:
            self.hot_coverage.set(engine.worker.stats.hot_coverage)  # type: ignore[attr-defined]

    def on_finished(self, engine: Engine, req: Request) -> None:
        self.requests.labels(finish_reason=req.finish_reason or "unknown").inc()
        self.prompt_tokens.inc(len(req.prompt_token_ids))
        if req.stats.spec_steps > 0:
            self.tau.observe(req.stats.tau)

    def on_step_error(self, engine: Engine) -> None:
        self.step_errors.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
