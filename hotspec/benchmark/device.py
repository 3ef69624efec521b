"""Device helpers for timing: synchronise before reading a clock, time a CUDA graph, name the
machine."""

from __future__ import annotations

import os
import platform
import statistics
from pathlib import Path
from typing import Protocol

import torch


def sync(device: torch.device) -> None:
    """Wait for queued device work, so that a host clock read after it covers that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model with its logical CPU and torch thread counts."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} logical CPUs, {torch.get_num_threads()} torch threads"


class Replayable(Protocol):
    def replay(self) -> None: ...


def graph_replay_ms(graph: Replayable, iters: int) -> float:
    """Median device time of one replay of `graph` in ms (CUDA events around each replay, after
    one warm-up replay): the GPU's own time, no host work."""
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
