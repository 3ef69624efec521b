"""`hotspec token-map`: build an FR-Spec token map (hot vocabulary) from a corpus."""

from __future__ import annotations

import argparse
from pathlib import Path

from hotspec.errors import HotspecError


def add_parser(sub: argparse._SubParsersAction) -> None:
    from hotspec.cli.engine_args import HelpFormatter

    p = sub.add_parser(
        "token-map", help="count a corpus's token frequencies and write an FR-Spec token map",
        formatter_class=HelpFormatter,
        description="Count the model tokenizer's token frequencies over a corpus (.txt, .jsonl, or "
        "ShareGPT .json), or the target's own response tokens in `hotspec distill` shards, and "
        "write the SIZE most frequent ids as torch.save(list of int), plus a JSON sidecar "
        "<OUT>.json. EOS and the chat template's end-of-turn tokens are always kept. Several "
        "sizes count the corpus once and write OUT_DIR/freq_<SIZE>.pt each.")
    p.add_argument("--model", default=None,
                   help="model folder or .gguf whose tokenizer to use (default: the built-in model)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--corpus", nargs="+", type=Path, metavar="FILE",
                     help=".txt (or any plain text), .jsonl, or ShareGPT .json files")
    src.add_argument("--data", type=Path, metavar="DIR",
                     help="token shards of `hotspec distill --out DIR` (their response tokens)")
    p.add_argument("--size", type=_positive_int, nargs="+", default=[32768],
                   help="ids to keep (default: 32768); several sizes write one map each")
    p.add_argument("--out", type=Path, default=None,
                   help="output .pt of a single size (default: OUT_DIR/freq_<SIZE>.pt)")
    p.add_argument("--out-dir", type=Path, default=Path("."),
                   help="folder of the freq_<SIZE>.pt maps (default: the current folder)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_token_map)


def cmd_token_map(args: argparse.Namespace) -> None:
    from hotspec.models.loader import load_tokenizer, resolve_model_path
    from hotspec.speculative.token_map_builder import build_token_maps, save_token_map
    from hotspec.training.token_maps import build_token_maps_from_shards

    sizes = list(dict.fromkeys(args.size))
    if args.out is not None and len(sizes) > 1:
        raise HotspecError(f"--out names one map, but {len(sizes)} sizes were given: use --out-dir "
                           "(each map is written as OUT_DIR/freq_<SIZE>.pt)")
    model_path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(model_path)
    try:
        if args.data is not None:
            results = build_token_maps_from_shards(tokenizer, args.data, sizes)
        else:
            results = build_token_maps(tokenizer, args.corpus, sizes, progress=not args.no_progress)
        kind = "response" if args.data is not None else "corpus"
        for size, result in zip(sizes, results):
            out = args.out if args.out is not None else args.out_dir / f"freq_{size}.pt"
            save_token_map(result, out, str(model_path), [args.data] if args.data else args.corpus)
            print(f"token map: {len(result.ids)} ids from {result.tokens_counted:,} {kind} tokens, "
                  f"coverage {result.coverage:.2%} -> {out}")
    except HotspecError:
        raise
    except (OSError, ValueError) as e:  # missing or unreadable corpus, empty corpus, size too small
        raise HotspecError(str(e)) from e


def _positive_int(s: str) -> int:
    n = int(s)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {n}")
    return n
