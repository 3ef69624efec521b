"""`hotspec` command line. Engine options are generated from EngineConfig's fields, so the CLI and
the Python API cannot drift apart (`speculative_num_steps` <-> `--speculative-num-steps`)."""

from __future__ import annotations

import argparse
import logging
import sys
import types
import typing
from dataclasses import MISSING, fields
from typing import Any

from hotspec.config import EngineConfig
from hotspec.errors import HotspecError


def _base_type(tp: Any) -> type:
    if isinstance(tp, str):
        tp = eval(tp, {"int": int, "float": float, "str": str, "bool": bool, "None": None})
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    for f in fields(EngineConfig):
        default = f.default if f.default is not MISSING else None
        flag = "--" + f.name.replace("_", "-")
        tp = _base_type(f.type)
        if tp is bool:  # --allow-eager-fallback / --no-allow-eager-fallback
            g.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default)
        else:
            g.add_argument(flag, dest=f.name, type=tp, default=default, help=f"(default: {default})")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(**{f.name: getattr(args, f.name) for f in fields(EngineConfig)})


def cmd_generate(args: argparse.Namespace) -> None:
    from hotspec.entrypoints.llm import LLM
    from hotspec.sampling_params import SamplingParams

    cfg = engine_config(args)
    llm = LLM(**{f.name: getattr(cfg, f.name) for f in fields(EngineConfig)})
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.sampling_seed)
    tok = llm.tokenizer
    if tok is None:
        raise HotspecError("generate needs a tokenizer; drop --skip-tokenizer-init")
    if args.chat:
        text = tok.apply_chat_template([{"role": "user", "content": args.prompt}], tokenize=False,
                                       add_generation_prompt=True)
        ids = tok.encode(text, add_special_tokens=False)
    else:
        ids = tok.encode(args.prompt)
    req = llm.engine.add_request(ids, params)
    for outs in llm.stream_steps():
        for o in outs:
            sys.stdout.write(o.text_delta)
            sys.stdout.flush()
    sys.stdout.write("\n")
    s = req.stats
    extra = f", tau {s.tau:.2f}" if s.spec_steps else ""
    print(f"[{s.generated_tokens} tokens, finish: {req.finish_reason}{extra}]", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    from hotspec.entrypoints import bench_cli, prune_cli, serve_cli, token_map_cli, train_cli
    p = argparse.ArgumentParser(prog="hotspec", description=__doc__)
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                   help="hotspec's log messages on stderr, e.g. the CUDA-graph table at start-up "
                   "(default: info)")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text for one prompt, streamed to the terminal")
    add_engine_args(g)
    g.add_argument("prompt")
    g.add_argument("--chat", action="store_true", help="apply the model's chat template")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=-1)
    g.add_argument("--sampling-seed", type=int, default=None)
    g.set_defaults(func=cmd_generate)
    token_map_cli.add_parser(sub)
    train_cli.add_parser(sub)
    prune_cli.add_parser(sub)
    serve_cli.add_parser(sub)
    bench_cli.add_parser(sub)
    return p


def setup_logging(level: str) -> None:
    """hotspec's loggers ("hotspec", "hotspec.server", ...) to stderr at `level`; other libraries'
    loggers keep Python's default (warnings and errors only)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                           datefmt="%H:%M:%S"))
    root = logging.getLogger("hotspec")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    try:
        args.func(args)
    except HotspecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
