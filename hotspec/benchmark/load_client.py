"""The client side of `hotspec bench-serve` (benchmark/load_test.py): one streamed chat request,
timed chunk by chunk, and the server's /metrics (is it drained? blocks, aborts, tokens, tau?).

aiohttp, as vLLM's serving benchmark: its C stream reader adds less of the client's own time to
each request than httpx (`lab/app_overhead.py` compares them against one server), time that TTFT
would count and that, at thousands of chunks a second, takes the client's one core from reading
the streams."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

# /metrics lines read by the load test; a missing line reads 0.
GAUGES = ("hotspec_num_requests_running", "hotspec_num_requests_waiting", "hotspec_kv_blocks_used",
          "hotspec_kv_blocks_total", "hotspec_generated_tokens_total", "hotspec_engine_step_errors_total",
          "hotspec_request_tau_sum", "hotspec_request_tau_count",
          "hotspec_time_to_first_token_seconds_sum", "hotspec_time_to_first_token_seconds_count",
          "hotspec_kernel_compiles_after_start")
FINISHED = re.compile(r'^hotspec_requests_finished_total\{finish_reason="(\w+)"\} (\S+)$', re.M)
SHAPE_STEPS = re.compile(r'^hotspec_spec_steps_total\{shape="([^"]+)"\} (\S+)$', re.M)


@dataclass
class Job:
    """One request of a workload: the chat body, and after how many streamed chunks the client
    hangs up (None: read to the end)."""

    body: dict[str, Any]
    hang_up_after: int | None = None

    @property
    def greedy(self) -> bool:
        return self.body["temperature"] == 0.0

    def key(self) -> str:
        return json.dumps(self.body, sort_keys=True)


@dataclass
class Result:
    ok: bool = False  # read to [DONE]
    status: int = 0
    error: str = ""
    disconnected: bool = False  # hung up on purpose before [DONE]
    start: float = 0.0
    first: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0
    end: float = 0.0


def session(concurrency: int, timeout: float, api_key: str | None = None) -> aiohttp.ClientSession:
    """The load's client: `concurrency` kept-alive connections (+4 for /metrics)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency + 4, force_close=False),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout),  # between bytes
        headers={"Authorization": f"Bearer {api_key}"} if api_key else {})


async def one_request(client: aiohttp.ClientSession, url: str, job: Job) -> Result:
    res = Result(start=time.perf_counter())
    parts: list[str] = []
    try:
        async with client.post(url + "/v1/chat/completions", json=job.body) as r:
            res.status = r.status
            if r.status != 200:
                res.error = f"HTTP {r.status}: {(await r.read()).decode()[:200]}"
                return res
            async for raw in r.content:
                if not raw.startswith(b"data: "):
                    continue
                data = raw[6:].decode().rstrip("\r\n")
                if data == "[DONE]":
                    res.ok = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:  # the server sends an error event mid-stream only for a 500
                    res.status = 500
                    res.error = f"stream error: {chunk['error'].get('message')}"
                    break
                if chunk.get("usage"):
                    res.completion_tokens = chunk["usage"]["completion_tokens"]
                choices = chunk.get("choices") or []
                if not choices:
                    continue
                res.finish_reason = choices[0].get("finish_reason") or res.finish_reason
                content = choices[0].get("delta", {}).get("content")
                if content:
                    now = time.perf_counter()
                    res.first = res.first or now
                    res.chunk_times.append(now)
                    parts.append(content)
                    if job.hang_up_after is not None and len(res.chunk_times) >= job.hang_up_after:
                        res.disconnected = True
                        r.close()  # the connection closes mid-stream: the server sees the hang-up
                        break
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:  # (JSONDecodeError too)
        res.error = f"{type(e).__name__}: {e}"
    finally:
        res.end = time.perf_counter()
        res.text = "".join(parts)
    return res


async def scrape(client: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The GAUGES, plus `finished_<reason>` for each finish reason counted so far and
    `steps_<shape>` for each speculation shape the engine ran (`off`: plain decoding)."""
    async with client.get(url + "/metrics") as r:
        text = await r.text()
    out = {}
    for name in GAUGES:
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    for reason, value in FINISHED.findall(text):
        out[f"finished_{reason}"] = float(value)
    for shape, value in SHAPE_STEPS.findall(text):
        out[f"steps_{shape}"] = float(value)
    return out


def busy(m: dict[str, float]) -> float:
    return m["hotspec_num_requests_running"] + m["hotspec_num_requests_waiting"] + m["hotspec_kv_blocks_used"]


async def wait_drained(client: aiohttp.ClientSession, url: str,
                       timeout: float) -> tuple[dict[str, float], bool]:
    """(metrics, drained): drained once no request runs or waits and every KV block is free."""
    deadline = time.monotonic() + timeout
    while True:
        m = await scrape(client, url)
        if busy(m) == 0 or time.monotonic() > deadline:
            return m, busy(m) == 0
        await asyncio.sleep(0.1)


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))]
