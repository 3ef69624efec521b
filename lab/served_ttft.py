"""Where a served request's first token goes: the client's TTFT against the engine's own.

    python3 lab/served_ttft.py [--requests 30] [--max-tokens 8] [--prompt-words N] [-- serve options...]

Starts `hotspec serve` twice (vanilla: --no-default-head; the default head), sends requests one
at a time (an idle server: rate 2's usual case), streamed like bench-serve's client, and prints
per server the client's TTFT p50/min (`--raw`: also a hand-written HTTP client's, without httpx),
the engine's own mean (its /metrics histogram: from the request reaching the engine loop to its
first token leaving it) and the difference (HTTP, chat template, tokenization, the pipe both
ways, detokenization, SSE). --prompt-words N: each prompt N words instead (a different text
each request, so no prefix is shared), e.g. 800 for ~1,000 tokens; the prompt's token count is
printed from the server's usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
from pathlib import Path

import httpx

from hotspec.benchmark.servers import start, stop, wait_healthy

RAW = False
WORDS = 0
PROMPTS = ["Say hello.", "Write a haiku about the sea.",
           "Explain in two sentences why the sky is blue, for a child of eight.",
           "List three facts about the moon and one about the sun, then summarise them. " * 4]


async def raw_ttft(url: str, bodies: list[dict]) -> list[float]:
    """The same requests over one kept-alive connection written and read by hand (no HTTP
    library): what bench-serve's httpx client adds to TTFT is the difference."""
    host, port = url.split("//")[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    out = []
    for body in bodies:
        data = json.dumps(body).encode()
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
                f"application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode()
        t, first = time.perf_counter(), None
        writer.write(head + data)
        assert b"chunked" in (await reader.readuntil(b"\r\n\r\n")).lower()
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            chunk = await reader.readexactly(size + 2)
            if first is None and b'"content":"' in chunk and b'"content":""' not in chunk:
                first = time.perf_counter()
        await reader.readexactly(2)
        if first is not None:
            out.append((first - t) * 1e3)
        await asyncio.sleep(0.05)
    writer.close()
    return out


def prompt(i: int) -> str:
    if not WORDS:
        return PROMPTS[i % len(PROMPTS)]
    words = " ".join(PROMPTS).split()
    return f"Request {i}: " + " ".join(words[(i * 7 + k) % len(words)] for k in range(WORDS))


async def probe(url: str, n: int, max_tokens: int) -> tuple[list[float], float, float]:
    async with httpx.AsyncClient(timeout=120) as c:
        model = (await c.get(url + "/v1/models")).json()["data"][0]["id"]

        async def engine_ttft() -> tuple[float, float]:
            text = (await c.get(url + "/metrics")).text
            got = [float(re.search(rf"^hotspec_time_to_first_token_seconds_{k} (\S+)", text, re.M)
                         .group(1)) for k in ("sum", "count")]  # type: ignore[union-attr]
            return got[0], got[1]

        ttft: list[float] = []
        prompt_tokens: list[int] = []
        for i in range(n + 3):  # three warm-ups
            if i == 3:
                s0, n0 = await engine_ttft()
            body = {"model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0,
                    "stream_options": {"include_usage": True},
                    "messages": [{"role": "user", "content": prompt(i)}]}
            t, first = time.perf_counter(), None
            print(f"TC {time.time():.6f} send", file=sys.stderr, flush=True)
            async with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {") and '"prompt_tokens"' in line:
                        prompt_tokens.append(json.loads(line[6:])["usage"]["prompt_tokens"])
                    if first is None and line.startswith("data: ") and line[6:] != "[DONE]":
                        ch = (json.loads(line[6:]).get("choices") or [{}])[0]
                        if ch.get("delta", {}).get("content"):
                            first = time.perf_counter()
                            print(f"TC {time.time():.6f} first", file=sys.stderr, flush=True)
            if i >= 3 and first is not None:
                ttft.append((first - t) * 1e3)
            await asyncio.sleep(0.05)
        s1, n1 = await engine_ttft()
        if prompt_tokens:
            print(f"  prompts of {min(prompt_tokens)}-{max(prompt_tokens)} tokens", flush=True)
        if RAW:
            bodies = [{"model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0,
                       "messages": [{"role": "user", "content": prompt(n + 3 + i)}]}
                      for i in range(n)]
            raw = await raw_ttft(url, bodies)
            print(f"  raw client: TTFT p50 {statistics.median(raw):.2f} ms, mean "
                  f"{statistics.mean(raw):.2f} (min {min(raw):.2f}) over {len(raw)}", flush=True)
        return ttft, (s1 - s0) * 1e3 / max(n1 - n0, 1), n1 - n0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=30)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--only", choices=["vanilla", "speculative"], default=None)
    p.add_argument("--raw", action="store_true",
                   help="also time the requests with a hand-written HTTP client (after httpx's)")
    p.add_argument("--prompt-words", type=int, default=0)
    p.add_argument("serve_args", nargs="*")
    a = p.parse_args()
    global RAW, WORDS
    RAW, WORDS = a.raw, a.prompt_words
    log_dir = Path("/tmp/served_ttft")
    log_dir.mkdir(exist_ok=True)
    servers = [start(name, args, log_dir) for name, args in
               (("vanilla", ["--no-default-head", *a.serve_args]), ("speculative", list(a.serve_args)))
               if a.only in (None, name)]
    try:
        wait_healthy(servers, 900)
        for s in servers:
            ttft, engine_ms, n = asyncio.run(probe(s.url, a.requests, a.max_tokens))
            med, mean = statistics.median(ttft), statistics.mean(ttft)
            print(f"{s.name}: client TTFT p50 {med:.2f} ms, mean {mean:.2f} (min {min(ttft):.2f}, max "
                  f"{max(ttft):.2f}); engine mean {engine_ms:.2f} ms over {n:g}; the server's part "
                  f"(means) {mean - engine_ms:.2f} ms",
                  flush=True)
    finally:
        stop(servers)
        for s in servers:
            print(f"--- {s.name} log tail\n{s.log_tail(8)}", file=sys.stderr)


if __name__ == "__main__":
    main()
