"""One graph runner for every phase except prefill, keyed by (phase, batch size).

A phase is a pure function of typed batch-leading tensors (runtime/phase_io.py): `fn(inputs) ->
outputs`. `register` returns the phase's `PhaseGraph`, whose `run` takes and returns those types.
The runner owns one set of static input buffers per phase, allocated once at the largest captured
batch size from the input type's own declaration of its shapes (`example`), so each buffer is
sized from what fills it. Outputs are whatever the captured function allocates: sized by the
module that writes them, by construction.

A batch of B requests replays the graph of the next captured size P >= B: rows B..P-1 are padding
rows copied from the phase's example (null block, trash slots), which write nowhere that matters.

Modes:  "cuda"   capture torch.cuda.CUDAGraphs (one memory pool shared by all graphs);
        "static" the same static-buffer path run eagerly (CPU tests of exactly what is replayed);
        "eager"  call the phase directly (debugging: --disable-cuda-graph).
A capture failure stops start-up with the phase, batch size and exception, unless the user opted
into eager fallback: then it is a warning, a row in the report and a metric.

Host I/O in "cuda" mode (runtime/host_io.py): a phase's host inputs are written into a pinned slot
that the graph's first kernel reads, and the outputs it publishes come back through pinned slots
its last kernel writes (`read_back`), so nothing is copied on the stream between two graphs. The
runner counts every replay, as the device does, to agree on the slot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from hotspec.errors import HotspecError
from hotspec.runtime import host_io
from hotspec.runtime.host_io import HostInputs, HostSlot, StagedInputs
from hotspec.runtime.phase_io import PhaseIO, Tensors

Phase = Callable[[Tensors], Tensors]
In = TypeVar("In", bound=PhaseIO)
Out = TypeVar("Out", bound=PhaseIO)
log = logging.getLogger("hotspec.graphs")


class GraphCaptureError(HotspecError, RuntimeError):
    """A phase could not be captured and eager fallback was not allowed."""


def default_batch_sizes(max_bs: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b <= max_bs]
    sizes += list(range(16, max_bs + 1, 8 if max_bs <= 64 else 16))
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


@dataclass
class _Entry:
    fn: Phase
    static: Tensors  # inputs at the largest batch size
    pad: Tensors  # one padding row per input
    device_inputs: tuple[str, ...] = ()  # inputs that arrive on the device (the rest: the host)
    publish: tuple[str, ...] = ()  # outputs the host reads (zero-copy into pinned slots)
    host: HostInputs | None = None  # CUDA: the host inputs, fetched by the graph itself


class Replay:
    """A captured graph as benchmarks replay it alone: through the runner, which counts it."""

    def __init__(self, runner: GraphRunner, name: str, padded: int) -> None:
        self.runner, self.name, self.padded = runner, name, padded

    def replay(self) -> None:
        self.runner._replay(self.runner.phases[self.name], self.name, self.padded)


class PhaseGraph(Generic[In, Out]):
    """A registered phase: `run` replays its graph for a batch (or runs it; see GraphRunner)."""

    def __init__(self, runner: GraphRunner, name: str, out_type: type[Out]) -> None:
        self.runner, self.name, self.out_type = runner, name, out_type

    def run(self, inputs: In, borrow: tuple[str, ...] = ()) -> Out:
        return self.out_type.of(self.runner.run(self.name, inputs.tensors(), borrow=borrow))

    def read_back(self, key: str) -> HostSlot | None:
        """Output `key` of the last run, on its way to the host (GraphRunner.read_back)."""
        return self.runner.read_back(key)

    def captured(self, bs: int) -> Replay | None:
        return self.runner.captured(self.name, bs)


@dataclass
class _Buckets:
    fn: Phase
    sizes: list[int]
    static: dict[int, Tensors]  # inputs at each size (none in eager mode)
    staged: dict[int, StagedInputs]  # the host inputs' buffers at each size (one copy a run)


class BucketGraph(Generic[In, Out]):
    """A phase registered by size (prefill: tokens): `run` takes inputs padded to one of `sizes`
    by the caller (`bucket` says which) and returns views of the graph's outputs, valid until it
    runs again."""

    def __init__(self, runner: GraphRunner, name: str, out_type: type[Out], sizes: list[int]) -> None:
        self.runner, self.name, self.out_type, self.sizes = runner, name, out_type, sizes

    def bucket(self, n: int) -> int | None:
        """The smallest size that holds `n`, or None (larger than every graph)."""
        return next((s for s in self.sizes if s >= n), None)

    def run(self, inputs: In) -> Out:
        return self.out_type.of(self.runner.run_bucket(self.name, inputs.tensors()))


class GraphRunner:
    def __init__(self, device: torch.device, mode: str, batch_sizes: list[int],
                 allow_eager_fallback: bool = False) -> None:
        if mode not in ("cuda", "static", "eager"):
            raise ValueError(f"unknown graph mode {mode!r}")
        self.device, self.mode = device, mode
        self.batch_sizes = sorted(batch_sizes)
        self.allow_eager_fallback = allow_eager_fallback
        self.phases: dict[str, _Entry] = {}
        self.graphs: dict[tuple[str, int], tuple[torch.cuda.CUDAGraph, Tensors]] = {}
        self.status: dict[tuple[str, int], str] = {}
        self.fallbacks = 0  # captures that failed and run eagerly (a metric)
        self.pool: torch.cuda._POOL_HANDLE | None = None
        # zero-copy phases (runtime/host_io.py): replays counted here and on the device
        self.count = 0
        self.counter = torch.zeros(1, dtype=torch.long, device=device) if mode == "cuda" else None
        self.out_slots: dict[tuple[str, int, str], torch.Tensor] = {}  # pinned [2, bytes]
        self.slot_writer: dict[tuple[str, int, str, int], int] = {}  # the replay that wrote a slot
        self.published: dict[str, HostSlot] = {}  # the last run's, by output name
        self.bucketed: dict[str, _Buckets] = {}  # phases captured by size (BucketGraph)

    @property
    def max_bs(self) -> int:
        return self.batch_sizes[-1]

    def register(self, name: str, fn: Callable[[In], Out], example: Callable[[int], In],
                 out_type: type[Out], device_inputs: tuple[str, ...] = (),
                 publish: tuple[str, ...] = ()) -> PhaseGraph[In, Out]:
        """Phase `name`: `fn` of the inputs `example(bs)` declares (their static shapes, and
        padding rows). `device_inputs`: the inputs `run` gets as device tensors (from another
        phase's outputs); the rest come from the host. On CUDA the graph fetches the host inputs
        itself and writes the `publish`ed outputs into pinned memory (`read_back`)."""
        in_type = type(example(1))

        def body(x: Tensors) -> Tensors:
            return fn(in_type.of(x)).tensors()

        self._register(name, body, lambda bs: example(bs).tensors(), device_inputs, publish)
        return PhaseGraph(self, name, out_type)

    def _register(self, name: str, fn: Phase, example: Callable[[int], Tensors],
                  device_inputs: tuple[str, ...], publish: tuple[str, ...]) -> None:
        if name in self.phases:
            raise ValueError(f"phase {name!r} is registered already")
        static = example(self.max_bs) if self.mode != "eager" else {}
        pad = {k: v[:1].clone() for k, v in example(1).items()}
        e = _Entry(fn, static, pad, device_inputs, publish)
        host = {k: v for k, v in static.items() if k not in device_inputs}
        if host and self.mode == "cuda" and self.device.type == "cuda":
            e.host = HostInputs(host, pad, self.device)
            e.static = dict(static, **e.host.static)
        self.phases[name] = e

    def register_buckets(self, name: str, fn: Callable[[In], Out], example: Callable[[int], In],
                         out_type: type[Out], sizes: list[int],
                         device_inputs: tuple[str, ...] = ()) -> BucketGraph[In, Out]:
        """Phase `name` captured at each of `sizes`; `example(size)` declares its inputs at that
        size. Its inputs come whole (padded by the caller); the host's reach their static
        buffers in one copy (runtime/host_io.StagedInputs), the `device_inputs` are copied
        each; nothing is published (the caller reads what it needs after the run)."""
        if name in self.phases or name in self.bucketed:
            raise ValueError(f"phase {name!r} is registered already")
        in_type = type(example(sizes[0]))

        def body(x: Tensors) -> Tensors:
            return fn(in_type.of(x)).tensors()

        static: dict[int, Tensors] = {}
        staged: dict[int, StagedInputs] = {}
        for n in sizes if self.mode != "eager" else []:
            ex = example(n).tensors()
            st = staged[n] = StagedInputs({k: v for k, v in ex.items() if k not in device_inputs},
                                          self.device)
            static[n] = dict(ex, **st.static)
        self.bucketed[name] = _Buckets(body, sorted(sizes), static, staged)
        return BucketGraph(self, name, out_type, sorted(sizes))

    # -- capture -------------------------------------------------------------------------------
    def capture_all(self) -> None:
        for name in self.phases:
            for bs in self.batch_sizes:
                self._capture(name, bs)
        for name, bk in self.bucketed.items():
            for n in bk.sizes:
                self._capture_fn(name, n, self._bucket_body(bk, n), f"{n} tokens")
        if self.counter is not None:  # the warm-ups counted on the device: start both at 0
            self.counter.zero_()
            self.count = 0

    def _body(self, e: _Entry, name: str, padded: int, inputs: Tensors) -> Tensors:
        """What a graph runs: with host inputs, their fetch first and the publish (or the
        count) last (runtime/host_io.py)."""
        if e.host is None:
            return e.fn(inputs)
        assert self.counter is not None
        host_io.fetch(e.host.pinned, e.host.blob, self.counter, e.host.span(padded))
        out = e.fn(inputs)
        for i, k in enumerate(e.publish):
            if (name, padded, k) not in self.out_slots:  # (in the warm-up, before capture)
                nbytes = out[k].numel() * out[k].element_size()
                self.out_slots[(name, padded, k)] = torch.zeros(2, -(-nbytes // 16) * 16, dtype=torch.uint8,
                                                                pin_memory=True)
            host_io.publish(out[k], self.out_slots[(name, padded, k)], self.counter,
                            bump=i == len(e.publish) - 1)
        if not e.publish:
            host_io.bump(self.counter)
        return out

    def _bucket_body(self, bk: _Buckets, n: int) -> Callable[[], Tensors]:
        return lambda: bk.fn(bk.static[n])

    def _capture(self, name: str, bs: int) -> None:
        e = self.phases[name]
        inputs = {k: v[:bs] for k, v in e.static.items()} if self.mode != "eager" else {}
        self._capture_fn(name, bs, lambda: self._body(e, name, bs, inputs), f"batch size {bs}")

    def _capture_fn(self, name: str, bs: int, body: Callable[[], Tensors], at: str) -> None:
        """Capture `body` as the graph of (name, bs) (`at`: the size, in words): two warm-up
        runs, then the capture; a failure stops start-up unless eager fallback was asked for."""
        key = (name, bs)
        if self.mode != "cuda":
            self.status[key] = self.mode
            return
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: Triton autotuning/compilation, lazy allocations
                    body()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self.pool):
                out = body()
            self.graphs[key] = (graph, out)
            self.status[key] = "graphed"
        except Exception as exc:  # noqa: BLE001 - any capture failure is reported, never hidden
            if not self.allow_eager_fallback:
                raise GraphCaptureError(
                    f"CUDA graph capture failed for phase {name!r} at {at}: "
                    f"{type(exc).__name__}: {exc}. Fix the phase, or start with "
                    "--allow-eager-fallback (slower, reported) or --disable-cuda-graph.") from exc
            log.warning("phase %s at %s runs EAGER (capture failed: %s)", name, at, exc)
            self.status[key] = f"eager ({type(exc).__name__})"
            self.fallbacks += 1

    # -- replay --------------------------------------------------------------------------------
    def run(self, name: str, inputs: Tensors, borrow: tuple[str, ...] = ()) -> Tensors:
        """The phase's outputs for `inputs`' batch, copied out of the graph's static buffers,
        except the `borrow`ed ones: views, valid until the phase runs again (for outputs the caller
        reads at once; one copy kernel less each). `read_back` then gives the published ones on
        the host.

        Inputs may live on the host (what the scheduler builds from its lists): on CUDA they are
        written, with their padding rows, into a pinned slot that the graph's first kernel reads
        (no copy on the stream); device inputs are copied into their static buffers."""
        e = self.phases[name]
        bs = next(iter(inputs.values())).shape[0]
        padded = next((b for b in self.batch_sizes if b >= bs), None)
        self.published = {}
        if self.mode == "eager" or padded is None:
            return e.fn({k: v.to(self.device, non_blocking=True) for k, v in inputs.items()})
        if inputs.keys() != e.static.keys():
            raise ValueError(f"phase {name!r} takes inputs {sorted(e.static)}, got {sorted(inputs)}")
        if e.host is not None:
            on_host = {k for k, v in inputs.items() if v.device.type == "cpu"}
            if on_host != set(e.host.static):
                raise ValueError(f"phase {name!r} takes {sorted(e.host.static)} from the host and "
                                 f"{sorted(e.device_inputs)} on the device, got {sorted(on_host)} on "
                                 "the host")
            e.host.write({k: inputs[k] for k in e.host.static}, padded, self.count % 2)
            inputs = {k: v for k, v in inputs.items() if k not in e.host.static}
        for k, src in inputs.items():
            host_io.fill_rows(e.static[k], src, padded, e.pad[k])
        out = self._replay(e, name, padded)
        if e.host is not None:
            self.published = {k: self._host_slot(e, name, padded, k, out[k], bs) for k in e.publish}
        return {k: v[:bs] if k in borrow else v[:bs].clone() for k, v in out.items()}

    def run_bucket(self, name: str, inputs: Tensors) -> Tensors:
        """A BucketGraph's outputs (views) for `inputs`, padded to one of its sizes already."""
        b = self.bucketed[name]
        n = next(iter(inputs.values())).shape[0]
        if self.mode == "eager":
            return b.fn({k: v.to(self.device, non_blocking=True) for k, v in inputs.items()})
        if n not in b.static:
            raise ValueError(f"phase {name!r} runs at sizes {b.sizes}, got {n}")
        static = b.static[n]
        if inputs.keys() != static.keys():
            raise ValueError(f"phase {name!r} takes inputs {sorted(static)}, got {sorted(inputs)}")
        st = b.staged[n]
        on_host = {k: v for k, v in inputs.items() if k in st.static and v.device.type == "cpu"}
        if on_host:
            st.write(on_host)  # (first: a host input passed on the device is copied after it)
        for k, v in inputs.items():
            if k not in on_host:
                static[k].copy_(v, non_blocking=True)
        graph = self.graphs.get((name, n))
        if graph is None:  # static mode, or an allowed fallback
            return b.fn(static)
        graph[0].replay()
        return graph[1]

    def _replay(self, e: _Entry, name: str, padded: int) -> Tensors:
        """Replay (or, static or after an allowed fallback, run) the graph for `padded` rows; a
        zero-copy phase's replay is counted, with the slots it used."""
        graph = self.graphs.get((name, padded))
        if graph is None:  # static mode, or an allowed fallback
            static = {k: v[:padded] for k, v in e.static.items()}
            out = self._body(e, name, padded, static) if self.mode == "cuda" else e.fn(static)
        else:
            graph[0].replay()
            out = graph[1]
        if e.host is not None:
            slot = self.count % 2
            e.host.replayed(slot)
            for k in e.publish:
                self.slot_writer[(name, padded, k, slot)] = self.count
            self.count += 1
        return out

    def _host_slot(self, e: _Entry, name: str, padded: int, key: str, out: torch.Tensor,
                   bs: int) -> HostSlot:
        """Output `key` of the replay just counted, rows 0..bs-1, in the pinned slot it wrote."""
        assert e.host is not None
        count = self.count - 1
        slot = count % 2
        raw = self.out_slots[(name, padded, key)][slot][: out.numel() * out.element_size()]
        view = raw.view(out.dtype).view(out.shape)[:bs]
        return HostSlot(view, e.host.done[slot], self.slot_writer, (name, padded, key, slot), count)

    def read_back(self, key: str) -> HostSlot | None:
        """Output `key` of the last `run`, on its way to the host in a pinned slot (its
        `tolist()` waits for that replay alone), if the phase publishes it; else None."""
        return self.published.get(key)

    def captured(self, name: str, bs: int) -> Replay | None:
        """The CUDA graph a batch of `bs` replays for phase `name`, if one was captured
        (benchmarks replay it alone to time the device; through the runner, which counts it)."""
        padded = next((b for b in self.batch_sizes if b >= bs), None)
        if padded is None or (name, padded) not in self.graphs:
            return None
        return Replay(self, name, padded)

    # -- report / teardown ---------------------------------------------------------------------
    def report(self) -> str:
        if not self.phases and not self.bucketed:
            return "no graphed phases"
        width = max(len(n) for n in [*self.phases, *self.bucketed])
        lines = [f"{'phase':<{width}}  " + " ".join(f"{b:>4}" for b in self.batch_sizes)]
        for name in self.phases:
            cells = []
            for b in self.batch_sizes:
                s = self.status.get((name, b), "-")
                cells.append(f"{self._letter(s):>4}")
            lines.append(f"{name:<{width}}  " + " ".join(cells))
        for name, bk in self.bucketed.items():
            cells = [f"{n}:{self._letter(self.status.get((name, n), '-'))}" for n in bk.sizes]
            lines.append(f"{name:<{width}}  tokens " + " ".join(cells))
        legend = "G = CUDA graph, S = static buffers (no capture), E = eager"
        bad = [f"{n}@{b}: {s}" for (n, b), s in self.status.items() if s.startswith("eager")]
        if bad:
            legend += "\nEAGER FALLBACK: " + ", ".join(bad)
        return "\n".join(lines) + "\n" + legend

    @staticmethod
    def _letter(status: str) -> str:
        return "G" if status == "graphed" else ("S" if status == "static" else "E")

    def close(self) -> None:
        self.graphs.clear()
        self.phases.clear()
        self.bucketed.clear()
        self.out_slots.clear()
        self.published = {}
        self.pool = None
