"""The HTTP app's own cost per streamed chat request, without an engine or a network: the app of
`hotspec serve` over an engine client that answers at once (one token, then the end), driven
in-process through httpx's ASGI transport; prints microseconds per request and, with --cprofile
N, the N functions with the most own time. `--socket LOOP/HTTP ...` serves the app with uvicorn in
a child process instead (e.g. asyncio/h11, uvloop/httptools, `+log` for access logs) and times
each request's first SSE chunk and its end from a hand-written client on a kept-alive connection.

    python3 lab/app_overhead.py [--requests 400] [--cprofile 30] [--socket asyncio/h11 uvloop/httptools]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import statistics
import subprocess
import sys
import time

import httpx

from hotspec.entrypoints.grammar_check import GrammarCheck
from hotspec.entrypoints.request_handle import RequestEvent, RequestHandle
from hotspec.entrypoints.server import _app
from hotspec.entrypoints.server_state import ServerSettings, ServerState
from hotspec.models.default_model import default_model_path
from hotspec.models.loader import load_tokenizer
from hotspec.sampling_params import SamplingParams


class InstantEngine:
    """An engine client whose every request gets one token at once and finishes."""

    is_alive = True
    consecutive_step_errors = 0

    def start(self) -> None: ...

    def shutdown(self, timeout: float = 30.0) -> None: ...

    def abort(self, handle: RequestHandle) -> None: ...

    async def submit(self, prompt_token_ids: list[int], params: SamplingParams) -> RequestHandle:
        loop = asyncio.get_running_loop()
        h = RequestHandle(loop)
        h.put(RequestEvent(" Hello", [22], None, None, len(prompt_token_ids), 1))
        h.put(RequestEvent("", [], "length", None, len(prompt_token_ids), 1))
        return h


class SteppingEngine(InstantEngine):
    """An engine client that, like a decode step every `step_ms`, gives every running request one
    token a step (each step's tokens delivered together, as the engine process's pipe does)."""

    def __init__(self, step_ms: float) -> None:
        self.step_ms, self.running = step_ms, {}  # type: dict[RequestHandle, list[int]]
        self.task: asyncio.Task[None] | None = None

    async def _steps(self) -> None:
        while self.running:
            await asyncio.sleep(self.step_ms / 1e3)
            for h, state in list(self.running.items()):
                state[0] += 1
                done = state[0] >= state[1]
                h.put(RequestEvent(" word", [22], "length" if done else None, None,
                                                 8, state[0]))
                if done:
                    del self.running[h]

    def abort(self, handle: RequestHandle) -> None:
        self.running.pop(handle, None)

    async def submit(self, prompt_token_ids: list[int], params: SamplingParams) -> RequestHandle:
        h = RequestHandle(asyncio.get_running_loop())
        self.running[h] = [0, params.max_tokens or 16]
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._steps())
        return h


async def stream_load(port: int, clients: int, tokens: int, seconds: float) -> float:
    """Streamed chats from `clients` connections (aiohttp) for `seconds`: tokens/s received."""
    import aiohttp

    body = {"model": "m", "stream": True, "max_tokens": tokens,
            "messages": [{"role": "user", "content": "Explain why the sky is blue."}]}
    got, end = 0, time.perf_counter() + seconds

    async def one(c: aiohttp.ClientSession) -> None:
        nonlocal got
        while time.perf_counter() < end:
            async with c.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
                async for line in r.content:
                    if line.startswith(b"data: {") and b'"content":"' in line:
                        got += 1
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as c:
        t = time.perf_counter()
        await asyncio.gather(*(one(c) for _ in range(clients)))
        return got / (time.perf_counter() - t)


async def drive(client: httpx.AsyncClient, n: int) -> float:
    body = {"model": "m", "stream": True, "max_tokens": 1,
            "messages": [{"role": "user", "content": "Explain why the sky is blue."}]}
    t = time.perf_counter()
    for _ in range(n):
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200, await r.aread()
            async for _line in r.aiter_lines():
                pass
    return (time.perf_counter() - t) / n * 1e6


PROFILE = 0


STEP_MS = 0.0


def make_app():  # type: ignore[no-untyped-def]
    tok = load_tokenizer(default_model_path())

    async def metrics() -> bytes:
        return b""

    engine = SteppingEngine(STEP_MS) if STEP_MS else InstantEngine()
    state = ServerState(engine, tok, 8192, metrics, ServerSettings("m"),
                        GrammarCheck(tok, lambda: 49152))
    return _app(state, start=False)


async def socket_client(port: int, n: int) -> tuple[list[float], list[float]]:
    """Per request: ms to the first SSE chunk with content, and to the end of the response."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps({"model": "m", "stream": True, "max_tokens": 1, "messages": [
        {"role": "user", "content": "Explain why the sky is blue."}]}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(data)}\r\n\r\n").encode()
    firsts, ends = [], []
    for _ in range(n):
        t, first = time.perf_counter(), None
        writer.write(head + data)
        await reader.readuntil(b"\r\n\r\n")
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            chunk = await reader.readexactly(size + 2)
            if first is None and b'"content":"' in chunk and b'"content":""' not in chunk:
                first = time.perf_counter()
        await reader.readexactly(2)
        firsts.append(((first or t) - t) * 1e3)
        ends.append((time.perf_counter() - t) * 1e3)
        await asyncio.sleep(0.005)
    writer.close()
    return firsts, ends


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (Linux /proc)."""
    import os

    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def socket_run(kind: str, n: int) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, __file__, "--listen", str(port), "--kind", kind,
                             "--cprofile", str(PROFILE), "--step-ms", str(STEP_MS)])
    try:
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                time.sleep(0.1)
        asyncio.run(socket_client(port, 20))
        if STEP_MS:
            for clients in (16, 64):
                cpu0, t0 = cpu_seconds(proc.pid), time.perf_counter()
                rate = asyncio.run(stream_load(port, clients, 64, 8.0))
                cpu = (cpu_seconds(proc.pid) - cpu0) / (time.perf_counter() - t0)
                print(f"{kind}: {clients} streams, a step every {STEP_MS:g} ms: {rate:,.0f} tokens/s "
                      f"(the steps' pace: {clients / STEP_MS * 1e3:,.0f}); the server's CPU "
                      f"{cpu * 1e6 / rate:.1f} us a token ({cpu:.0%} of a core)", flush=True)
            return
        firsts, ends = asyncio.run(socket_client(port, n))
        print(f"{kind}: first chunk p50 {statistics.median(firsts):.3f} ms (min {min(firsts):.3f}),"
              f" whole response p50 {statistics.median(ends):.3f} ms over {n}", flush=True)
    finally:
        proc.terminate()
        proc.wait()


def listen(port: int, kind: str) -> None:
    import uvicorn

    loop, http = kind.removesuffix("+log").split("/")
    app = make_app()
    prof = cProfile.Profile() if PROFILE else None
    if prof:
        prof.enable()
    uvicorn.run(app, host="127.0.0.1", port=port, loop=loop, http=http,
                log_level="warning", access_log=kind.endswith("+log"))
    if prof:  # the server's own time by function, after SIGTERM
        prof.disable()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(PROFILE)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--cprofile", type=int, default=0)
    p.add_argument("--socket", nargs="*", default=None)
    p.add_argument("--listen", type=int, default=0)
    p.add_argument("--kind", default="asyncio/h11")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="with --socket: a stepping engine (a token per running request every STEP_MS)"
                   " under streamed load; tokens/s the app carries")
    a = p.parse_args()
    global PROFILE, STEP_MS
    PROFILE, STEP_MS = a.cprofile, a.step_ms
    if a.listen:
        return listen(a.listen, a.kind)
    if a.socket is not None:
        for kind in a.socket or ["asyncio/h11"]:
            socket_run(kind, a.requests)
        return
    app = make_app()

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            await drive(c, 20)
            print(f"{await drive(c, a.requests):.0f} us a request (client and app, one process)")
            if a.cprofile:
                prof = cProfile.Profile()
                prof.enable()
                await drive(c, a.requests)
                prof.disable()
                pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(a.cprofile)

    asyncio.run(run())


if __name__ == "__main__":
    main()
