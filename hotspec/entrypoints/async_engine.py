"""The engine loop on its own thread, apart from the asyncio event loop that serves HTTP.

Ownership: once started, the engine thread is the only code that touches the Engine (its queues,
allocator, requests and model); everything else talks to it through the loop's inbox, a
thread-safe queue of commands (submit, abort, stop), which the thread drains between steps
(engine_loop.py). Results travel back per request on an asyncio.Queue, filled with
`loop.call_soon_threadsafe` (one call per step for all of a step's events), so coroutines never
block on the engine and the engine never waits on them (request_handle.py).
"""

from __future__ import annotations

import asyncio
import threading

from hotspec.engine.engine import Engine
from hotspec.entrypoints.engine_loop import Abort, EngineLoop, EngineObserver, Stop, Submit
from hotspec.entrypoints.request_handle import (
    EngineDeadError,
    RequestEvent,
    RequestFailedError,
    RequestHandle,
)
from hotspec.sampling_params import SamplingParams


class AsyncEngine:
    """Owns an Engine on a background thread; `submit` and `abort` are called from coroutines."""

    def __init__(self, engine: Engine, observer: EngineObserver | None = None) -> None:
        self.engine = engine
        self.observer = observer
        self._engine_loop = EngineLoop(engine, observer)
        self._thread: threading.Thread | None = None

    @property
    def step_errors(self) -> int:
        return self._engine_loop.step_errors

    @property
    def consecutive_step_errors(self) -> int:
        return self._engine_loop.consecutive_step_errors

    # -- lifecycle (any thread) ----------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("AsyncEngine already started")
        self._thread = threading.Thread(target=self._engine_loop.run, name="hotspec-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Abort every unfinished request (its blocks are freed) and stop the thread; the Engine
        may be driven directly again afterwards."""
        if self._thread is None:
            return
        self._engine_loop.inbox.put(Stop())
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"the engine thread did not stop within {timeout}s")

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- requests (event loop) -----------------------------------------------------------------
    async def submit(self, prompt_token_ids: list[int], params: SamplingParams) -> RequestHandle:
        """Queue a request; returns once the engine accepted it. Raises InvalidRequestError (bad
        request: nothing was queued) or EngineDeadError."""
        loop = asyncio.get_running_loop()
        handle = RequestHandle(loop, accepted=loop.create_future())
        with self._engine_loop.lock:
            if self._engine_loop.closed or not self.is_alive:
                raise EngineDeadError("the engine is not running")
            self._engine_loop.inbox.put(Submit(handle, list(prompt_token_ids), params))
        assert handle.accepted is not None
        try:
            await handle.accepted
        except asyncio.CancelledError:  # the caller went away while the engine was validating
            self.abort(handle)
            raise
        return handle

    def abort(self, handle: RequestHandle) -> None:
        """Cancel a request; the engine thread frees its blocks before its next step. Idempotent,
        non-blocking, safe after the request finished."""
        if not handle.finished:
            self._engine_loop.inbox.put(Abort(handle))


__all__ = ["AsyncEngine", "EngineDeadError", "EngineObserver", "RequestEvent", "RequestFailedError",
           "RequestHandle"]
