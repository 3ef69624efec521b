"""The overlap schedule's carry, inside a step graph: what step N+1 reads of step N's rows
(core/launches.py says why). Each worker's step graph leaves, per batch row, what the next step
reads (the next token, the new sequence length, the RNG offset) in int64 vectors shared by every
batch size (`to_carry`), and reads a row from there when `src` >= 0, from the host otherwise
(`from_carry`)."""

from __future__ import annotations

import torch

from hotspec.layers import fused
from hotspec.runtime.phase_io import Tensors


def from_carry(x: Tensors, carry: Tensors) -> Tensors:
    """Inside a step graph: each input named in `carry` taken from row `src` of the carry where
    `src` >= 0 (what the host has not read yet), else the host's value. Where fused kernels run,
    the int64 vectors (every carry the engine keeps) are picked in one kernel
    (runtime/carry_kernels.py), anything else in torch."""
    src = x["src"]
    keys = [k for k in carry if k in x]
    fast: list[str] = []
    out = dict(x)
    if fused.enabled(src) and src.dtype == torch.int64 and src.dim() == 1 and src.stride(0) == 1:
        from hotspec.runtime.carry_kernels import MAX_PAIRS, carry_pick, pickable

        fast = [k for k in keys if pickable(x[k], carry[k], src)]
        for i in range(0, len(fast), MAX_PAIRS):
            group = fast[i : i + MAX_PAIRS]
            out.update(zip(group, carry_pick(src, [(x[k], carry[k]) for k in group])))
    rest = [k for k in keys if k not in fast]
    if rest:
        take = src >= 0
        row = src.clamp(min=0)
        out.update({k: torch.where(take, carry[k][row], x[k]) for k in rest})
    return out


def to_carry(carry: Tensors, values: Tensors, plus: Tensors | None = None) -> None:
    """Inside a step graph: what the next step reads of this one's rows, row for row: values[k]
    (+ plus[k] where given) into carry[k]. Where fused kernels run, the int64 vectors (every
    carry the engine keeps) are stored in one kernel (runtime/carry_kernels.py), with their
    additions; anything else in torch."""
    plus = plus or {}
    if set(plus) - set(values):
        raise ValueError(f"to_carry: addends without values: {sorted(set(plus) - set(values))}")
    keys = list(values)
    for k in keys:
        if carry[k].shape[0] < values[k].shape[0]:
            raise ValueError(f"to_carry: carry[{k!r}] holds {carry[k].shape[0]} rows, the values "
                             f"{values[k].shape[0]}; size the carry for the largest batch")
    fast: list[str] = []
    if keys and fused.enabled(values[keys[0]]):
        from hotspec.runtime.carry_kernels import MAX_PAIRS, carry_put, puttable

        shape = values[keys[0]].shape  # one kernel stores vectors of one length
        fast = [k for k in keys if puttable(values[k], carry[k], plus.get(k))
                and values[k].shape == shape]
        for i in range(0, len(fast), MAX_PAIRS):
            carry_put([(values[k], plus.get(k), carry[k]) for k in fast[i : i + MAX_PAIRS]])
    for k in keys:
        if k not in fast:
            v = values[k] + plus[k] if k in plus else values[k]
            carry[k][: v.shape[0]].copy_(v)
