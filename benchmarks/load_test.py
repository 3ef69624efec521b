"""Load test for a running `hotspec serve`: streaming chat clients, a request-rate sweep, and
clients that hang up mid-stream.

    hotspec serve --port 30000 &                                             # vanilla
    hotspec serve --port 30001 --speculative-algorithm EAGLE3 ... &          # speculative
    python benchmarks/load_test.py --target vanilla=http://127.0.0.1:30000 \
        --target eagle3=http://127.0.0.1:30001 --num-requests 500 --concurrency 64 \
        --rates 2,8,32,inf --out load.json

For each target and request rate (Poisson arrivals; `inf` sends everything at once), at most
`--concurrency` requests are in flight. Reported: completed / failed / disconnected requests,
output tokens/s, TTFT and inter-token latency (ITL: gap between streamed chunks) p50/p99, and TPOT
((latency - TTFT) / (tokens - 1)) p50. After each run the server's /metrics must show no running
request and no KV block in use (a stuck or leaked request fails the run); the mean tau of the
speculative requests finished during the run is read from /metrics too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

DEFAULT_PROMPTS = Path(__file__).with_name("prompts_small.jsonl")


@dataclass
class Result:
    ok: bool = False
    status: int = 0
    error: str = ""
    disconnected: bool = False
    start: float = 0.0
    first: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    end: float = 0.0


@dataclass
class RunReport:
    target: str
    rate: str
    requests: int
    completed: int
    failed: int
    disconnected: int
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float
    ttft_ms_p50: float
    ttft_ms_p99: float
    itl_ms_p50: float
    itl_ms_p99: float
    tpot_ms_p50: float
    tau_mean: float | None
    errors: list[str]


def read_prompts(path: Path) -> list[str]:
    prompts = []
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            prompts.append(row["turns"][0] if "turns" in row else row["prompt"])
    if not prompts:
        raise SystemExit(f"no prompts in {path}")
    return prompts


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))]


async def one_request(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                      hang_up_after: int | None) -> Result:
    res = Result(start=time.perf_counter())
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            res.status = r.status_code
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    res.ok = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = f"stream error: {chunk['error'].get('message')}"
                    break
                if chunk.get("usage"):
                    res.completion_tokens = chunk["usage"]["completion_tokens"]
                choices = chunk.get("choices") or []
                if choices and choices[0].get("delta", {}).get("content"):
                    now = time.perf_counter()
                    res.first = res.first or now
                    res.chunk_times.append(now)
                    if hang_up_after is not None and len(res.chunk_times) >= hang_up_after:
                        res.disconnected = True
                        break  # leaving the block closes the connection mid-stream
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
    finally:
        res.end = time.perf_counter()
    return res


async def scrape(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    text = (await client.get(url + "/metrics")).text
    out = {}
    for name in ("hotspec_num_requests_running", "hotspec_num_requests_waiting", "hotspec_kv_blocks_used",
                 "hotspec_request_tau_sum", "hotspec_request_tau_count"):
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        if m:
            out[name] = float(m.group(1))
    return out


async def wait_drained(client: httpx.AsyncClient, url: str, timeout: float) -> dict[str, float]:
    """Every request finished or aborted and every KV block free, or raise."""
    deadline = time.monotonic() + timeout
    while True:
        m = await scrape(client, url)
        busy = (m.get("hotspec_num_requests_running", 0) + m.get("hotspec_num_requests_waiting", 0)
                + m.get("hotspec_kv_blocks_used", 0))
        if busy == 0:
            return m
        if time.monotonic() > deadline:
            raise RuntimeError(f"server did not drain after the run: {m}")
        await asyncio.sleep(0.1)


async def run_one(args: argparse.Namespace, label: str, url: str, rate: float, prompts: list[str],
                  model: str) -> RunReport:
    rng = random.Random(args.seed)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.concurrency + 4, max_keepalive_connections=args.concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout), limits=limits,
                                 headers=headers) as client:
        before = await wait_drained(client, url, args.timeout)
        gate = asyncio.Semaphore(args.concurrency)

        async def gated(body: dict[str, Any], hang: int | None) -> Result:
            async with gate:
                return await one_request(client, url, body, hang)

        tasks = []
        t0 = time.perf_counter()
        for i in range(args.num_requests):
            greedy = rng.random() < args.greedy_fraction
            body: dict[str, Any] = {
                "model": model, "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": prompts[i % len(prompts)]}],
                "max_tokens": rng.randint(args.min_tokens, args.max_tokens),
                "temperature": 0.0 if greedy else 0.8, "top_p": 1.0 if greedy else 0.95,
                "ignore_eos": args.ignore_eos}
            hang = rng.randint(1, 8) if rng.random() < args.disconnect_fraction else None
            tasks.append(asyncio.create_task(gated(body, hang)))
            if math.isfinite(rate):
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
        after = await wait_drained(client, url, args.timeout)

    done = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok and not r.disconnected]
    ttft = [(r.first - r.start) * 1e3 for r in done if r.first is not None]
    itl = [(b - a) * 1e3 for r in done for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    tpot = [(r.end - r.first) * 1e3 / (r.completion_tokens - 1) for r in done
            if r.first is not None and r.completion_tokens > 1]
    tokens = sum(r.completion_tokens for r in done)
    taus = after.get("hotspec_request_tau_count", 0) - before.get("hotspec_request_tau_count", 0)
    tau = ((after.get("hotspec_request_tau_sum", 0) - before.get("hotspec_request_tau_sum", 0)) / taus
           if taus else None)
    return RunReport(
        label, "inf" if math.isinf(rate) else f"{rate:g}", len(results), len(done), len(failed),
        sum(r.disconnected for r in results), duration, len(done) / duration, tokens / duration,
        percentile(ttft, 50), percentile(ttft, 99), percentile(itl, 50), percentile(itl, 99),
        statistics.median(tpot) if tpot else float("nan"), tau,
        sorted({r.error for r in failed})[:5])


async def served_model(url: str, api_key: str | None) -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(headers=headers) as client:
        r = await client.get(url + "/v1/models")
        r.raise_for_status()
        return r.json()["data"][0]["id"]


def table(reports: list[RunReport]) -> str:
    head = ("target", "rate", "ok", "fail", "hangup", "req/s", "tok/s", "TTFT p50", "TTFT p99",
            "ITL p50", "ITL p99", "TPOT p50", "tau")
    rows = [head]
    for r in reports:
        rows.append((r.target, r.rate, str(r.completed), str(r.failed), str(r.disconnected),
                     f"{r.requests_per_s:.2f}", f"{r.output_tokens_per_s:.1f}",
                     f"{r.ttft_ms_p50:.0f}", f"{r.ttft_ms_p99:.0f}", f"{r.itl_ms_p50:.1f}",
                     f"{r.itl_ms_p99:.1f}", f"{r.tpot_ms_p50:.1f}",
                     "-" if r.tau_mean is None else f"{r.tau_mean:.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines) + "\n(latencies in ms; ITL = gap between streamed chunks)"


async def main_async(args: argparse.Namespace) -> list[RunReport]:
    prompts = read_prompts(args.prompts)
    reports = []
    for spec in args.target:
        label, url = spec.split("=", 1) if "=" in spec else ("server", spec)
        url = url.rstrip("/")
        model = args.model or await served_model(url, args.api_key)
        for rate_s in args.rates.split(","):
            rate = math.inf if rate_s.strip() == "inf" else float(rate_s)
            report = await run_one(args, label, url, rate, prompts, model)
            reports.append(report)
            print(table([report]).splitlines()[2], flush=True)
    return reports


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", action="append", required=True, metavar="LABEL=URL",
                   help="server to load (repeatable: compare vanilla and speculative servers)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--model", default=None, help="served model name (default: ask /v1/models)")
    p.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="jsonl: {'turns': [...]}")
    p.add_argument("--num-requests", type=int, default=500)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--rates", default="2,8,32,inf", help="requests/s, comma-separated; inf = burst")
    p.add_argument("--min-tokens", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="generate exactly max_tokens (comparable runs)")
    p.add_argument("--greedy-fraction", type=float, default=0.5)
    p.add_argument("--disconnect-fraction", type=float, default=0.1)
    p.add_argument("--timeout", type=float, default=600.0, help="per request and per drain, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the reports as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reports = asyncio.run(main_async(args))
    print(table(reports))
    if args.out is not None:
        args.out.write_text(json.dumps([asdict(r) for r in reports], indent=2))
    return 1 if any(r.failed for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
