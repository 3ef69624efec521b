"""The engine's environment switches, all of them: each a 0/1 variable, read once.

A switch exists for a user or a debugger: it turns one GPU fast path off, to compare it with the
path the CPU and every other shape take. Each is 1 (the default) or 0; anything else is an error
that names the variable. `switches()` parses the environment on its first call (the engine reads
it while it builds its layers), so a switch changed later has no effect in that process.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, fields


def _switch(env: str, doc: str) -> bool:
    return field(default=True, metadata={"env": env, "doc": doc})


@dataclass(frozen=True)
class Switches:
    fused_kernels: bool = _switch(
        "HOTSPEC_FUSED_KERNELS",
        "0: no fused Triton kernel on CUDA (norms, RoPE, GEMVs, argmax, the draft tree's and the "
        "step's small kernels): the torch code the CPU runs, to tell a kernel's bug from the "
        "model's (attention keeps its backend: `--attention-backend torch` for the reference)")
    pdl: bool = _switch(
        "HOTSPEC_PDL",
        "0: no Programmatic Dependent Launch on Hopper: each kernel starts after the one before "
        "it ends")
    gemv: bool = _switch(
        "HOTSPEC_GEMV",
        "0: every Linear on cuBLAS, none on the Triton GEMV or few-row GEMM (their tuned shapes "
        "included)")


def _parse(env: str, default: bool) -> bool:
    v = os.environ.get(env, "")
    if v == "":
        return default
    if v not in ("0", "1"):
        raise ValueError(f"{env}={v!r}: use 1 or 0 (unset: {int(default)})")
    return v == "1"


@functools.cache
def switches() -> Switches:
    """The switches as the environment sets them (parsed once per process)."""
    return Switches(**{f.name: _parse(f.metadata["env"], f.default is True)
                       for f in fields(Switches)})


def table() -> str:
    """The switches as a markdown table (variable, default, what 0 does), for the README."""
    rows = ["| Variable | Default | Effect |", "| --- | --- | --- |"]
    rows += [f"| `{f.metadata['env']}` | {int(f.default is True)} | {f.metadata['doc']} |"
             for f in fields(Switches)]
    return "\n".join(rows)
