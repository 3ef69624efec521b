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
from typing import Any

import torch

from hotspec.engine.request import Request
from hotspec.layers import fused
from hotspec.runtime.phase_io import Tensors


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


def from_carry(x: Tensors, carry: Tensors) -> Tensors:
    """Inside a step graph: each input named in `carry` taken from row `src` of the carry where
    `src` >= 0 (what the host has not read yet), else the host's value. Where fused kernels run,
    the int64 vectors (every carry the engine keeps) are picked in one kernel
    (runtime/carry_kernels.py), anything else in torch."""
    src = x["src"]
    keys = [k for k in carry if k in x]
    fast: list[str] = []
    out = dict(x)
    if fused.enabled(src) and src.dtype == torch.int64 and src.dim() == 1 and src.stride(0) == 1:
        from hotspec.runtime.carry_kernels import MAX_PAIRS, carry_pick, pickable

        fast = [k for k in keys if pickable(x[k], carry[k], src)]
        for i in range(0, len(fast), MAX_PAIRS):
            group = fast[i : i + MAX_PAIRS]
            out.update(zip(group, carry_pick(src, [(x[k], carry[k]) for k in group])))
    rest = [k for k in keys if k not in fast]
    if rest:
        take = src >= 0
        row = src.clamp(min=0)
        out.update({k: torch.where(take, carry[k][row], x[k]) for k in rest})
    return out


def to_carry(carry: Tensors, values: Tensors, plus: Tensors | None = None) -> None:
    """Inside a step graph: what the next step reads of this one's rows, row for row: values[k]
    (+ plus[k] where given) into carry[k]. Where fused kernels run, the int64 vectors (every
    carry the engine keeps) are stored in one kernel (runtime/carry_kernels.py), with their
    additions; anything else in torch."""
    plus = plus or {}
    if set(plus) - set(values):
        raise ValueError(f"to_carry: addends without values: {sorted(set(plus) - set(values))}")
    keys = list(values)
    for k in keys:
        if carry[k].shape[0] < values[k].shape[0]:
            raise ValueError(f"to_carry: carry[{k!r}] holds {carry[k].shape[0]} rows, the values "
                             f"{values[k].shape[0]}; size the carry for the largest batch")
    fast: list[str] = []
    if keys and fused.enabled(values[keys[0]]):
        from hotspec.runtime.carry_kernels import MAX_PAIRS, carry_put, puttable

        shape = values[keys[0]].shape  # one kernel stores vectors of one length
        fast = [k for k in keys if puttable(values[k], carry[k], plus.get(k))
                and values[k].shape == shape]
        for i in range(0, len(fast), MAX_PAIRS):
            carry_put([(values[k], plus.get(k), carry[k]) for k in fast[i : i + MAX_PAIRS]])
    for k in keys:
        if k not in fast:
            v = values[k] + plus[k] if k in plus else values[k]
            carry[k][: v.shape[0]].copy_(v)


class Launches:
    def __init__(self) -> None:
        self._queue: deque[tuple[list[Request], Any]] = deque()  # oldest first
        self._ahead: dict[Request, int] = {}  # per request: its rows in unread launches
        self._rows: dict[Request, int] = {}  # row of each request in the newest launch

    def __len__(self) -> int:
        return len(self._queue)

    def ahead(self, req: Request) -> int:
        """Launched steps of `req` that the host has not read."""
        return self._ahead.get(req, 0)

    def src_rows(self, reqs: list[Request]) -> list[int]:
        """Per request: its row in the newest launch if that launch is unread, else -1."""
        rows = []
        for r in reqs:
            if self.ahead(r):
                assert r in self._rows, "a request with unread steps is in the newest launch"
                rows.append(self._rows[r])
            else:
                rows.append(-1)
        return rows

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
