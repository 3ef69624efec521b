"""Typed phase inputs and outputs: dataclasses of batch-leading tensors.

A phase (decode, draft, verify, draft_extend, the fused step) is a function from one `PhaseIO`
to another. Each input class also declares its static shapes (an `example` classmethod that
builds a batch of padding rows), so the graph runner sizes its buffers from the same declaration
the phase reads. A field set to None is absent (an optional input such as the overlap schedule's
`src`); the graph runner sees the present fields as a name -> tensor mapping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from hotspec.layers.sampler import SamplingTensors

if TYPE_CHECKING:
    from hotspec.core.request import Request

Tensors = dict[str, torch.Tensor]
T = TypeVar("T", bound="PhaseIO")


@dataclass(kw_only=True)
class PhaseIO:
    """Named batch-leading tensors (row i belongs to request i)."""

    def tensors(self) -> Tensors:
        """The present fields by name."""
        out: Tensors = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value
        return out

    @classmethod
    def of(cls: type[T], tensors: Mapping[str, torch.Tensor]) -> T:
        """The inverse of `tensors`: an unknown name is a TypeError."""
        return cls(**tensors)


@dataclass(kw_only=True)
class Sampled(PhaseIO):
    """Per-row sampling parameters of a phase that samples (absent: the phase is greedy)."""

    temperature: torch.Tensor | None = None  # [B] float32, 0 for greedy rows
    top_p: torch.Tensor | None = None  # [B] float32
    top_k: torch.Tensor | None = None  # [B] long, -1 for none
    min_p: torch.Tensor | None = None  # [B] float32
    seeds: torch.Tensor | None = None  # [B] long
    offsets: torch.Tensor | None = None  # [B] long: tokens generated so far (the RNG offset)
    # the [full] graphs' logits processing (runtime/logits_state.py): each row's state row,
    # min_tokens, and penalties (padding rows: the identity row, 0, 0, 0, 1)
    slot: torch.Tensor | None = None  # [B] long
    min_tokens: torch.Tensor | None = None  # [B] long
    presence: torch.Tensor | None = None  # [B] float32
    frequency: torch.Tensor | None = None  # [B] float32
    repetition: torch.Tensor | None = None  # [B] float32

    def sampling(self) -> SamplingTensors:
        if self.temperature is None or self.top_p is None or self.top_k is None or \
                self.min_p is None or self.seeds is None or self.offsets is None:
            raise ValueError(f"{type(self).__name__} has no sampling inputs: a greedy phase")
        return SamplingTensors(self.temperature, self.top_p, self.top_k, self.min_p, self.seeds,
                               self.offsets)


def sampling_fields(reqs: Sequence[Request], device: torch.device,
                    ahead: Sequence[int] | None = None, identity: int | None = None) -> dict[str, Any]:
    """The `Sampled` fields for `reqs`; the RNG offset is the request's generated-token count
    (plus `ahead[i]` tokens of launched steps the host has not read yet). With `identity` (the
    logits state's identity row) the processing fields too."""
    counts = [len(r.output_token_ids) + (ahead[i] if ahead else 0) for i, r in enumerate(reqs)]
    st = SamplingTensors.from_params([r.params for r in reqs], [r.seed for r in reqs], counts, device)
    out = {"temperature": st.temperature, "top_p": st.top_p, "top_k": st.top_k,
           "min_p": st.min_p, "seeds": st.seeds, "offsets": st.offsets}
    if identity is not None:
        ps = [r.params for r in reqs]
        f32 = torch.float32
        out |= {"slot": torch.tensor([r.logits_slot if r.logits_slot >= 0 else identity for r in reqs],
                                     dtype=torch.long, device=device),
                "min_tokens": torch.tensor([p.min_tokens for p in ps], dtype=torch.long, device=device),
                "presence": torch.tensor([p.presence_penalty for p in ps], dtype=f32, device=device),
                "frequency": torch.tensor([p.frequency_penalty for p in ps], dtype=f32, device=device),
                "repetition": torch.tensor([p.repetition_penalty for p in ps], dtype=f32, device=device)}
    return out


def example_sampling(bs: int, device: torch.device, identity: int | None = None) -> dict[str, Any]:
    """Static shapes (and padding rows: greedy) of the `Sampled` fields (with `identity`, the
    logits state's identity row: the [full] graphs' processing fields too)."""
    f, i = torch.float32, torch.long
    full = {} if identity is None else {
        "slot": torch.full((bs,), identity, dtype=i, device=device),
        "min_tokens": torch.zeros(bs, dtype=i, device=device),
        "presence": torch.zeros(bs, dtype=f, device=device),
        "frequency": torch.zeros(bs, dtype=f, device=device),
        "repetition": torch.ones(bs, dtype=f, device=device)}
    return full | {"temperature": torch.zeros(bs, dtype=f, device=device),
            "top_p": torch.ones(bs, dtype=f, device=device),
            "top_k": torch.full((bs,), -1, dtype=i, device=device),
            "min_p": torch.zeros(bs, dtype=f, device=device),
            "seeds": torch.zeros(bs, dtype=i, device=device),
            "offsets": torch.zeros(bs, dtype=i, device=device)}
