"""The load `hotspec bench-serve` sends to running servers: streaming chat clients, a request-rate
sweep, clients that hang up mid-stream, and greedy outputs checked against the same requests run
alone (`run_load`; the options are hotspec/cli/bench_serve.py's).

Workload (the same for every target and rate; `--seed`): prompts of random length cut from the
`--prompts` text, random max_tokens, a mix of greedy and sampled requests (temperature, top_p,
top_k, some seeded), and exactly `--disconnect-fraction` of the clients hanging up after a few
chunks. Per rate (Poisson arrivals; `inf` sends everything at once) at most `--concurrency`
requests are in flight. Reported: completed / failed / hung-up requests, output tokens/s, TTFT and
inter-token latency (ITL: gap between streamed chunks) p50/p99, TPOT p50/p99, tau of speculative
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
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import aiohttp

from hotspec.benchmark.load_client import Job, Result, one_request, percentile, session, wait_drained
from hotspec.benchmark.load_report import RunReport, table
from hotspec.errors import HotspecError

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts_small.jsonl"


def read_words(path: Path) -> list[str]:
    words = []
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            words += " ".join(row["turns"] if "turns" in row else [row["prompt"]]).split()
    if not words:
        raise HotspecError(f"no prompts in {path}: give a jsonl of {{'turns': [...]}} or "
                           "{'prompt': ...} rows")
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


def client(args: argparse.Namespace, concurrency: int) -> aiohttp.ClientSession:
    return session(concurrency, args.timeout, args.api_key)


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
    firsts = delta("hotspec_time_to_first_token_seconds_count")
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
        percentile(tpot, 50), percentile(tpot, 99),
        delta("hotspec_request_tau_sum") / taus if taus else None,
        delta("hotspec_time_to_first_token_seconds_sum") * 1e3 / firsts if firsts else None,
        shape_steps={k[6:]: int(delta(k)) for k in after if k.startswith("steps_") and delta(k) > 0},
        kernel_compiles=int(delta("hotspec_kernel_compiles_after_start")), errors=errors)
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
    async with client(args, 1) as c, c.get(url + "/v1/models") as r:
        r.raise_for_status()
        return str((await r.json())["data"][0]["id"])


async def run_load(args: argparse.Namespace, targets: list[tuple[str, str]]) -> list[RunReport]:
    """Every rate of `args.rates` against each (label, url) of `targets`, one after the other."""
    words = read_words(args.prompts)
    reports = []
    for label, url in targets:
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
