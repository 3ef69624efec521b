"""`hotspec` command line: generate, serve, bench, bench-serve, distill, train-draft, token-map,
prune-draft. Engine options come from EngineConfig's fields (hotspec/cli/engine_args.py)."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import fields

from hotspec.cli.engine_args import (
    HelpFormatter,
    add_default_head_arg,
    add_engine_args,
    engine_config,
)
from hotspec.config import EngineConfig
from hotspec.errors import HotspecError
from hotspec.logs import setup_logging

GENERATE_MAX_TOKENS = 256  # room for a complete short answer from a chat model


def cmd_generate(args: argparse.Namespace) -> None:
    from hotspec.entrypoints.llm import LLM
    from hotspec.sampling_params import SamplingParams

    cfg = engine_config(args, args.default_head)
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
    first: float | None = None  # after the prefill step: the rate below is decoding's alone
    for outs in llm.stream_steps():
        first = first or time.perf_counter()
        for o in outs:
            sys.stdout.write(o.text_delta)
            sys.stdout.flush()
    sys.stdout.write("\n")
    s = req.stats
    decoded = s.generated_tokens - 1  # the first token comes from the prefill
    rate = f", {decoded / (time.perf_counter() - first):.1f} tokens/s" if first and decoded else ""
    spec = f", tau {s.tau:.2f}" if s.spec_steps else ""
    print(f"[{s.generated_tokens} tokens, finish: {req.finish_reason}{spec}{rate}]", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    from hotspec.cli import bench, bench_serve, distill, model, prune, serve, token_map, train
    p = argparse.ArgumentParser(prog="hotspec", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                   help="hotspec's log messages on stderr, e.g. the CUDA-graph table at start-up "
                   "(default: info)")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text for one prompt, streamed to the terminal",
                       formatter_class=HelpFormatter,
                       description="Continue PROMPT (or answer it, with --chat) and stream the text "
                       "to stdout; the token count, finish reason and speed go to stderr.")
    add_engine_args(g)
    o = g.add_argument_group("generation")
    o.add_argument("prompt", help="the prompt text")
    o.add_argument("--chat", action="store_true",
                   help="send the prompt as one user turn through the model's chat template")
    o.add_argument("--max-tokens", type=int, default=GENERATE_MAX_TOKENS,
                   help=f"new tokens at most (default: {GENERATE_MAX_TOKENS})")
    o.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature; 0 is greedy (default: 0)")
    o.add_argument("--top-p", type=float, default=1.0,
                   help="nucleus sampling: keep the smallest set of tokens with this probability "
                   "mass; 1 is off (default: 1)")
    o.add_argument("--top-k", type=int, default=-1,
                   help="keep the k most likely tokens; -1 or 0 is off (default: -1)")
    o.add_argument("--sampling-seed", type=int, default=None,
                   help="seed of this request's sampling; unset: drawn from the engine's --seed")
    add_default_head_arg(o)
    g.set_defaults(func=cmd_generate)
    token_map.add_parser(sub)
    train.add_parser(sub)
    distill.add_parser(sub)
    prune.add_parser(sub)
    serve.add_parser(sub)
    bench.add_parser(sub)
    bench_serve.add_parser(sub)
    model.add_parser(sub)
    return p


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
