"""Merging Linear layers that read the same input into one (one GEMM instead of several)."""

from __future__ import annotations

import torch
from torch import nn


def merge_linears(*linears: nn.Linear) -> nn.Linear:
    """One Linear whose output is the concatenation of `linears`' outputs (same input size,
    dtype and device; biases all present or all absent). The parts' weights are copied."""
    first = linears[0]
    if any(lin.in_features != first.in_features for lin in linears):
        raise ValueError("merge_linears: every part must read the same input size")
    has_bias = [lin.bias is not None for lin in linears]
    if any(has_bias) != all(has_bias):
        raise ValueError("merge_linears: biases must be all present or all absent")
    w = first.weight
    out = sum(lin.out_features for lin in linears)
    with torch.device("meta"):
        merged = nn.Linear(first.in_features, out, bias=has_bias[0])
    merged.weight = nn.Parameter(torch.cat([lin.weight.detach() for lin in linears]),
                                 requires_grad=w.requires_grad)
    if has_bias[0]:
        merged.bias = nn.Parameter(torch.cat([lin.bias.detach() for lin in linears]),
                                   requires_grad=w.requires_grad)
    return merged
