"""The engine in a process of its own, so that request handling (HTTP, JSON, SSE, tokenization)
never holds the interpreter lock while a step is being built, as SGLang and vLLM run their
engine cores (how `hotspec serve` runs it).

The child builds the Engine from the EngineConfig and runs the same EngineLoop as the thread
variant (engine_loop.py), whose inbox there reads the parent's messages from the pipe on the
engine thread itself (`PipeInbox`); the loop's deliveries go back over a pipe. The parent
(`ProcessEngine`, the interface of AsyncEngine) keeps each request's RequestHandle and reads the
results on its event loop as they arrive (loop.add_reader). Messages, each a tuple:

    parent -> child   ("submit", cid, prompt_token_ids, params) | ("abort", cid) | ("metrics",) | ("stop",)
    child -> parent   ("ready", max_model_len) | ("fatal", message) | ("metrics", text)
                      | ("out", [(cid, event or exception or None)], step_errors, consecutive_errors)

Metrics live in the child (its observer sees every step) and are rendered there on request.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import queue
import signal
import threading
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from hotspec.config import EngineConfig
from hotspec.core.request import Request
from hotspec.entrypoints.engine_loop import Abort, Command, Delivery, EngineLoop, Stop, Submit
from hotspec.entrypoints.request_handle import EngineDeadError, RequestEvent, RequestHandle, deliver
from hotspec.errors import HotspecError
from hotspec.logs import setup_logging
from hotspec.sampling_params import SamplingParams

if TYPE_CHECKING:
    from hotspec.entrypoints.metrics import EngineMetrics

START_TIMEOUT_S = 1800.0  # model load and graph capture


@dataclass(eq=False)
class RemoteHandle:
    """A request in the engine's process: the parent's id for it, and its Request once accepted."""

    cid: int
    req: Request | None = field(default=None, repr=False)


def _child(cfg: EngineConfig, commands: Connection, results: Connection, log_level: str) -> None:
    """The engine process: build the engine, answer messages, run the loop until "stop"."""
    from hotspec.engine.engine import Engine
    from hotspec.entrypoints.metrics import EngineMetrics

    # ^C at a terminal reaches the whole process group: the server stops the engine ("stop"), and
    # the engine stops by itself when the server is gone (the pipe's end)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    setup_logging(log_level)
    try:
        engine = Engine(cfg)
    except BaseException as e:  # noqa: BLE001 - the parent reports it and exits
        results.send(("fatal", f"{type(e).__name__}: {e}"))
        return
    metrics = EngineMetrics()
    metrics.describe_engine(engine)
    handles: dict[int, RemoteHandle] = {}

    def post(deliveries: list[Delivery]) -> None:
        items = [(h.cid, item) for h, item in deliveries if isinstance(h, RemoteHandle)]
        for cid, item in items:  # a request's last delivery: forget it
            if isinstance(item, BaseException) or (isinstance(item, RequestEvent) and item.finish_reason):
                handles.pop(cid, None)
        results.send(("out", items, loop.step_errors, loop.consecutive_step_errors))

    loop = EngineLoop(engine, metrics, post=post,
                      source=PipeInbox(commands, results, handles, metrics))
    results.send(("ready", engine.max_model_len))
    loop.run()


class PipeInbox:
    """The engine loop's inbox in the engine's process: the parent's messages read from the pipe
    by the engine thread itself, between steps (no reader thread: a submission is not handed from
    thread to thread under the interpreter lock). Metrics requests are answered as they are read."""

    def __init__(self, commands: Connection, results: Connection, handles: dict[int, RemoteHandle],
                 metrics: EngineMetrics) -> None:
        self.commands, self.results, self.handles, self.metrics = commands, results, handles, metrics
        self.ended = False  # the parent closed its end: Stop was read, nothing more comes

    def get(self) -> Command:
        """The next command, waiting for one (the engine is idle)."""
        while True:
            cmd = self._read()
            if cmd is not None:
                return cmd

    def get_nowait(self) -> Command:
        """The next command; queue.Empty if no message is waiting."""
        while not self.ended and self.commands.poll(0):
            cmd = self._read()
            if cmd is not None:
                return cmd
        raise queue.Empty

    def _read(self) -> Command | None:
        if self.ended:
            return Stop()
        try:
            msg = self.commands.recv()
        except (EOFError, OSError):  # the parent is gone
            self.ended = True
            return Stop()
        if msg[0] == "submit":
            h = self.handles[msg[1]] = RemoteHandle(msg[1])
            return Submit(h, msg[2], msg[3])
        if msg[0] == "abort":
            gone = self.handles.pop(msg[1], None)
            return Abort(gone) if gone is not None else None
        if msg[0] == "metrics":
            self.results.send(("metrics", self.metrics.render()))
            return None
        self.ended = True  # ("stop",)
        return Stop()


class ProcessEngine:
    """AsyncEngine's interface over an engine in its own process. `start` blocks until the engine
    is built (or raises HotspecError with the child's error)."""

    def __init__(self, cfg: EngineConfig, log_level: str = "info") -> None:
        self.cfg, self.log_level = cfg, log_level
        self.max_model_len = 0
        self.step_errors = self.consecutive_step_errors = 0
        self._ids = itertools.count()
        self._handles: dict[int, RequestHandle] = {}
        self._cids: dict[RequestHandle, int] = {}
        self._send_lock = threading.Lock()
        self._metrics: deque[asyncio.Future[bytes]] = deque()  # metrics requests not answered yet
        self._loop: asyncio.AbstractEventLoop | None = None  # where results are read (_watch)
        self._proc: Any = None
        self._dead = False

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        ctx = mp.get_context("spawn")  # (a fork would copy CUDA and thread state)
        cmd_r, self._commands = ctx.Pipe(duplex=False)
        self._results, res_w = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_child, args=(self.cfg, cmd_r, res_w, self.log_level),
                                 name="hotspec-engine", daemon=True)
        self._proc.start()
        cmd_r.close()
        res_w.close()
        if not self._results.poll(START_TIMEOUT_S):
            self._proc.kill()
            raise HotspecError(f"the engine process did not start within {START_TIMEOUT_S:g} s")
        try:
            msg = self._results.recv()
        except EOFError:
            raise HotspecError(f"the engine process exited at start-up (status "
                               f"{self._proc.exitcode}); its log is above") from None
        if msg[0] == "fatal":
            self._proc.join(10)
            raise HotspecError(f"the engine could not start: {msg[1]}")
        self.max_model_len = msg[1]

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the engine process (it aborts every unfinished request first)."""
        if self._proc is None:
            return
        if self._proc.is_alive():
            self._send(("stop",))
            self._proc.join(timeout)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()

    @property
    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive() and not self._dead

    # -- requests (event loop) -----------------------------------------------------------------
    async def submit(self, prompt_token_ids: list[int], params: SamplingParams) -> RequestHandle:
        """As AsyncEngine.submit."""
        if not self.is_alive:
            raise EngineDeadError("the engine is not running")
        loop = asyncio.get_running_loop()
        self._watch(loop)
        handle = RequestHandle(loop, accepted=loop.create_future())
        cid = next(self._ids)
        self._handles[cid], self._cids[handle] = handle, cid
        try:
            self._send(("submit", cid, list(prompt_token_ids), params))
        except BaseException:  # (not sent: nothing will answer it)
            self._handles.pop(cid, None)
            self._cids.pop(handle, None)
            raise
        assert handle.accepted is not None
        try:
            await handle.accepted
        except asyncio.CancelledError:
            self.abort(handle)
            raise
        return handle

    def abort(self, handle: RequestHandle) -> None:
        cid = self._cids.get(handle)
        if cid is not None and not handle.finished and self.is_alive:
            self._send(("abort", cid))

    async def metrics(self) -> bytes:
        """The engine's Prometheus text (rendered in its process); b"" if it does not answer."""
        loop = asyncio.get_running_loop()
        self._watch(loop)
        fut: asyncio.Future[bytes] = loop.create_future()
        self._metrics.append(fut)
        self._send(("metrics",))
        if self._dead:
            self._gone()
        try:
            return await asyncio.wait_for(fut, 10.0)
        except TimeoutError:
            return b""

    # -- plumbing ------------------------------------------------------------------------------
    def _send(self, msg: tuple[Any, ...]) -> None:
        with self._send_lock:
            try:
                self._commands.send(msg)
            except (BrokenPipeError, OSError):
                self._dead = True

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the engine's results on `loop` itself as they arrive (loop.add_reader): no
        results thread handing them over under the interpreter lock."""
        if self._loop is loop:
            return
        if self._loop is not None and not self._loop.is_closed():
            raise RuntimeError("a ProcessEngine serves the event loop of its first request only")
        self._loop = loop
        loop.add_reader(self._results.fileno(), self._on_results)

    def _on_results(self) -> None:
        """(event loop) Every message waiting on the results pipe."""
        try:
            while self._results.poll(0):
                msg = self._results.recv()
                if msg[0] == "metrics":
                    while self._metrics:
                        fut = self._metrics.popleft()
                        if not fut.done():
                            fut.set_result(msg[1])
                            break
                    continue
                _, items, self.step_errors, self.consecutive_step_errors = msg
                self._deliver(items)
        except (EOFError, OSError):
            assert self._loop is not None
            self._loop.remove_reader(self._results.fileno())
            self._dead = True
            self._gone()

    def _gone(self) -> None:
        """The process is gone: every request still open fails, metrics answer nothing."""
        while self._metrics:
            fut = self._metrics.popleft()
            if not fut.done():
                fut.set_result(b"")
        self._deliver([(cid, RequestEvent("", [], "error", "the engine process exited"))
                       for cid in list(self._handles)])

    def _deliver(self, items: list[tuple[int, object]]) -> None:
        """(event loop) Hand each item to its request; a request's last item forgets it."""
        batch: list[tuple[RequestHandle, object]] = []
        for cid, item in items:
            handle = self._handles.get(cid)
            if handle is None:
                continue
            if isinstance(item, BaseException) or (
                    isinstance(item, RequestEvent) and item.finish_reason is not None):
                del self._handles[cid]
                self._cids.pop(handle, None)
            batch.append((handle, item))
        deliver(batch)
