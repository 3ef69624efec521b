"""The engine loop (entrypoints/engine_loop.py) names a step that stalls every stream: one far
slower than the steps before it is logged with its size, and ordinary steps are not."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import pytest

from hotspec.entrypoints import engine_loop
from hotspec.entrypoints.engine_loop import EngineLoop


@dataclass
class StubEngine:
    """An engine whose steps take the given seconds and produce nothing."""

    durations: list[float]
    running: list[object] = field(default_factory=lambda: [object(), object()])
    prefilling: list[object] = field(default_factory=list)

    def step(self) -> list[object]:
        time.sleep(self.durations.pop(0))
        return []


def test_a_step_far_slower_than_the_mean_is_logged(caplog: pytest.LogCaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_loop, "SLOW_STEP_S", 0.05)
    engine = StubEngine([0.002] * 10 + [0.08] + [0.002] * 3)
    loop = EngineLoop(engine)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="hotspec.server"):
        for _ in range(14):
            loop._step()
    slow = [r.getMessage() for r in caplog.records if "slow engine step" in r.getMessage()]
    assert len(slow) == 1 and "(2 requests decoding, 0 prefilling before it)" in slow[0], slow


def test_uniformly_slow_steps_are_not_logged(caplog: pytest.LogCaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_loop, "SLOW_STEP_S", 0.01)
    loop = EngineLoop(StubEngine([0.02] * 8))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="hotspec.server"):
        for _ in range(8):
            loop._step()
    assert not [r for r in caplog.records if "slow engine step" in r.getMessage()]
