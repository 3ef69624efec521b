"""Triton kernels compiled after start-up.

With CUDA graphs the engine compiles every kernel its graphs replay at capture, and warms the
eager passes it runs; a kernel that still compiles later (an argument class or block shape no
warm-up covered: Triton specialises integer arguments on 1 and on multiples of 16) holds every
running request for the compile, 0.1-1 s, which no latency percentile explains. Once armed, each
such compile in this process is counted (`compiles()`: the metric
hotspec_kernel_compiles_after_start_total, the benchmarks' tables) and the first few are logged
as warnings naming the kernel and its specialisation: nothing stalls silently.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("hotspec.kernels")
LOGGED = 20  # compiles logged one by one; the count goes on

_state = {"count": 0, "armed": False, "installed": False}


def arm() -> bool:
    """Count every Triton compile from now on (the engine arms it once its graphs are captured
    and warmed). False where this Triton has no compile hook (the count then stays 0)."""
    if not _state["installed"]:
        _state["installed"] = _install()
    _state["armed"] = bool(_state["installed"])
    return bool(_state["armed"])


def compiles() -> int:
    """Triton compiles in this process since the first `arm()`."""
    return int(_state["count"])


def _install() -> bool:
    try:
        from triton import knobs
    except ImportError:
        return False
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_cache_hook"):
        return False
    previous = runtime.jit_cache_hook

    def hook(**kw: Any) -> bool:
        if _state["armed"] and not kw.get("is_manual_warmup"):
            _state["count"] += 1
            if _state["count"] <= LOGGED:
                log.warning("a Triton kernel compiled after start-up (it stalls every running "
                            "request; a warm-up missed this specialisation): %s", kw.get("repr"))
        # (a hook that returns True skips the compile: only the previous hook may decide that)
        return bool(previous(**kw)) if previous is not None else False

    runtime.jit_cache_hook = hook
    return True
