"""Steps launched on the device but not yet read by the host: the overlap schedule's bookkeeping.

With the overlap schedule (EngineConfig.overlap_schedule) the engine launches step N+1 before it
reads step N. Step N+1 must then take what it needs from step N on the device: each worker's step
graph leaves, per batch row, what the next step reads (the next token; for EAGLE also the new
sequence length and RNG offset) in buffers shared by every batch size, and reads a request's
inputs from its row there (`src`) when the host has not seen them yet, or from the host (`src` -1).
`Launches` tracks which requests have such unread steps (`ahead`) and their rows in the newest
launch. At most one launch is unread when the next is built (the engine reads all but the newest),
so a request with unread steps is always in the newest launch.

Neither direction of the host<->device traffic may wait for the step in flight. On CUDA a step
graph reads its host inputs from a pinned slot and publishes its output into another
(runtime/host_io.py: `GraphRunner.read_back` gives a `HostSlot`, whose event is that replay's);
elsewhere a step's output goes back through `HostCopy` (a pinned buffer and an event of its own,
or a snapshot on the CPU). A plain `tolist()` would wait for step N+1 before it could read
step N, and the schedule would overlap nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from hotspec.core.request import Request


class HostCopy:
    """A step's output on its way to the host. The device-to-host copy is enqueued at once, right
    after the graph that wrote the tensor and before any later launch (so the tensor may be a view
    of the graph's static output), into pinned memory; `tolist()` then waits for that copy alone.
    A plain `tensor.tolist()` would queue its copy behind every step launched since and wait for
    them too: with the overlap schedule, the step the host should be overlapping."""

    # pinned buffers free for reuse, by (numel, dtype): pinning memory per step costs more host
    # time than a step of the default model; a buffer returns here once read
    _free: dict[tuple[int, torch.dtype], list[tuple[torch.Tensor, torch.cuda.Event]]] = {}

    def __init__(self, t: torch.Tensor) -> None:
        self.event: torch.cuda.Event | None = None
        self._read: Any = None
        if t.device.type == "cuda":
            key = (t.numel(), t.dtype)
            free = HostCopy._free.get(key)
            if free:
                buf, self.event = free.pop()
            else:
                buf, self.event = torch.empty(key[0], dtype=t.dtype, pin_memory=True), torch.cuda.Event()
            self.host = buf.view(t.shape).copy_(t, non_blocking=True)
            self.event.record()
            self._buf = buf
        else:  # computed already; copied because the next step may overwrite a static buffer
            self.host = t.clone()

    def tolist(self) -> Any:
        if self.event is None:
            return self.host.tolist() if self._read is None else self._read
        self.event.synchronize()
        self._read = self.host.tolist()
        HostCopy._free.setdefault((self._buf.numel(), self._buf.dtype), []).append((self._buf, self.event))
        self.event = None  # the buffer is someone else's now
        return self._read


class Launches:
    def __init__(self) -> None:
        self._queue: deque[tuple[list[Request], Any]] = deque()  # oldest first
        self._ahead: dict[Request, int] = {}  # per request: its rows in unread launches
        self._view = MappingProxyType(self._ahead)
        self._rows: dict[Request, int] = {}  # row of each request in the newest launch

    def __len__(self) -> int:
        return len(self._queue)

    def ahead(self, req: Request) -> int:
        """Launched steps of `req` that the host has not read."""
        return self._ahead.get(req, 0)

    @property
    def counts(self) -> Mapping[Request, int]:
        """`ahead` of every request that has unread launches (a live, read-only view)."""
        return self._view

    def src_rows(self, reqs: list[Request], ahead: list[int]) -> list[int]:
        """Per request (`ahead`: its unread launches): its row in the newest launch if that
        launch is unread, else -1."""
        rows = self._rows
        return [rows[r] if a else -1 for r, a in zip(reqs, ahead)]

    def push(self, reqs: list[Request], payload: Any) -> None:
        self._queue.append((reqs, payload))
        self._rows = {r: i for i, r in enumerate(reqs)}
        for r in reqs:
            self._ahead[r] = self._ahead.get(r, 0) + 1

    def pop(self) -> tuple[list[Request], Any]:
        """The oldest launch (requests, payload); its requests are one step less ahead."""
        reqs, payload = self._queue.popleft()
        for r in reqs:
            self._ahead[r] -= 1
            if not self._ahead[r]:
                del self._ahead[r]
        return reqs, payload

    def clear(self) -> None:
        self._queue.clear()
        self._ahead.clear()
        self._rows = {}
