"""`argmax`: the greedy token of each row of logits, torch.argmax(x, -1) to the bit.

On CUDA the two-stage Triton kernel (layers/argmax_kernel.py) splits each row across many
programs instead of torch's one block per row (28 us of the 8B decode step over 128k logits),
and on Hopper both of its kernels are PDL-launched. The PDL launch is what makes it pay: plain,
the replay of the 8B decode graph got slower although the kernels took 2 us, because one more
plain kernel after the LM head - any kernel, torch's too - made every plain launch of the graph
start later (idle between kernels 40 against 11 us per replay; RESULTS "Session 13"). Elsewhere,
or with HOTSPEC_TRITON_ARGMAX=0 (an A/B switch), torch.argmax.
"""

from __future__ import annotations

import functools

import torch

from hotspec.layers import fused, pdl
from hotspec.layers.switches import on_off


@functools.cache
def _switch() -> bool:
    return on_off("HOTSPEC_TRITON_ARGMAX", True)


def argmax(x: torch.Tensor, also: torch.Tensor | None = None) -> torch.Tensor:
    """int64 x.shape[:-1]: the first index of the maximum along the last dim (NaN the largest).
    also: an int64 vector whose first x.shape[:-1].numel() elements get the same indices, row
    for row (the overlap schedule's carry): the Triton kernel writes them itself, so a decode
    graph has no copy kernel after its LM head (see above); torch's path copies."""
    if _switch() and fused.enabled(x) and x.dim() >= 1 and x.shape[-1] > 0 and x.stride(-1) == 1:
        from hotspec.layers.argmax_kernel import argmax_rows

        rows = x.reshape(-1, x.shape[-1])
        return argmax_rows(rows, use_pdl=pdl.enabled(x.device), out2=also).view(x.shape[:-1])
    out = x.argmax(-1)
    if also is not None:
        also[: out.numel()].copy_(out.reshape(-1))
    return out
