"""What a server's route handlers share: its settings and the engine they serve."""

from __future__ import annotations

from dataclasses import dataclass

from hotspec.engine.engine import Engine
from hotspec.entrypoints.async_engine import AsyncEngine
from hotspec.entrypoints.metrics import EngineMetrics


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str
    api_key: str | None = None
    max_body_bytes: int = 4 * 2**20


@dataclass
class ServerState:
    engine: Engine
    async_engine: AsyncEngine
    metrics: EngineMetrics
    settings: ServerSettings
