"""A graphed step's host inputs and read-back without copies on the stream: zero-copy through
pinned memory, in two slots chosen by a step counter on the device.

A host-to-device copy of a step's inputs and a device-to-host copy of its tokens between two
graphs are ~1-3 us of transfer each, but each also waits for the op before it and delays the
graph after it (`decode_bench.py --step-timeline` shows the gaps). Here the graph itself moves
the bytes: its first kernel (`fetch`) reads the inputs from a pinned host buffer over PCIe into
the static buffers, its last (`publish`) writes the outputs the host reads into another pinned
buffer; the stream runs graph after graph. The kernels live in runtime/host_io_kernels.py,
imported where a graph captures them (CUDA only).

The host writes step N's inputs while step N-1 may still be running, so each pinned buffer has
two slots: step N uses slot N % 2. The graph cannot be told N (that would be an input), so the
device keeps N itself (`counter`): `fetch` reads it to choose its slot, `publish` (or `bump`,
when a graph publishes nothing) writes the slot it chose for the outputs and counts it up. The
host keeps the same count (runtime/graph_runner.py counts every replay and resets the device's
after capture), and before it rewrites a slot it waits for the event of the last replay that used
it: with the overlap schedule that replay finished long ago.
"""

from __future__ import annotations

from typing import Any

import torch

from hotspec.runtime.phase_io import Tensors

FETCH_BLOCK = 1024  # int32 words a fetch program reads (4 KiB: one round trip over PCIe)
PUBLISH_BLOCK = 1024



def fill_rows(dst: torch.Tensor, src: torch.Tensor, padded: int, pad: torch.Tensor) -> None:
    """A static buffer's rows for one run: src's rows (and columns: it may be narrower) first, then
    copies of the padding row `pad` up to `padded` rows (on the host or the device; the device's
    copies are asynchronous)."""
    bs = src.shape[0]
    dst[(slice(0, bs),) + tuple(slice(0, n) for n in src.shape[1:])].copy_(src, non_blocking=True)
    if padded > bs:
        dst[bs:padded].copy_(pad.expand_as(dst[bs:padded]))


