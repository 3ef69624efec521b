"""The device time of a captured graph: what the adaptive policy's start-up step costs and the
benchmarks' replay figures are made of."""

from __future__ import annotations

import statistics
from typing import Protocol

import torch


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
