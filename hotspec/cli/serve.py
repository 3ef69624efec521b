"""`hotspec serve`: the OpenAI-compatible HTTP server (see hotspec/entrypoints/server.py)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    from hotspec.cli.engine_args import HelpFormatter, add_default_head_arg, add_engine_args

    p = sub.add_parser(
        "serve", help="serve the model over an OpenAI-compatible HTTP API", formatter_class=HelpFormatter,
        description="Serve /v1/completions, /v1/chat/completions (streaming and not), /v1/models, "
        "/health and /metrics (Prometheus). Engine and speculative options as for `generate`.")
    add_engine_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    g.add_argument("--port", type=_port, default=30000, help="port (default: 30000)")
    g.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: no key)")
    g.add_argument("--served-model-name", default=None,
                   help="the model name clients send (default: the model folder or file name)")
    g.add_argument("--max-body-bytes", type=_positive_int, default=4 * 2**20,
                   help="largest request body accepted; larger ones get 413 (default: 4 MiB)")
    add_default_head_arg(g)
    p.set_defaults(func=cmd_serve)


def served_model_name(args: argparse.Namespace) -> str:
    if args.served_model_name:
        return args.served_model_name
    from hotspec.models.default_model import DEFAULT_MODEL_NAME, is_default_model

    if is_default_model(args.model):
        return DEFAULT_MODEL_NAME
    path = Path(args.model)
    return path.stem if path.suffix == ".gguf" else path.name


def cmd_serve(args: argparse.Namespace) -> None:
    from hotspec.cli.engine_args import engine_config
    from hotspec.entrypoints.server import ProcessEngine, ServerSettings, create_process_app, run

    # a bad option fails here, before any weight is read
    cfg = engine_config(args, args.default_head)
    settings = ServerSettings(served_model_name(args), args.api_key, args.max_body_bytes)
    # The engine runs in a process of its own: HTTP, JSON, SSE and tokenization never hold its
    # interpreter lock (on the H200, rate inf: 1.87x the tok/s of the engine on a server thread).
    client = ProcessEngine(cfg, args.log_level)
    client.start()  # (a model that fails to load fails here, before the server listens)
    try:
        app = create_process_app(client, settings)
    except BaseException:
        client.shutdown()
        raise
    run(app, args.host, args.port)


def _port(s: str) -> int:
    n = int(s)
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number in [0, 65535], got {n}")
    return n


def _positive_int(s: str) -> int:
    n = int(s)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {n}")
    return n
