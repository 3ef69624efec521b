"""What a server's route handlers share: its settings, the tokenizer, the grammar check, and the
engine they talk to (on a thread of this process, AsyncEngine, or in a process of its own,
ProcessEngine)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from hotspec.entrypoints.grammar_check import GrammarCheck
from hotspec.entrypoints.request_handle import RequestHandle
from hotspec.sampling_params import SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class EngineClient(Protocol):
    """How handlers reach the engine: submissions and aborts from coroutines, its health."""

    @property
    def is_alive(self) -> bool: ...

    @property
    def consecutive_step_errors(self) -> int: ...

    def start(self) -> None: ...

    def shutdown(self, timeout: float = 30.0) -> None: ...

    async def submit(self, prompt_token_ids: list[int], params: SamplingParams) -> RequestHandle: ...

    def abort(self, handle: RequestHandle) -> None: ...


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str
    api_key: str | None = None
    max_body_bytes: int = 4 * 2**20


@dataclass
class ServerState:
    engine: EngineClient
    tokenizer: PreTrainedTokenizerBase | None
    max_model_len: int
    metrics: Callable[[], Awaitable[bytes]]  # the Prometheus text
    settings: ServerSettings
    grammars: GrammarCheck  # requests' grammars compiled before they reach the engine
