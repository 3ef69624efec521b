"""Engine options on the command line, generated from EngineConfig's fields and their help text, so
the CLI and the Python API cannot drift apart (`speculative_num_steps` <-> `--speculative-num-steps`);
and the default model's shipped draft head, which `generate` and `serve` use unless told not to."""

from __future__ import annotations

import argparse
import logging
import textwrap
import types
import typing
from dataclasses import MISSING, fields
from typing import Any

from hotspec.config import EngineConfig
from hotspec.errors import HotspecError

log = logging.getLogger("hotspec")


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help layout, never breaking a line inside a hyphenated word (--num-kv-blocks)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class RawDescriptionHelpFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """HelpFormatter that keeps the description's own lines (a module docstring)."""


def _base_type(tp: Any) -> type:
    if isinstance(tp, str):
        tp = eval(tp, {"int": int, "float": float, "str": str, "bool": bool, "tuple": tuple,
                       "None": None})
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def _help(text: str, default: Any) -> str:
    text = text.replace("%", "%%")  # argparse formats help with %
    if default is None:  # the help says what unset means
        return text
    shown = ("on" if default else "off") if isinstance(default, bool) else default
    return f"{text} (default: {shown})"


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    for f in fields(EngineConfig):
        default = f.default if f.default is not MISSING else None
        flag = "--" + f.name.replace("_", "-")
        tp = _base_type(f.type)
        help_text = _help(f.metadata["help"], default)
        if tp is bool:  # --allow-eager-fallback / --no-allow-eager-fallback
            g.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                           help=help_text)
        elif typing.get_origin(tp) is tuple:  # --cuda-graph-bs 1 8 32
            g.add_argument(flag, dest=f.name, type=typing.get_args(tp)[0], nargs="+", default=default,
                           help=help_text)
        else:
            g.add_argument(flag, dest=f.name, type=tp, default=default, help=help_text)


def engine_config(args: argparse.Namespace, default_head: bool = False) -> EngineConfig:
    """The EngineConfig of parsed engine options; `default_head`: with the default model's
    shipped head where it applies (`with_default_head`)."""
    values: dict[str, Any] = {}
    for f in fields(EngineConfig):
        v = getattr(args, f.name)
        values[f.name] = tuple(v) if isinstance(v, list) else v  # nargs="+" gives a list
    return EngineConfig(**(with_default_head(values) if default_head else values))


def add_default_head_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--default-head", action=argparse.BooleanOptionalAction, default=True,
                   help="with the default model and no --speculative-algorithm, speculate with its "
                   "shipped EAGLE-3 head (default: on)")


def with_default_head(values: dict[str, Any]) -> dict[str, Any]:
    """EngineConfig options with the default model's shipped head when they run the default
    model (no --model, or the default GGUF's path) and name no speculative algorithm: with no
    speculative option, or with shape or token-map options alone, which then shape that head's
    speculation. If the head is not installed, a warning says so and `values` run without
    speculation (a speculative option given alone then fails as it would without the head)."""
    from hotspec.models import default_model

    if values.get("speculative_algorithm") is not None or values.get(
            "speculative_draft_model_path") is not None or not default_model.is_default_model(
            values.get("model")):
        return values
    try:
        head = default_model.default_draft_head()
    except HotspecError as e:
        log.warning("running WITHOUT speculative decoding: %s", e)
        return values
    return values | {"speculative_algorithm": default_model.DEFAULT_DRAFT_ALGORITHM,
                     "speculative_draft_model_path": str(head)}
