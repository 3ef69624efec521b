"""`argmax`: the greedy token of each row of logits, torch.argmax(x, -1) to the bit.

On CUDA the two-stage Triton kernel (layers/argmax_kernel.py) splits each row across many
programs instead of torch's one block per row; elsewhere, or with HOTSPEC_TRITON_ARGMAX=0 (an
A/B switch), torch.argmax.
"""

from __future__ import annotations

import functools
import os

import torch

from hotspec.layers import fused


@functools.cache
def _switch() -> bool:
    v = os.environ.get("HOTSPEC_TRITON_ARGMAX", "1")
    if v not in ("0", "1"):
        raise ValueError(f"HOTSPEC_TRITON_ARGMAX={v!r}: use 1 (the default) or 0")
    return v == "1"


def argmax(x: torch.Tensor) -> torch.Tensor:
    """int64 x.shape[:-1]: the first index of the maximum along the last dim (NaN the largest)."""
    if _switch() and fused.enabled(x) and x.dim() >= 1 and x.shape[-1] > 0 and x.stride(-1) == 1:
        from hotspec.layers.argmax_kernel import argmax_rows

        rows = x.reshape(-1, x.shape[-1])
        return argmax_rows(rows).view(x.shape[:-1])
    return x.argmax(-1)
