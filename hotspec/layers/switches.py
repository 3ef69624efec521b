"""The kernel-level A/B switches' one parser: an environment variable that is 0 or 1."""

from __future__ import annotations

import os


def on_off(name: str, default: bool) -> bool:
    """Environment variable `name` as a 0/1 switch (unset: `default`); any other value is an
    error that names the variable and both choices."""
    d, other = ("1", "0") if default else ("0", "1")
    v = os.environ.get(name, d)
    if v not in ("0", "1"):
        raise ValueError(f"{name}={v!r}: use {d} (the default) or {other}")
    return v == "1"
