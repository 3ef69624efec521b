"""`hotspec bench-serve`: the serving benchmark, vanilla against speculative `hotspec serve`.

It starts two servers side by side on free ports: the speculative one with the engine options
given (with the default model and no speculative option: its shipped EAGLE-3 head, as `hotspec
serve` runs it), the vanilla one with the same options less the speculative ones (and
--no-default-head). Then, against each in turn, a request-rate sweep of streamed chat requests
(Poisson arrivals, at most --concurrency in flight; `inf` sends every request at once) with a mix
of greedy and sampled requests and clients that hang up mid-stream; then the servers stop.
--pinned S/K/N adds a speculative server pinned to that shape (the default engine chooses its
shape adaptively: this sets it against a fixed one). --target runs the same load against servers
already running instead.

Reported per server and rate: completed / failed / hung-up requests, requests/s, output tokens/s,
TTFT and ITL (gap between streamed chunks) p50/p99, TPOT p50/p99, and tau of the speculative server.
Checks, PASS or FAIL (exit status 1 on a FAIL): no failed request and no failed engine step, the
server drained after each run (no request left, every KV block free), every hang-up aborted, and
(float32 or --deterministic servers, or --verify-greedy) each greedy request's output under load
equal to the same request sent alone. DIR/bench_serve.json holds every number, DIR/bench_serve.png
plots latency against throughput, DIR/serve_*.log the servers' logs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hotspec.errors import HotspecError


def add_parser(sub: argparse._SubParsersAction) -> None:
    from hotspec.benchmark.load_test import DEFAULT_PROMPTS
    from hotspec.cli.engine_args import RawDescriptionHelpFormatter, add_engine_args

    p = sub.add_parser("bench-serve", help="benchmark `hotspec serve`, vanilla against speculative, "
                       "over request rates", description=__doc__,
                       formatter_class=RawDescriptionHelpFormatter)
    add_engine_args(p)
    b = p.add_argument_group("load")
    b.add_argument("--rates", default="2,8,32,inf",
                   help="requests/s, comma-separated; inf sends them all at once (default: 2,8,32,inf)")
    b.add_argument("--num-requests", type=int, default=200, help="requests a rate (default: 200)")
    b.add_argument("--concurrency", type=int, default=64, help="requests in flight at most (default: 64)")
    b.add_argument("--max-arrival-s", type=float, default=20.0,
                   help="at a finite rate send only the first rate x this many requests (default: 20)")
    b.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS,
                   help="jsonl of {'turns': [...]} or {'prompt': ...}: the text prompts are cut from "
                   "(default: a small built-in set)")
    b.add_argument("--min-prompt-words", type=int, default=4, help="prompt words, at least (default: 4)")
    b.add_argument("--max-prompt-words", type=int, default=200,
                   help="prompt words, at most (default: 200)")
    b.add_argument("--min-tokens", type=int, default=16,
                   help="max_tokens of a request, at least (default: 16)")
    b.add_argument("--max-tokens", type=int, default=256,
                   help="max_tokens of a request, at most (default: 256)")
    b.add_argument("--ignore-eos-fraction", type=float, default=1.0,
                   help="requests that generate exactly their max_tokens (default: 1, comparable runs)")
    b.add_argument("--greedy-fraction", type=float, default=0.5,
                   help="greedy requests; the others sample with a temperature, top_p and top_k "
                   "(default: 0.5)")
    b.add_argument("--disconnect-fraction", type=float, default=0.1,
                   help="clients that hang up after a few chunks (default: 0.1)")
    b.add_argument("--verify-greedy", type=int, default=None,
                   help="distinct greedy requests re-sent alone and compared (-1: all, 0: none; "
                   "default: all for float32 or --deterministic servers, none otherwise: bf16 "
                   "outputs part at near-ties with the batch)")
    b.add_argument("--timeout", type=float, default=600.0, help="per request, between bytes (s)")
    b.add_argument("--drain-timeout", type=float, default=30.0,
                   help="after a run, seconds to wait for no request and no KV block in use")
    b.add_argument("--load-seed", type=int, default=0, help="seed of the workload (default: 0)")
    s = p.add_argument_group("servers")
    s.add_argument("--target", action="append", default=None, metavar="NAME=URL",
                   help="load this running server instead of starting two (repeatable)")
    s.add_argument("--reference", default=None, metavar="URL",
                   help="with --target: the server that runs the requests alone (default: each)")
    s.add_argument("--api-key", default=None, help="with --target: the servers' key")
    s.add_argument("--model-name", dest="served_model", default=None,
                   help="the model name requests send (default: ask /v1/models)")
    s.add_argument("--serve-args", default="", metavar="OPTIONS",
                   help="more `hotspec serve` options for both servers, one string (e.g. "
                   "'--max-num-seqs 128')")
    s.add_argument("--pinned", action="append", default=[], metavar="S/K/N",
                   help="also start a speculative server pinned to this shape (--speculative-num-"
                   "steps S --speculative-eagle-topk K --speculative-num-draft-tokens N), to set "
                   "the default (adaptive) engine against a fixed shape (repeatable)")
    s.add_argument("--start-timeout", type=float, default=600.0,
                   help="seconds for the servers to come up (default: 600)")
    s.add_argument("--out", type=Path, default=Path("bench_serve"), metavar="DIR",
                   help="where the report, plot and server logs go (default: ./bench_serve)")
    p.set_defaults(func=cmd_bench_serve)


def _server_options(args: argparse.Namespace) -> tuple[list[str], list[str], bool]:
    """(speculative, vanilla) `hotspec serve` options from the engine options, and whether the
    servers' greedy outputs are independent of the batch (float32, or --deterministic). A bad
    option fails here, before any server starts."""
    from dataclasses import fields

    from hotspec.benchmark.servers import SPECULATIVE, engine_cli_args
    from hotspec.cli.engine_args import engine_config
    from hotspec.config import EngineConfig

    cfg = engine_config(args, default_head=True)  # (validates; the servers apply the head)
    values = {f.name: getattr(args, f.name) for f in fields(EngineConfig)}
    spec = engine_cli_args(values)
    vanilla = engine_cli_args({k: v for k, v in values.items() if k not in SPECULATIVE})
    exact = cfg.deterministic or cfg.dtype == "float32" or (cfg.dtype == "auto" and cfg.device == "cpu")
    extra = shlex.split(args.serve_args)
    return [*spec, *extra], [*vanilla, "--no-default-head", *extra], exact


def _pinned(shapes: list[str]) -> list[Any]:
    """The --pinned shapes, checked before any server starts."""
    from hotspec.core.spec_shape import SpecShape

    out = []
    for text in shapes:
        try:
            shape = SpecShape.parse(text)
        except ValueError as e:
            raise HotspecError(f"--pinned: {e}") from None
        if shape.off:
            raise HotspecError("--pinned: 'off' is the vanilla server already; give a shape S/K/N")
        out.append(shape)
    return out


def cmd_bench_serve(args: argparse.Namespace) -> None:
    from hotspec.benchmark import servers as srv
    from hotspec.benchmark.load_report import checks, plot, table
    from hotspec.benchmark.load_test import run_load

    started: list[srv.Server] = []
    if args.target:
        targets = [tuple(t.split("=", 1)) if "=" in t else ("server", t) for t in args.target]
        exact = False
    else:
        spec_args, vanilla_args, exact = _server_options(args)
        pinned = _pinned(args.pinned)
        started = [srv.start("vanilla", vanilla_args, args.out),
                   srv.start("speculative", spec_args, args.out)]
        for shape in pinned:
            started.append(srv.start(f"pinned {shape.label}", [
                *spec_args, "--speculative-num-steps", str(shape.num_steps), "--speculative-eagle-topk",
                str(shape.topk), "--speculative-num-draft-tokens", str(shape.num_draft_tokens)],
                args.out))
        targets = [(s.name, s.url) for s in started]
    verify = args.verify_greedy if args.verify_greedy is not None else (-1 if exact else 0)
    load = argparse.Namespace(**(vars(args) | {"model": args.served_model, "seed": args.load_seed,
                                               "verify_greedy": verify}))
    try:
        if started:
            srv.wait_healthy(started, args.start_timeout)
            for s in started:
                print(f"bench-serve: {s.name} server on {s.url}: hotspec serve {' '.join(s.args)}",
                      flush=True)
            if srv.speculates(started[0].url):
                raise HotspecError("the vanilla server speculates (its /metrics has hot-set "
                                   "coverage): it is no baseline")
            for s in started[1:]:
                if not srv.speculates(s.url):
                    raise HotspecError(f"the {s.name} server does not speculate: with a model "
                                       "other than the default, give --speculative-algorithm and "
                                       "--speculative-draft-model-path")
        reports = asyncio.run(run_load(load, targets))  # type: ignore[arg-type]
    finally:
        srv.stop(started)
    print(table(reports))
    if verify == 0:
        print("greedy under load == alone: not checked (--verify-greedy -1 checks it; float32 and "
              "--deterministic servers give outputs independent of the batch)")
    results = checks(reports, verify != 0)
    for ok, line in results:
        print(("PASS " if ok else "FAIL ") + line)
    for r in reports:
        for e in r.errors:
            print(f"  {r.target} @ {r.rate}: {e}")
    passed = all(ok for ok, _ in results)
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "command": sys.argv, "date_utc": datetime.now(timezone.utc).isoformat(), "passed": passed,
        "servers": {s.name: s.args for s in started},
        "checks": [{"ok": ok, "check": line} for ok, line in results],
        "reports": [asdict(r) for r in reports]}
    (args.out / "bench_serve.json").write_text(json.dumps(report, indent=2))
    png = plot(reports, args.out / "bench_serve.png")
    print(f"bench-serve: {'PASS' if passed else 'FAIL'}; wrote {args.out / 'bench_serve.json'} "
          f"and {png}", flush=True)
    if not passed:
        raise SystemExit(1)