def layout_of(example: Tensors) -> tuple[dict[str, tuple[int, int]], int]:
    """Each tensor's region in one byte buffer, (byte offset, bytes per batch row), 16-byte
    aligned, in the dict's order; and the buffer's size."""
    layout: dict[str, tuple[int, int]] = {}
    end = 0
    for k, v in example.items():
        row = v[0].numel() * v.element_size() if v.shape[0] else 0
        layout[k] = (end, row)
        end += -(-(row * v.shape[0]) // 16) * 16
    return layout, max(end, 16)


def views_of(buf: torch.Tensor, example: Tensors, layout: dict[str, tuple[int, int]]) -> Tensors:
    """Views of the uint8 buffer `buf` typed and shaped as `example`'s tensors, at `layout`."""
    return {k: buf[off : off + row * v.shape[0]].view(v.dtype).view(v.shape)
            for (k, v), (off, row) in zip(example.items(), layout.values())}


class _Staged:
    """Static buffers that are views of one device byte buffer (`blob`, laid out by layout_of),
    holding `example`'s values, and its mirror on the host: [2, bytes], pinned where `pin`, each
    slot viewed as `example`'s tensors (`mirrors`) and holding its values."""

    def __init__(self, example: Tensors, device: torch.device, pin: bool) -> None:
        self.layout, size = layout_of(example)
        self.blob = torch.zeros(size, dtype=torch.uint8, device=device)
        self.static = views_of(self.blob, example, self.layout)
        self.pinned = torch.zeros(2, size, dtype=torch.uint8, pin_memory=pin)
        host = {k: v.cpu() for k, v in example.items()}
        self.mirrors = [views_of(self.pinned[s], host, self.layout) for s in range(2)]
        for k, v in example.items():
            self.static[k].copy_(v)
            for m in self.mirrors:
                m[k].copy_(host[k])


class HostInputs(_Staged):
    """A phase's inputs that come from the host: their static buffers, views of one device byte
    buffer (the 1-row ones first, so a small batch's rows are a short prefix), and its pinned
    mirror in two slots [2, bytes], which the host writes and the graph's `fetch` reads."""

    def __init__(self, static: Tensors, pad: Tensors, device: torch.device) -> None:
        order = sorted(static, key=lambda k: static[k][0].numel() * static[k].element_size())
        super().__init__({k: static[k] for k in order}, device, pin=True)
        self.pad = {k: pad[k].cpu() for k in order}  # one padding row per input
        self.done = [torch.cuda.Event(), torch.cuda.Event()]  # the last replay that read a slot
        self.used = [False, False]

    def span(self, padded: int) -> int:
        """The bytes a graph of `padded` rows fetches: every input's first `padded` rows."""
        return -(-max(off + row * padded for off, row in self.layout.values()) // 4) * 4

    def write(self, inputs: Tensors, padded: int, slot: int) -> None:
        """Each input's rows, then the padding rows up to `padded`, into mirror `slot`
        (after the last replay that read it: at once with at most one step in flight)."""
        if self.used[slot]:
            self.done[slot].synchronize()
        for k, src in inputs.items():
            fill_rows(self.mirrors[slot][k], src, padded, self.pad[k])

    def replayed(self, slot: int) -> None:
        """After the replay that read `slot` was enqueued."""
        self.done[slot].record()
        self.used[slot] = True


class StagedInputs(_Staged):
    """A bucket graph's host inputs (prefill: ids, positions, slots, lengths, block tables),
    whole tensors of one fixed size each: their static buffers are views of one device byte
    buffer, filled by ONE copy from a pinned mirror in two slots (`write`), not a copy per input
    from pageable memory, each staged by the driver on the host. The host rewrites a slot after
    the copy that last read it (an event; two steps back)."""

    def __init__(self, example: Tensors, device: torch.device) -> None:
        pin = device.type == "cuda"
        super().__init__(example, device, pin)
        self.done = [torch.cuda.Event() if pin else None for _ in range(2)]
        self.slot = 0

    def write(self, inputs: Tensors) -> None:
        """The inputs (host tensors of the static shapes) into the static buffers: into the next
        pinned slot, then one asynchronous copy of the slot to the device."""
        s, self.slot = self.slot, 1 - self.slot
        done = self.done[s]
        if done is not None:
            done.synchronize()
        mirror = self.mirrors[s]
        for k, v in inputs.items():
            mirror[k].copy_(v)
        self.blob.copy_(self.pinned[s], non_blocking=True)
        if done is not None:
            done.record()


def words(t: torch.Tensor) -> torch.Tensor:
    """`t`'s bytes as int32 words (contiguous, a multiple of 4 bytes: what fetch and publish move)."""
    if not t.is_contiguous() or (t.numel() * t.element_size()) % 4:
        raise ValueError(f"host_io moves contiguous tensors of whole 4-byte words, got {tuple(t.shape)} "
                         f"{t.dtype} (contiguous: {t.is_contiguous()})")
    return t.reshape(-1).view(torch.uint8).view(torch.int32)


def fetch(src: torch.Tensor, dst: torch.Tensor, counter: torch.Tensor, nbytes: int) -> None:
    """dst[:nbytes] = slot (counter % 2) of src, a pinned uint8 buffer [2, slot bytes]; dst: the
    device uint8 buffer of the static inputs."""
    if nbytes % 4 or src.dim() != 2 or src.shape[0] != 2 or nbytes > src.shape[1] or (
            dst.is_cuda and not src.is_pinned()):
        raise ValueError("fetch: a pinned [2, slot bytes] buffer, at most a slot of whole 4-byte words")
    from hotspec.runtime.host_io_kernels import fetch_kernel

    n = nbytes // 4
    fetch_kernel[(-(-n // FETCH_BLOCK),)](words(src), words(dst), counter, n, src.shape[1] // 4,
                                          BLOCK=FETCH_BLOCK)


def publish(src: torch.Tensor, dst: torch.Tensor, counter: torch.Tensor, bump: bool) -> None:
    """Slot (counter % 2) of dst, a pinned uint8 buffer [2, slot bytes], gets src's bytes; with
    `bump`, the counter counts the step."""
    w = words(src)
    if dst.dim() != 2 or dst.shape[0] != 2 or dst.shape[1] < w.numel() * 4 or (
            src.is_cuda and not dst.is_pinned()):
        raise ValueError("publish: a pinned [2, slot bytes] buffer as large as the output")
    from hotspec.runtime.host_io_kernels import publish_kernel

    publish_kernel[(1,)](w, words(dst), counter, w.numel(), dst.shape[1] // 4, BUMP=bump,
                         BLOCK=PUBLISH_BLOCK)


def bump(counter: torch.Tensor) -> None:
    from hotspec.runtime.host_io_kernels import bump_kernel

    bump_kernel[(1,)](counter)


class HostSlot:
    """A published output of one replay, read on the host: `tolist()` waits for that replay alone
    (its event) and reads the pinned slot the graph wrote. A slot is rewritten by the replay two
    steps later; reading after that is an error, not another step's tokens."""

    def __init__(self, view: torch.Tensor, event: torch.cuda.Event, writers: dict[Any, int],
                 key: Any, count: int) -> None:
        """writers[key]: the count of the replay that last wrote this slot (the owner updates it)."""
        self.view, self.event, self._writers, self._key, self.count = view, event, writers, key, count
        self._read: Any = None

    def tolist(self) -> Any:
        if self._read is None:
            if self._writers.get(self._key) != self.count:
                raise RuntimeError(f"read-back of replay {self.count} after its pinned slot was "
                                   "reused: read a step's outputs before launching two more")
            self.event.synchronize()
            self._read = self.view.tolist()
        return self._read
