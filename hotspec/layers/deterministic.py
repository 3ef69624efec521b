"""The deterministic mode's switch for the layers (`--deterministic`, EngineConfig).

In this mode every kernel a token's row passes through computes that row the same way whatever
the other rows and however many there are, so a request's output does not depend on its batch,
and a verify row equals the decode row of the same token (speculative == vanilla, bit for bit):

  * every Linear is the tiled tl.dot GEMM (layers/rows_kernel.py) at all row counts, one tile
    config per weight shape: no GEMV at one row, no cuBLAS (whose kernel and split-K follow M);
  * attention runs one tile config for every phase without a KV split, and a verify row reads
    its tree node's keys as the sequence decode reads (attention/triton_backend.py);
  * norms, RoPE, SiLU * up and argmax are row-local kernels already.

The engine's graph runner sets the mode around every phase it runs or captures
(runtime/graph_runner.py), so two engines in one process keep their own modes. The mode needs
the Triton kernels: CUDA only (EngineConfig checks it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_ON: ContextVar[bool] = ContextVar("hotspec_deterministic", default=False)


def on() -> bool:
    """Whether the layers run batch-invariant (set by `mode`)."""
    return _ON.get()


@contextmanager
def mode(enabled: bool) -> Iterator[None]:
    """The deterministic mode on (or off) for the code inside."""
    token = _ON.set(enabled)
    try:
        yield
    finally:
        _ON.reset(token)
