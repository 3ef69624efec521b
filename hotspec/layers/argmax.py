"""`argmax`: the greedy token of each row of logits, torch.argmax(x, -1) to the bit.

On CUDA the two-stage Triton kernel (layers/argmax_kernel.py) splits each row across many
programs instead of torch's one block per row, and on Hopper both of its kernels are
PDL-launched. The PDL launch is what makes it pay: one more plain kernel after the LM head (any
kernel, torch's too) makes every plain launch of a decode graph start later. Elsewhere,
torch.argmax.
"""

from __future__ import annotations

import torch

from hotspec.layers import fused


def argmax(x: torch.Tensor, also: torch.Tensor | None = None) -> torch.Tensor:
    """int64 x.shape[:-1]: the first index of the maximum along the last dim (NaN the largest).
    also: an int64 vector whose first x.shape[:-1].numel() elements get the same indices, row
    for row (the overlap schedule's carry): the Triton kernel writes them itself, so a decode
    graph has no copy kernel after its LM head (see above); torch's path copies."""
    if fused.enabled(x) and x.dim() >= 1 and x.shape[-1] > 0 and x.stride(-1) == 1:
        from hotspec.layers import pdl
        from hotspec.layers.argmax_kernel import argmax_rows

        rows = x.reshape(-1, x.shape[-1])
        return argmax_rows(rows, use_pdl=pdl.enabled(x.device), out2=also).view(x.shape[:-1])
    out = x.argmax(-1)
    if also is not None:
        also[: out.numel()].copy_(out.reshape(-1))
    return out
