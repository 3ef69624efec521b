"""One graph runner for every phase except prefill, keyed by (phase, batch size).

A phase is a pure function of batch-leading tensors: `fn(inputs) -> outputs`. The runner owns one
set of static input buffers per phase, allocated once at the largest captured batch size from an
example the phase provides (so each buffer is sized from what fills it). Outputs are whatever the
captured function allocates: sized by the module that writes them, by construction.

A batch of B requests replays the graph of the next captured size P >= B: rows B..P-1 are padding
rows copied from the phase's example (null block, trash slots), which write nowhere that matters.

Modes:  "cuda"   capture torch.cuda.CUDAGraphs (one memory pool shared by all graphs);
        "static" the same static-buffer path run eagerly (CPU tests of exactly what is replayed);
        "eager"  call the phase directly (debugging: --disable-cuda-graph).
A capture failure stops start-up with the phase, batch size and exception, unless the user opted
into eager fallback: then it is a warning, a row in the report and a metric.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hotspec.errors import HotspecError

Tensors = dict[str, torch.Tensor]
Phase = Callable[[Tensors], Tensors]
log = logging.getLogger("hotspec.graphs")


class GraphCaptureError(HotspecError, RuntimeError):
    """A phase could not be captured and eager fallback was not allowed."""


def default_batch_sizes(max_bs: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b <= max_bs]
    sizes += list(range(16, max_bs + 1, 8 if max_bs <= 64 else 16))
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


def _packed(example: Tensors, device: torch.device, pin: bool = False
            ) -> tuple[torch.Tensor, Tensors, dict[str, tuple[int, int]]]:
    """One byte buffer holding a copy of every tensor of `example`, each in its own region
    (16-byte aligned, in the dict's order); its views, shaped and typed as `example`'s; and each
    region's (byte offset, bytes per batch row)."""
    layout: dict[str, tuple[int, int]] = {}
    end = 0
    for k, v in example.items():
        row = v[0].numel() * v.element_size() if v.shape[0] else 0
        layout[k] = (end, row)
        end += -(-(row * v.shape[0]) // 16) * 16
    blob = torch.zeros(max(end, 16), dtype=torch.uint8, device=device, pin_memory=pin)
    views = {k: blob[off : off + row * v.shape[0]].view(v.dtype).view(v.shape).copy_(v)
             for (k, v), (off, row) in zip(example.items(), layout.values())}
    return blob, views, layout


class _Staging:
    """Pinned host mirrors of a phase's static inputs, which live in one device byte buffer
    (`_packed`): a step's host inputs and their padding rows are written into a mirror, then the
    bytes they span go to the device in ONE asynchronous copy (a copy per input costs ~2 us of
    the stream's time each before the graph may start). Copies run only from pinned memory (from
    pageable memory the host may wait for the steps launched before, which the overlap schedule
    must not). Two mirrors used in turn; a mirror is rewritten only after its last copy ran (an
    event); with at most one step unread that copy ran long ago. Allocated once: pinning memory
    per call costs more host time than the whole step saves."""

    def __init__(self, blob: torch.Tensor, static: Tensors, layout: dict[str, tuple[int, int]],
                 pad: Tensors) -> None:
        self.blob, self.layout = blob, layout
        self.pad = {k: v.cpu() for k, v in pad.items()}  # one padding row per input
        example = {k: v.cpu() for k, v in static.items()}
        self.sets = [_packed(example, torch.device("cpu"), pin=True)[:2] for _ in range(2)]
        self.copied = [torch.cuda.Event(), torch.cuda.Event()]
        self.used = [False, False]
        self.turn = 0  # the mirror the next `copy_in` writes

    def copy_in(self, inputs: Tensors, bs: int, padded: int) -> Tensors:
        """Enqueue the host tensors of `inputs` (rows 0..bs-1) and their padding rows (bs..padded-1)
        into the static buffers, as one copy; returns the device tensors of `inputs`, which the
        caller copies itself (after this copy: it may span their regions)."""
        host = [k for k, v in inputs.items() if v.device.type == "cpu"]
        if not host:
            return inputs
        i = self.turn
        if self.used[i]:
            self.copied[i].synchronize()
        mirror, views = self.sets[i]
        lo, hi = self.blob.numel(), 0
        for k in host:
            src, dst = inputs[k], views[k]
            dst[(slice(0, bs),) + tuple(slice(0, s) for s in src.shape[1:])].copy_(src)
            if padded > bs:
                dst[bs:padded].copy_(self.pad[k].expand_as(dst[bs:padded]))
            off, row = self.layout[k]
            lo, hi = min(lo, off), max(hi, off + row * padded)
        self.blob[lo:hi].copy_(mirror[lo:hi], non_blocking=True)
        self.copied[i].record()
        self.used[i] = True
        self.turn ^= 1
        return {k: v for k, v in inputs.items() if v.device.type != "cpu"}


@dataclass
class _Entry:
    fn: Phase
    static: Tensors  # inputs at the largest batch size
    pad: Tensors  # one padding row per input
    staging: _Staging | None = None  # CUDA only


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

    @property
    def max_bs(self) -> int:
        return self.batch_sizes[-1]

    def register(self, name: str, fn: Phase, example: Callable[[int], Tensors]) -> None:
        static = example(self.max_bs) if self.mode != "eager" else {}
        pad = {k: v[:1].clone() for k, v in example(1).items()}
        if static and self.device.type == "cuda":  # one buffer: one host-to-device copy a step
            blob, static, layout = _packed(static, self.device)
            self.phases[name] = _Entry(fn, static, pad, _Staging(blob, static, layout, pad))
        else:
            self.phases[name] = _Entry(fn, static, pad)

    # -- capture -------------------------------------------------------------------------------
    def capture_all(self) -> None:
        for name in self.phases:
            for bs in self.batch_sizes:
                self._capture(name, bs)

    def _capture(self, name: str, bs: int) -> None:
        key = (name, bs)
        if self.mode != "cuda":
            self.status[key] = self.mode
            return
        e = self.phases[name]
        inputs = {k: v[:bs] for k, v in e.static.items()}
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: Triton autotuning/compilation, lazy allocations
                    e.fn(inputs)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self.pool):
                out = e.fn(inputs)
            self.graphs[key] = (graph, out)
            self.status[key] = "graphed"
        except Exception as exc:  # noqa: BLE001 - any capture failure is reported, never hidden
            if not self.allow_eager_fallback:
                raise GraphCaptureError(
                    f"CUDA graph capture failed for phase {name!r} at batch size {bs}: "
                    f"{type(exc).__name__}: {exc}. Fix the phase, or start with "
                    "--allow-eager-fallback (slower, reported) or --disable-cuda-graph.") from exc
            log.warning("phase %s bs %d runs EAGER (capture failed: %s)", name, bs, exc)
            self.status[key] = f"eager ({type(exc).__name__})"
            self.fallbacks += 1

    # -- replay --------------------------------------------------------------------------------
    def run(self, name: str, inputs: Tensors, borrow: tuple[str, ...] = ()) -> Tensors:
        """The phase's outputs for `inputs`' batch, copied out of the graph's static buffers,
        except the `borrow`ed ones: views, valid until the phase runs again (for outputs the caller
        reads at once; one copy kernel less each).

        Inputs may live on the host (what the scheduler builds from its lists): on CUDA they go
        through a pinned mirror of the phase's static buffers, with their padding rows, then one
        asynchronous host-to-device copy for all of them (no device copy)."""
        e = self.phases[name]
        bs = next(iter(inputs.values())).shape[0]
        padded = next((b for b in self.batch_sizes if b >= bs), None)
        if self.mode == "eager" or padded is None:
            return e.fn({k: v.to(self.device, non_blocking=True) for k, v in inputs.items()})
        if inputs.keys() != e.static.keys():  # (one copy spans several buffers: none is left out)
            raise ValueError(f"phase {name!r} takes inputs {sorted(e.static)}, got {sorted(inputs)}")
        if e.staging is not None:
            inputs = e.staging.copy_in(inputs, bs, padded)
        for k, src in inputs.items():
            dst = e.static[k]
            dst[(slice(0, bs),) + tuple(slice(0, s) for s in src.shape[1:])].copy_(src, non_blocking=True)
            if padded > bs:
                dst[bs:padded].copy_(e.pad[k].expand_as(dst[bs:padded]))
        graph = self.graphs.get((name, padded))
        if graph is None:  # static mode, or an allowed fallback
            out = e.fn({k: v[:padded] for k, v in e.static.items()})
        else:
            graph[0].replay()
            out = graph[1]
        return {k: v[:bs] if k in borrow else v[:bs].clone() for k, v in out.items()}

    def captured(self, name: str, bs: int) -> torch.cuda.CUDAGraph | None:
        """The CUDA graph a batch of `bs` replays for phase `name`, if one was captured
        (benchmarks replay it alone to time the device)."""
        padded = next((b for b in self.batch_sizes if b >= bs), None)
        entry = self.graphs.get((name, padded)) if padded is not None else None
        return entry[0] if entry is not None else None

    # -- report / teardown ---------------------------------------------------------------------
    def report(self) -> str:
        if not self.phases:
            return "no graphed phases"
        width = max(len(n) for n in self.phases)
        lines = [f"{'phase':<{width}}  " + " ".join(f"{b:>4}" for b in self.batch_sizes)]
        for name in self.phases:
            cells = []
            for b in self.batch_sizes:
                s = self.status.get((name, b), "-")
                cells.append(f"{'G' if s == 'graphed' else ('S' if s == 'static' else 'E'):>4}")
            lines.append(f"{name:<{width}}  " + " ".join(cells))
        legend = "G = CUDA graph, S = static buffers (no capture), E = eager"
        bad = [f"{n}@{b}: {s}" for (n, b), s in self.status.items() if s.startswith("eager")]
        if bad:
            legend += "\nEAGER FALLBACK: " + ", ".join(bad)
        return "\n".join(lines) + "\n" + legend

    def close(self) -> None:
        self.graphs.clear()
        self.phases.clear()
        self.pool = None
