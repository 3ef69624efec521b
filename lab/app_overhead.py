"""The HTTP app's own cost per streamed chat request, without an engine or a network: the app of
`hotspec serve` over an engine client that answers at once (one token, then the end), driven
in-process through httpx's ASGI transport; prints microseconds per request and, with --cprofile
N, the N functions with the most own time.

    python3 lab/app_overhead.py [--requests 400] [--cprofile 30]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
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
        h.events.put_nowait(RequestEvent(" Hello", [22], None, None, len(prompt_token_ids), 1))
        h.events.put_nowait(RequestEvent("", [], "length", None, len(prompt_token_ids), 1))
        return h


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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--cprofile", type=int, default=0)
    a = p.parse_args()
    tok = load_tokenizer(default_model_path())

    async def metrics() -> bytes:
        return b""

    state = ServerState(InstantEngine(), tok, 8192, metrics, ServerSettings("m"),
                        GrammarCheck(tok, lambda: 49152))
    app = _app(state, start=False)

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
