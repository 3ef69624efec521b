"""`hotspec prune-draft`: restrict an EAGLE-3 head's draft vocabulary to an FR-Spec token map."""

from __future__ import annotations

import argparse
from pathlib import Path

from hotspec.errors import HotspecError


def add_parser(sub: argparse._SubParsersAction) -> None:
    from hotspec.cli.engine_args import HelpFormatter

    p = sub.add_parser(
        "prune-draft", help="prune an EAGLE-3 head's draft vocabulary to an FR-Spec token map",
        formatter_class=HelpFormatter,
        description="Write to DIR an EAGLE-3 head whose draft vocabulary is SRC's intersected with "
        "the map's ids (lm_head.weight rows, d2t, t2d and draft_vocab_size rewritten). Running it "
        "is exactly running SRC with --speculative-token-map FILE: same proposals, same outputs, "
        "with a smaller LM head.")
    p.add_argument("src", type=Path, metavar="SRC", help="EAGLE-3 head folder (config.json + weights)")
    p.add_argument("--token-map", required=True, type=Path, metavar="FILE",
                   help="FR-Spec map: torch.save(list of int), e.g. freq_8192.pt from train-draft")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="output folder")
    p.set_defaults(func=cmd_prune_draft)


def cmd_prune_draft(args: argparse.Namespace) -> None:
    from hotspec.training.prune import prune_eagle3_head

    try:
        r = prune_eagle3_head(args.src, args.token_map, args.out)
    except HotspecError:
        raise
    except OSError as e:  # unwritable output folder, ...
        raise HotspecError(str(e)) from e
    print(f"pruned draft head: {r.source_vocab} -> {r.draft_vocab} draft tokens (map of "
          f"{r.map_size}) -> {r.out_dir}")
