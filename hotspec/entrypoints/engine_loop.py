"""What the engine thread runs: drain the command inbox between steps, step, post results.

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
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from hotspec.core.request import Request
from hotspec.engine.engine import Engine
from hotspec.engine.outputs import StepOutput
from hotspec.entrypoints.request_handle import (
    EngineDeadError,
    RequestEvent,
    RequestFailedError,
    RequestHandle,
    deliver,
)
from hotspec.errors import InvalidRequestError
from hotspec.sampling_params import SamplingParams

log = logging.getLogger("hotspec.server")
# A step slower than SLOW_STEP_S and SLOW_STEP_RATIO times the running mean is logged: every
# running request's stream stalled that long (a kernel compiled at first use, a host stall), which
# latency percentiles alone never explain.
SLOW_STEP_S, SLOW_STEP_RATIO = 0.2, 10.0


class EngineObserver(Protocol):
    """Hooks the engine thread calls (metrics); they run on the engine thread, so must be quick
    and thread-safe towards their readers."""

    def on_step(self, engine: Engine, outputs: list[StepOutput]) -> None: ...

    def on_finished(self, engine: Engine, req: Request) -> None: ...

    def on_first_token(self, engine: Engine, req: Request, seconds: float) -> None: ...

    def on_step_error(self, engine: Engine) -> None: ...


class Handle(Protocol):
    """A request as the engine loop knows it: `req` is set on the engine thread once accepted
    (RequestHandle in the server's process; engine_process.RemoteHandle in the engine's own)."""

    req: Request | None


@dataclass
class Submit:
    handle: Handle
    prompt_token_ids: list[int]
    params: SamplingParams


@dataclass
class Abort:
    handle: Handle


class Stop:
    pass


Command = Submit | Abort | Stop


class Inbox(Protocol):
    """Where the engine thread reads commands: `get` waits for one, `get_nowait` raises
    queue.Empty when none is there (queue.SimpleQueue's interface)."""

    def get(self) -> Command: ...

    def get_nowait(self) -> Command: ...

# What the engine thread hands to a request's event loop: an event (a stream item), or the outcome
# of its submission (None: accepted; an exception: rejected).
Delivery = tuple[Handle, RequestEvent | BaseException | None]
Post = Callable[[list[Delivery]], None]


class EngineLoop:
    """The engine thread's state. Only `run` (on the engine thread) touches the Engine; other
    threads only put commands in `inbox`, under `lock` for submissions."""

    def __init__(self, engine: Engine, observer: EngineObserver | None = None,
                 post: Post | None = None, source: Inbox | None = None) -> None:
        """`post`: how deliveries leave the engine thread (default: to each handle's event loop);
        `source`: where commands come from (default: `inbox`, which other threads put to)."""
        self.engine = engine
        self.observer = observer
        self._post = post or _post
        self.inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self.source: Inbox = source if source is not None else self.inbox
        self._handles: dict[int, Handle] = {}  # engine thread only: Request.rid -> handle
        # engine thread only: Request.rid -> when its submission reached the loop, until its first
        # token is posted (the engine's own time to first token, beside what clients measure)
        self._arrived: dict[int, float] = {}
        # Set (under the lock) once the thread stops reading the inbox: a submission after that
        # would wait forever, so it is refused instead.
        self.closed = False
        self.lock = threading.Lock()
        self.step_errors = 0
        self.consecutive_step_errors = 0
        self._mean_step_s = 0.0  # exponential mean of step wall times

    def run(self) -> None:
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
        fn = getattr(self.observer, hook, None)
        if fn is None:  # (an observer without this hook)
            return
        try:
            fn(self.engine, *args)
        except Exception:  # noqa: BLE001 - metrics must never break serving
            log.exception("observer %s failed", hook)

    def _handle_commands(self, block: bool) -> bool:
        """Drain the inbox (waiting for a command when idle); False once asked to stop."""
        deliveries: list[Delivery] = []
        try:
            cmd: Command | None = self.source.get() if block else self.source.get_nowait()
        except queue.Empty:
            return True
        while cmd is not None:
            if isinstance(cmd, Stop):
                self._post(deliveries)
                return False
            if isinstance(cmd, Submit):
                deliveries.append((cmd.handle, self._add(cmd)))
            else:
                deliveries += self._abort(cmd.handle)
            try:
                cmd = self.source.get_nowait()
            except queue.Empty:
                cmd = None
        self._post(deliveries)
        return True

    def _add(self, cmd: Submit) -> BaseException | None:
        try:
            # (a grammar compiles on the engine's grammar thread, not this one: engine/grammars.py)
            req = self.engine.add_request(cmd.prompt_token_ids, cmd.params, wait_grammar=False)
        except InvalidRequestError as e:
            return e
        except Exception as e:  # noqa: BLE001 - a broken request must never stop the loop
            log.exception("add_request failed unexpectedly")
            return RequestFailedError(f"internal error while queueing the request: {e!r}")
        cmd.handle.req = req
        self._handles[req.rid] = cmd.handle
        self._arrived[req.rid] = time.perf_counter()
        return None

    def _abort(self, handle: Handle) -> list[Delivery]:
        req = handle.req
        if req is None or self._handles.pop(req.rid, None) is None:
            return []  # never accepted, or already finished
        self._arrived.pop(req.rid, None)
        self.engine.abort(req)
        self._observe("on_finished", req)
        return [(handle, _final(req, "abort"))]

    def _step(self) -> None:
        engine = self.engine
        rows = (len(engine.running), len(engine.prefilling))
        t = time.perf_counter()
        try:
            outputs = engine.step()
        except Exception as e:  # noqa: BLE001 - contained: the affected requests fail, not the server
            log.exception("engine step failed; failing the requests it was computing")
            self._fail(e)
            return
        self.consecutive_step_errors = 0
        took = time.perf_counter() - t
        mean = self._mean_step_s or took  # (the first step is its own mean)
        self._mean_step_s = 0.95 * mean + 0.05 * took
        if took > SLOW_STEP_S and took > SLOW_STEP_RATIO * mean:
            log.warning("slow engine step: %.0f ms (%d requests decoding, %d prefilling before it)",
                        took * 1e3, *rows)
        out: list[Delivery] = []
        now = time.perf_counter()
        for o in outputs:
            req = o.request
            handle = self._handles.get(req.rid)
            if handle is None:
                continue
            arrived = self._arrived.pop(req.rid, None) if o.new_token_ids else None
            if arrived is not None:
                self._observe("on_first_token", req, now - arrived)
            finished = req.finish_reason is not None
            error = req.error if req.finish_reason == "error" else None
            out.append((handle, RequestEvent(o.text_delta, list(o.new_token_ids), req.finish_reason,
                                             error, len(req.prompt_token_ids), len(req.output_token_ids),
                                             o.logprobs, o.prompt_logprobs)))
            if finished:
                del self._handles[req.rid]
                self._arrived.pop(req.rid, None)
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
        deliveries: list[Delivery] = []
        for req in self.engine.fail_in_flight(message):
            handle = self._handles.pop(req.rid, None)
            self._arrived.pop(req.rid, None)
            if handle is not None:
                deliveries.append((handle, _final(req, "error", message)))
                self._observe("on_finished", req)
        self._post(deliveries)
        self._observe("on_step_error")
        self._observe("on_step", [])

    def _abort_all(self, message: str) -> None:
        """On stop: nothing may stay queued or hold blocks once the thread is gone."""
        with self.lock:
            self.closed = True
        deliveries: list[Delivery] = []
        for handle in list(self._handles.values()):
            assert handle.req is not None
            self.engine.abort(handle.req)
            deliveries.append((handle, _final(handle.req, "error", message)))
        self._handles.clear()
        while True:  # submissions that never reached the engine
            try:
                cmd = self.source.get_nowait()
            except queue.Empty:
                break
            if isinstance(cmd, Submit):
                deliveries.append((cmd.handle, EngineDeadError(message)))
        self._post(deliveries)


def _final(req: Request, reason: str, error: str | None = None) -> RequestEvent:
    return RequestEvent("", [], reason, error, len(req.prompt_token_ids), len(req.output_token_ids))


def _post(deliveries: list[Delivery]) -> None:
    """Hand results to the event loop(s): one thread-safe call per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestHandle, object]]] = {}
    for handle, item in deliveries:
        assert isinstance(handle, RequestHandle)
        by_loop.setdefault(handle.loop, []).append((handle, item))
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(deliver, items)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass
