"""Load test for a running `hotspec serve`: streaming chat clients, a request-rate sweep, clients
that hang up mid-stream, and greedy outputs checked against the same requests run alone.

    hotspec serve --port 30000 &                                             # vanilla
    hotspec serve --port 30001 --speculative-algorithm EAGLE3 ... &          # speculative
    python benchmarks/load_test.py --target vanilla=http://127.0.0.1:30000 \
        --target eagle3=http://127.0.0.1:30001 --num-requests 500 --concurrency 64 \
        --rates 2,8,32,inf --out load.json

Workload (the same for every target and rate; `--seed`): prompts of random length cut from the
`--prompts` text, random max_tokens, a mix of greedy and sampled requests (temperature, top_p,
top_k, some seeded), and exactly `--disconnect-fraction` of the clients hanging up after a few
chunks. Per rate (Poisson arrivals; `inf` sends everything at once) at most `--concurrency`
requests are in flight. Reported: completed / failed / hung-up requests, output tokens/s, TTFT and
inter-token latency (ITL: gap between streamed chunks) p50/p99, TPOT p50, tau of speculative
requests (from /metrics).

Checks, printed as PASS/FAIL (exit status 1 on any FAIL): no 5xx or other failed request and no
failed engine step; after each run /metrics shows no running or waiting request and no KV block in
use (nothing stuck or leaked); the server aborted every request whose client hung up; each greedy
request that completed gives exactly the text and token count it gives when sent alone
(concurrency 1, after the sweep; `--reference` sends those to another server, e.g. a vanilla
one for a speculative target).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import random
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
from load_client import Job, Result, one_request, percentile, wait_drained
from load_report import RunReport, checks, table

DEFAULT_PROMPTS = Path(__file__).with_name("prompts_small.jsonl")


def read_words(path: Path) -> list[str]:
    words = []
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            words += " ".join(row["turns"] if "turns" in row else [row["prompt"]]).split()
    if not words:
        raise SystemExit(f"no prompts in {path}")
    return words


def make_workload(args: argparse.Namespace, words: list[str], model: str) -> list[Job]:
    rng = random.Random(args.seed)
    n = args.num_requests
    hang_ups = set(rng.sample(range(n), round(n * args.disconnect_fraction)))
    jobs = []
    for i in range(n):
        start, length = rng.randrange(len(words)), rng.randint(args.min_prompt_words, args.max_prompt_words)
        prompt = " ".join(words[(start + k) % len(words)] for k in range(length))
        body: dict[str, Any] = {
            "model": model, "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": rng.randint(args.min_tokens, args.max_tokens),
            "ignore_eos": rng.random() < args.ignore_eos_fraction}
        if rng.random() < args.greedy_fraction:
            body["temperature"] = 0.0
        else:
            body.update(temperature=rng.choice([0.6, 0.8, 1.0]), top_p=rng.choice([1.0, 0.95, 0.8]),
                        top_k=rng.choice([-1, 20, 50]))
            if rng.random() < 0.5:
                body["seed"] = i
        job = Job(body)
        if i in hang_ups:  # still generating when the client goes: it must be aborted
            body.update(max_tokens=args.max_tokens, ignore_eos=True)
            job.hang_up_after = rng.randint(1, 4)
        jobs.append(job)
    return jobs


def client(args: argparse.Namespace, concurrency: int) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency)
    return httpx.AsyncClient(timeout=httpx.Timeout(args.timeout), limits=limits, headers=headers)


async def run_one(args: argparse.Namespace, label: str, url: str, rate: float,
                  jobs: list[Job]) -> tuple[RunReport, list[Result]]:
    rng = random.Random(args.seed + 1)
    if math.isfinite(rate) and args.max_arrival_s is not None:
        jobs = jobs[:max(1, min(len(jobs), math.ceil(rate * args.max_arrival_s)))]
    async with client(args, args.concurrency) as c:
        before, _ = await wait_drained(c, url, args.timeout)
        gate = asyncio.Semaphore(args.concurrency)

        async def gated(job: Job) -> Result:
            async with gate:
                return await one_request(c, url, job)

        tasks = []
        t0 = time.perf_counter()
        for job in jobs:
            tasks.append(asyncio.create_task(gated(job)))
            if math.isfinite(rate):
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
        after, drained = await wait_drained(c, url, args.drain_timeout)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    done = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok and not r.disconnected]
    ttft = [(r.first - r.start) * 1e3 for r in done if r.first is not None]
    itl = [(b - a) * 1e3 for r in done for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    tpot = [(r.end - r.first) * 1e3 / (r.completion_tokens - 1) for r in done
            if r.first is not None and r.completion_tokens > 1]
    taus = delta("hotspec_request_tau_count")
    errors = sorted({r.error for r in failed})[:5]
    if not drained:
        errors.append(f"not drained {args.drain_timeout:g}s after the run: {after}")
    report = RunReport(
        label, "inf" if math.isinf(rate) else f"{rate:g}", len(results), len(done), len(failed),
        sum(r.status >= 500 for r in results), sum(r.disconnected for r in results),
        int(delta("finished_abort")), int(delta("hotspec_engine_step_errors_total")), drained, duration,
        len(done) / duration, sum(r.completion_tokens for r in done) / duration,
        delta("hotspec_generated_tokens_total") / duration,
        percentile(ttft, 50), percentile(ttft, 99), percentile(itl, 50), percentile(itl, 99),
        statistics.median(tpot) if tpot else float("nan"),
        delta("hotspec_request_tau_sum") / taus if taus else None, errors=errors)
    return report, results


async def check_greedy(args: argparse.Namespace, url: str, runs: list[tuple[RunReport, list[Job],
                                                                                   list[Result]]]) -> None:
    """Send each distinct greedy request that completed under load once more, alone, and compare."""
    todo: dict[str, Job] = {}
    for _, jobs, results in runs:
        for job, res in zip(jobs, results):
            if job.greedy and res.ok and (args.verify_greedy < 0 or len(todo) < args.verify_greedy):
                todo.setdefault(job.key(), job)
    alone: dict[str, Result] = {}
    async with client(args, 1) as c:
        for key, job in todo.items():
            alone[key] = await one_request(c, url, Job(job.body))
    for report, jobs, results in runs:
        for job, res in zip(jobs, results):
            ref = alone.get(job.key())
            if ref is None or not res.ok:
                continue
            report.greedy_checked += 1
            got = (res.text, res.completion_tokens, res.finish_reason)
            want = (ref.text, ref.completion_tokens, ref.finish_reason)
            if not ref.ok or got != want:
                report.greedy_mismatched += 1
                if len(report.errors) < 8:
                    report.errors.append(f"greedy mismatch: under load {got!r}, alone {want!r} "
                                         f"{ref.error}".strip())


async def served_model(args: argparse.Namespace, url: str) -> str:
    async with client(args, 1) as c:
        r = await c.get(url + "/v1/models")
        r.raise_for_status()
        return r.json()["data"][0]["id"]


async def main_async(args: argparse.Namespace) -> list[RunReport]:
    words = read_words(args.prompts)
    reports = []
    for spec in args.target:
        label, url = spec.split("=", 1) if "=" in spec else ("server", spec)
        url = url.rstrip("/")
        jobs = make_workload(args, words, args.model or await served_model(args, url))
        runs = []
        for rate_s in args.rates.split(","):
            rate = math.inf if rate_s.strip() == "inf" else float(rate_s)
            report, results = await run_one(args, label, url, rate, jobs)
            runs.append((report, jobs, results))
            print(table([report]).splitlines()[2], flush=True)
        if args.verify_greedy != 0:
            await check_greedy(args, (args.reference or url).rstrip("/"), runs)
        reports += [r for r, _, _ in runs]
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
    p.add_argument("--max-arrival-s", type=float, default=None,
                   help="at a finite rate send only the first rate x this many requests")
    p.add_argument("--min-prompt-words", type=int, default=4)
    p.add_argument("--max-prompt-words", type=int, default=200)
    p.add_argument("--min-tokens", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--ignore-eos-fraction", type=float, default=1.0,
                   help="requests that generate exactly max_tokens (1.0: comparable runs)")
    p.add_argument("--greedy-fraction", type=float, default=0.5)
    p.add_argument("--disconnect-fraction", type=float, default=0.1)
    p.add_argument("--verify-greedy", type=int, default=-1,
                   help="distinct greedy requests to re-send alone and compare (-1: all, 0: none)")
    p.add_argument("--reference", default=None, metavar="URL",
                   help="server that runs the requests alone (default: the target itself)")
    p.add_argument("--timeout", type=float, default=600.0, help="per request (between bytes), seconds")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="after a run, seconds to wait for no request and no KV block in use")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the reports and checks as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reports = asyncio.run(main_async(args))
    print(table(reports))
    results = checks(reports, args.verify_greedy != 0)
    for ok, line in results:
        print(("PASS " if ok else "FAIL ") + line)
    for r in reports:
        for e in r.errors:
            print(f"  {r.target} @ {r.rate}: {e}")
    passed = all(ok for ok, _ in results)
    print("load test:", "PASS" if passed else "FAIL", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({
            "command": sys.argv, "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "passed": passed, "checks": [{"ok": ok, "check": line} for ok, line in results],
            "reports": [asdict(r) for r in reports]}, indent=2))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
