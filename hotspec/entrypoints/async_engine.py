"""The engine loop on its own thread, apart from the asyncio event loop that serves HTTP.

Ownership: once started, the engine thread is the only code that touches the Engine (its queues,
allocator, requests and model); everything else talks to it through `_inbox`, a thread-safe queue
of commands (submit, abort, stop), which the thread drains between steps. Results travel back per
request on an asyncio.Queue, filled with `loop.call_soon_threadsafe` (one call per step for all of
a step's events), so coroutines never block on the engine and the engine never waits on them.

Failure containment: a request is validated by `Engine.add_request` on the engine thread, and a
bad one fails its own submission (InvalidRequestError) and nothing else. An unexpected exception
inside `Engine.step()` fails the requests that step was computing (`Engine.fail_in_flight`: their
blocks are freed) with an internal error, and the loop goes on with the others.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from hotspec.engine.engine import Engine, StepOutput
from hotspec.engine.request import Request
from hotspec.errors import HotspecError, InvalidRequestError
from hotspec.sampling_params import SamplingParams

log = logging.getLogger("hotspec.server")


class EngineDeadError(HotspecError, RuntimeError):
    """The engine thread is not running (never started, stopped, or crashed)."""


class RequestFailedError(HotspecError, RuntimeError):
    """The engine failed while computing this request (an internal error, not the request's)."""


@dataclass
class RequestEvent:
    """Output of one engine step for one request. The last event has `finish_reason` set:
    "stop" or "length" (done), "abort" (cancelled) or "error" (`error` says what failed)."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0  # generated so far, this event's tokens included


class EngineObserver(Protocol):
    """Hooks the engine thread calls (metrics); they run on the engine thread, so must be quick
    and thread-safe towards their readers."""

    def on_step(self, engine: Engine, outputs: list[StepOutput]) -> None: ...

    def on_finished(self, engine: Engine, req: Request) -> None: ...

    def on_step_error(self, engine: Engine) -> None: ...


@dataclass(eq=False)
class RequestHandle:
    """The event-loop side of one request. `req` is set by the engine thread and read only there."""

    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[RequestEvent] = field(default_factory=asyncio.Queue)
    accepted: asyncio.Future[None] | None = None
    req: Request | None = None
    finished: bool = False  # event-loop side: the final event was received

    async def stream(self) -> AsyncIterator[list[RequestEvent]]:
        """Events as they arrive, coalesced: each item is every event queued at that moment (a
        slow consumer catches up in one chunk). Ends after the final event."""
        while not self.finished:
            batch = [await self.events.get()]
            while not self.events.empty():
                batch.append(self.events.get_nowait())
            self.finished = batch[-1].finish_reason is not None
            yield batch


@dataclass
class _Submit:
    handle: RequestHandle
    prompt_token_ids: list[int]
    params: SamplingParams


@dataclass
class _Abort:
    handle: RequestHandle


class _Stop:
    pass


_Command = _Submit | _Abort | _Stop
# What the engine thread hands to a request's event loop: an event (a stream item), or the outcome
# of its submission (None: accepted; an exception: rejected).
_Delivery = tuple["RequestHandle", "RequestEvent | BaseException | None"]


class AsyncEngine:
    """Owns an Engine on a background thread; `submit` and `abort` are called from coroutines."""

    def __init__(self, engine: Engine, observer: EngineObserver | None = None) -> None:
        self.engine = engine
        self.observer = observer
        self._inbox: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._handles: dict[int, RequestHandle] = {}  # engine thread only: Request.rid -> handle
        self._thread: threading.Thread | None = None
        # Set (under the lock) once the thread stops reading the inbox: a submission after that
        # would wait forever, so it is refused instead.
        self._closed = False
        self._lock = threading.Lock()
        self.step_errors = 0
        self.consecutive_step_errors = 0

    # -- lifecycle (any thread) ----------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("AsyncEngine already started")
        self._thread = threading.Thread(target=self._run, name="hotspec-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Abort every unfinished request (its blocks are freed) and stop the thread; the Engine
        may be driven directly again afterwards."""
        if self._thread is None:
            return
        self._inbox.put(_Stop())
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
        with self._lock:
            if self._closed or not self.is_alive:
                raise EngineDeadError("the engine is not running")
            self._inbox.put(_Submit(handle, list(prompt_token_ids), params))
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
            self._inbox.put(_Abort(handle))

    # -- the engine thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                try:
                    idle = not self.engine.has_unfinished()
                    if not self._handle_commands(block=idle):
                        return
                    if self.engine.has_unfinished():
                        self._step()
                    else:
                        self._observe("on_step", [])
                except Exception:  # noqa: BLE001 - a bug here must not take the server down
                    log.exception("engine loop error outside a step; failing every request")
                    self._fail(RuntimeError("engine loop error"), everything=True)
        finally:
            self._abort_all("the server is shutting down")

    def _observe(self, hook: str, *args: object) -> None:
        if self.observer is None:
            return
        try:
            getattr(self.observer, hook)(self.engine, *args)
        except Exception:  # noqa: BLE001 - metrics must never break serving
            log.exception("observer %s failed", hook)

    def _handle_commands(self, block: bool) -> bool:
        """Drain the inbox (waiting for a command when idle); False once asked to stop."""
        deliveries: list[_Delivery] = []
        try:
            cmd: _Command | None = self._inbox.get() if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while cmd is not None:
            if isinstance(cmd, _Stop):
                self._post(deliveries)
                return False
            if isinstance(cmd, _Submit):
                deliveries.append((cmd.handle, self._add(cmd)))
            else:
                deliveries += self._abort(cmd.handle)
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                cmd = None
        self._post(deliveries)
        return True

    def _add(self, cmd: _Submit) -> BaseException | None:
        try:
            req = self.engine.add_request(cmd.prompt_token_ids, cmd.params)
        except InvalidRequestError as e:
            return e
        except Exception as e:  # noqa: BLE001 - a broken request must never stop the loop
            log.exception("add_request failed unexpectedly")
            return RequestFailedError(f"internal error while queueing the request: {e!r}")
        cmd.handle.req = req
        self._handles[req.rid] = cmd.handle
        return None

    def _abort(self, handle: RequestHandle) -> list[_Delivery]:
        req = handle.req
        if req is None or self._handles.pop(req.rid, None) is None:
            return []  # never accepted, or already finished
        self.engine.abort(req)
        self._observe("on_finished", req)
        return [(handle, self._final(req, "abort"))]

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:  # noqa: BLE001 - contained: the affected requests fail, not the server
            log.exception("engine step failed; failing the requests it was computing")
            self._fail(e)
            return
        self.consecutive_step_errors = 0
        out: list[_Delivery] = []
        for o in outputs:
            req = o.request
            handle = self._handles.get(req.rid)
            if handle is None:
                continue
            finished = req.finish_reason is not None
            out.append((handle, RequestEvent(o.text_delta, list(o.new_token_ids), req.finish_reason,
                                             None, len(req.prompt_token_ids), len(req.output_token_ids))))
            if finished:
                del self._handles[req.rid]
                self._observe("on_finished", req)
        self._post(out)
        self._observe("on_step", outputs)

    def _fail(self, exc: Exception, everything: bool = False) -> None:
        """Fail the requests a failed step was computing (all of them if `everything`)."""
        self.step_errors += 1
        self.consecutive_step_errors += 1
        message = f"internal error in the engine: {type(exc).__name__}: {exc}"
        if everything:
            self.engine.in_flight = []  # fail_in_flight then takes every unfinished request
        deliveries: list[_Delivery] = []
        for req in self.engine.fail_in_flight(message):
            handle = self._handles.pop(req.rid, None)
            if handle is not None:
                deliveries.append((handle, self._final(req, "error", message)))
                self._observe("on_finished", req)
        self._post(deliveries)
        self._observe("on_step_error")
        self._observe("on_step", [])

    def _abort_all(self, message: str) -> None:
        """On stop: nothing may stay queued or hold blocks once the thread is gone."""
        with self._lock:
            self._closed = True
        deliveries = []
        for handle in list(self._handles.values()):
            assert handle.req is not None
            self.engine.abort(handle.req)
            deliveries.append((handle, self._final(handle.req, "error", message)))
        self._handles.clear()
        while True:  # submissions that never reached the engine
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(cmd, _Submit):
                deliveries.append((cmd.handle, EngineDeadError(message)))
        self._post(deliveries)

    @staticmethod
    def _final(req: Request, reason: str, error: str | None = None) -> RequestEvent:
        return RequestEvent("", [], reason, error, len(req.prompt_token_ids), len(req.output_token_ids))

    @staticmethod
    def _post(deliveries: list[_Delivery]) -> None:
        """Hand results to the event loop(s): one thread-safe call per loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestHandle, object]]] = {}
        for handle, item in deliveries:
            by_loop.setdefault(handle.loop, []).append((handle, item))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass


def _deliver(items: list[tuple[RequestHandle, object]]) -> None:
    """On the event loop: resolve submissions and queue events."""
    for handle, item in items:
        fut = handle.accepted
        if isinstance(item, RequestEvent):
            if fut is not None and not fut.done():  # an abort/stop raced the acceptance
                fut.set_exception(EngineDeadError(item.error or "the request was cancelled"))
            handle.events.put_nowait(item)
        elif fut is not None and not fut.done():
            if item is None:
                fut.set_result(None)
            else:
                assert isinstance(item, BaseException)
                fut.set_exception(item)
